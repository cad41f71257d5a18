"""The time every record is stamped with: aware, in UTC (the store writes it; the gateway and
the trainer compare with it)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
