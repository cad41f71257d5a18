"""Logging for every burnish process: text or JSON lines, each with the request id.

The gateway sets ``request_id`` for each request (``gateway/edge/request_ids.py``); every log
line written while the request is handled carries it ("-" elsewhere, as in the trainer).
Prompts, completions, keys and tokens are never logged, except by
``BURNISH_LOG_BODIES=true`` (bodies at DEBUG level, for debugging only).
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime

request_id: ContextVar[str | None] = ContextVar("burnish_request_id", default=None)


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
