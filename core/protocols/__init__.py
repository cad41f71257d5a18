"""The wire protocols burnish serves and records: their typed requests and answers as recorded
(``wire.py``) and as read while served (``answers.py``), the four surfaces (``surfaces/``), the
Responses API and Messages served through chat completions (``translate/``), a conversation in
chat form (``conversation.py``, ``transcript.py``), the recorded call (``records.py``) and its token ids packed (``packed.py``), structured
output (``grammar.py``) and the served window's refusals (``window.py``). One ``ToolCall``
(``wire.py``) for all of them. Above ``platform/``; below ``learning/``."""
