"""The upstream: the replicas and the retry rule (``client.py``), their health and models
(``replicas.py``), and the two connection pools side by side (``connections/``)."""
