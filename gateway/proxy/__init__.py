"""One proxied call, agent to vLLM and back: its paths (``paths.py``), where it is filed
(``filing.py``), the pipeline (``forward.py``), the call in flight and its record (``call.py``),
token ids asked for and taken out (``capture.py``), an answer as it came or through chat
completions (``translation.py``), a stream relayed (``streaming.py``), a call fitted to the served
window (``window.py``), and ``GET /v1/models`` (``models.py``)."""
