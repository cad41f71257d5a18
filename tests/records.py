"""Recorded calls made by hand, for tests of what reads them (RULER, the trainer, Langfuse)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from burnish_server.core.protocols.records import CallRecord


def call(endpoint: str, request: dict[str, Any], response: dict[str, Any] | None, **fields: Any) -> CallRecord:
    now = datetime.now(UTC)
    base: dict[str, Any] = {
        "trajectory_id": "t-1",
        "group_id": None,
        "group_size": None,
        "model": request.get("model"),
        "stream": False,
        "status": "ok",
        "http_status": 200,
        "started_at": now,
        "finished_at": now,
    }
    body = msgspec.json.encode(response) if response is not None else None
    return CallRecord(endpoint=endpoint, request=msgspec.json.encode(request), response=body, **(base | fields))


def chat_call(request: dict[str, Any], response: dict[str, Any] | None, **fields: Any) -> CallRecord:
    return call("chat.completions", request, response, **fields)
