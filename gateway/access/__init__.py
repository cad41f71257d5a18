"""Who may call what: API keys, scopes and per-key limits checked on every request
(``admission.py``), and the dashboard's sign-in sessions and their cookie (``sessions.py``)."""
