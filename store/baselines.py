"""Lone attempts' baselines, per policy and kind of request (core/learning/lone.py: Baseline).

The trainer reads a policy's before a step and writes the moved ones in the step's own
transaction (``store/versions.py: record_step``): a step that fails moves nothing, and a
restarted trainer, or another, reads what the last recorded step left.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from burnish_server.core.learning.lone import Baseline
from burnish_server.core.platform.clock import utcnow
from burnish_server.store.models import LoneBaseline


def read_baselines(conn: Connection, policy: str) -> dict[str, Baseline]:
    """The policy's baselines by kind (a policy's agents have few kinds: one per system prompt and tool set)."""
    rows = conn.execute(select(LoneBaseline.kind, LoneBaseline.count, LoneBaseline.mean, LoneBaseline.variance).where(LoneBaseline.policy == policy))
    return {kind: Baseline(count=count, mean=mean, variance=variance) for kind, count, mean, variance in rows}


def keep_baselines(conn: Connection, policy: str, baselines: Mapping[str, Baseline]) -> None:
    """Write the moved baselines (an upsert per kind, in the kinds' order)."""
    if not baselines:
        return
    upsert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    now = utcnow()
    rows = [
        {"policy": policy, "kind": kind, "count": b.count, "mean": b.mean, "variance": b.variance, "updated_at": now} for kind, b in sorted(baselines.items())
    ]
    stmt = upsert(LoneBaseline)
    stmt = stmt.on_conflict_do_update(
        index_elements=["policy", "kind"],
        set_={"count": stmt.excluded.count, "mean": stmt.excluded.mean, "variance": stmt.excluded.variance, "updated_at": stmt.excluded.updated_at},
    )
    conn.execute(stmt, rows)
