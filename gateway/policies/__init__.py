"""Policy control: which version a model name routes to (``routing.py``), what an admin does to a
policy (``actions.py``), a PATCH merged and conflicting settings refused (``changes.py``), a
teacher's answers recorded as demonstrations (``demonstrations.py``), a version's adapter as a
download (``downloads.py``), and a served teacher's tokenizer checked (``teachers.py``)."""
