"""The HTTP edge: the gateway's entry point (``entry.py``), request ids, errors in each surface's
format, the OpenAPI schema and strict bodies, ``/metrics``, and a list's query string parsed once
for the API and the dashboard (``listing.py``)."""
