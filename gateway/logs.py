"""Logging: a request id on every request (and its log lines), text or JSON output.

Each request gets an id: the client's ``X-Request-Id`` if it is a sane one, else a new
one; it goes back in the response's ``X-Request-Id`` and into every log line written while
the request is handled. Prompts, completions, keys and tokens are never logged, except by
``BURNISH_LOG_BODIES=true`` (bodies at DEBUG level, for debugging only).
"""

from __future__ import annotations

import json
import logging
import os
import re
from contextvars import ContextVar
from datetime import UTC, datetime

from litestar.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
_VALID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
request_id: ContextVar[str | None] = ContextVar("burnish_request_id", default=None)


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Raw ASGI (a Litestar middleware factory): one header read, one header added."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == HEADER), None)
        rid = given if given is not None and _VALID.fullmatch(given) else b"req-" + os.urandom(10).hex().encode()
        token = request_id.set(rid.decode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (HEADER, rid)]
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)

    return middleware


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """Root logging for a burnish process: ``fmt`` is "text" or "json"."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # httpx logs a line per upstream request at INFO: measured at ~0.1 ms a call, and noise.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
