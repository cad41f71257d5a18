"""The prompts a policy was asked recently, for a teacher to answer (gateway/routes/demonstrations.py)."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.engine import Connection

from burnish_server.core.protocols.records import OK, CallRecord
from burnish_server.store.calls import to_record
from burnish_server.store.models import Call, Group, Trajectory

# Rows read per prompt asked for: repeats (a group's members share their prompt) are skipped.
READ_AHEAD = 8


def recent_prompts(conn: Connection, policy: str, limit: int) -> list[CallRecord]:
    """The policy's newest chat calls with distinct requests, at most ``limit``; held-out
    trajectories never (a teacher's answer to a held-out task would leak it into training)."""
    rows = conn.execute(
        select(Call)
        .join(Trajectory, Trajectory.id == Call.trajectory_id)
        .outerjoin(Group, Group.id == Trajectory.group_id)
        .where(
            Call.policy == policy,
            Call.status == OK,
            Call.endpoint == "chat.completions",
            Trajectory.eval.is_(False),
            or_(Group.eval.is_(None), Group.eval.is_(False)),
        )
        .order_by(Call.pk.desc())
        .limit(limit * READ_AHEAD)
    )
    out: list[CallRecord] = []
    seen: set[bytes] = set()
    for row in rows:
        record = to_record(row)
        if record.request in seen:
            continue
        seen.add(record.request)
        out.append(record)
        if len(out) == limit:
            break
    return out
