"""The wire protocols the gateway serves, records and reads, registered once.

Each protocol is one module here, ending in its ``Surface`` (``base.py``): its name as
recorded, its path, its request and answer structs, its reader into chat form, its stream's
assembler and terminal event, its error format, and how a policy's call on it is served
(as it is, or translated through chat completions). Adding a protocol is one module and one
line in ``SURFACES``; every route, capture, error, reader and schema entry follows from it.
"""

from __future__ import annotations

from burnish_server.core.protocols.surfaces.base import Surface
from burnish_server.core.protocols.surfaces.chat import CHAT
from burnish_server.core.protocols.surfaces.completions import COMPLETIONS
from burnish_server.core.protocols.surfaces.messages import MESSAGES
from burnish_server.core.protocols.surfaces.responses import RESPONSES

SURFACES: tuple[Surface, ...] = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)
BY_NAME = {p.name: p for p in SURFACES}
BY_PATH = {p.path: p for p in SURFACES}

__all__ = ["BY_NAME", "BY_PATH", "CHAT", "COMPLETIONS", "MESSAGES", "SURFACES", "RESPONSES", "Surface"]
