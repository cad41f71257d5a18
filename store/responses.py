"""Responses API answers the gateway served, found by id to continue them (``previous_response_id``)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Connection

from burnish_server.core.protocols.records import CallRecord
from burnish_server.store.calls import CALL_COLUMNS, to_record
from burnish_server.store.models import Call


def stored_response(conn: Connection, response_id: str) -> CallRecord | None:
    """The call that answered with ``response_id`` (the newest, should an id ever repeat)."""
    columns = [getattr(Call, name) for name in CALL_COLUMNS]
    row = conn.execute(select(*columns).where(Call.response_id == response_id).order_by(Call.pk.desc()).limit(1)).first()
    return to_record(row) if row is not None else None
