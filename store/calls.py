"""Calls between their row in ``calls`` and their one definition, ``core.protocols.records.CallRecord``."""

from __future__ import annotations

from typing import Any

import msgspec

from burnish_server.core.protocols.records import Adjustments, CallRecord
from burnish_server.store.models import Call

# Every column but the key, in the table's order: CallRecord has a field for each.
CALL_COLUMNS = tuple(c.name for c in Call.__table__.columns if c.name != "pk")


def to_row(record: CallRecord) -> dict[str, Any]:
    row = {name: getattr(record, name) for name in CALL_COLUMNS}
    row["adjustments"] = msgspec.to_builtins(record.adjustments) if record.adjustments else None  # a JSON column
    return row


def to_record(row: Any, group_id: str | None = None) -> CallRecord:
    """A ``calls`` row (with every column) as a record; the group is the trajectory's, if known."""
    values = {name: getattr(row, name) for name in CALL_COLUMNS}
    values["adjustments"] = msgspec.convert(values["adjustments"], Adjustments) if values["adjustments"] else None
    return CallRecord(group_id=group_id, group_size=None, **values)
