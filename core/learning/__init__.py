"""What learning is made of: policies and their settings (``policies.py``, ``defaults.py``), a
version's life and its promotion (``promotion.py``), groups (``groups.py``), how rewards become
advantages (``credit.py``), how calls merge (``continuity.py``, ``drift.py``), a
step's figures and a run's health (``steps.py``, ``health.py``), demonstrations and the chat
messages a user posts (``demonstrations.py``, ``messages.py``), RULER's verdicts,
a checkpoint's probe (``fidelity.py``) and an adapter as it leaves (``adapters.py``). Above ``protocols/`` and ``platform/``."""
