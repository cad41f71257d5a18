"""vLLM, owned in one place: starting it as a child process (``process.py``) and its adapter
API (``adapters.py``: load, check, unload, list). Used by the trainer and by ``burnish up``.
Imports httpx and the domain only: never vLLM itself, nor torch."""
