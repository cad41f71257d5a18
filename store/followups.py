"""What the next-message judge reads and claims (gateway/groups/followups.py; core/learning/followups.py).

Sync functions of a ``Connection``. The judge reads the calls recorded since its last look, in
the order they were recorded (by key: ``calls.pk``), for the policies that judge what followed
their answers, and claims an answer before judging it, so that of several gateways one judges
it (the group's ``ruler_at``, as automatic RULER claims a group; a claim older than the lease
is taken again).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

from sqlalchemy import func, or_, select, update
from sqlalchemy.engine import Connection

from burnish_server.core.learning.groups import FOLLOWED
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.protocols.records import OK, CallRecord
from burnish_server.store.calls import to_record
from burnish_server.store.models import Call, Group, PolicyRow, Trajectory
from burnish_server.store.training import settle

# A gateway that died while judging: another takes the answer again after this long.
CLAIM_LEASE_S = 120.0


class Recorded(NamedTuple):
    pk: int
    call: CallRecord
    lone: bool  # its trajectory is a lone attempt (a group of its own, of size 1) that is still open


def last_call(conn: Connection) -> int:
    """The newest call's key: where a judge that starts looks from (less its look-back)."""
    return conn.execute(select(func.max(Call.pk))).scalar() or 0


def recorded_since(conn: Connection, after: int, policies: list[str], limit: int = 500) -> list[Recorded]:
    """The ok calls to ``policies`` recorded after key ``after``, oldest first."""
    rows = conn.execute(
        select(Call, Group.expected_size.label("expected_size"), Group.closed_at.label("closed_at"))
        .join(Trajectory, Trajectory.id == Call.trajectory_id)
        .outerjoin(Group, Group.id == Trajectory.group_id)
        .where(Call.pk > after, Call.policy.in_(policies), Call.status == OK)
        .order_by(Call.pk)
        .limit(limit)
    )
    return [Recorded(row.pk, to_record(row), row.expected_size == 1 and row.closed_at is None) for row in rows]


def claim_answer(conn: Connection, group_id: str) -> bool:
    """Claim a lone attempt's open group for the judge; False where another has it or it closed."""
    now = utcnow()
    claimed = conn.execute(
        update(Group)
        .where(Group.id == group_id, Group.closed_at.is_(None), or_(Group.ruler_at.is_(None), Group.ruler_at < now - timedelta(seconds=CLAIM_LEASE_S)))
        .values(ruler_at=now)
    )
    return claimed.rowcount == 1


def keep_followed(conn: Connection, trajectory_id: str, followed: list[dict[str, Any]]) -> None:
    """What followed a lone attempt's answer, for a teacher with hindsight (``TrainingCall.followed``)."""
    conn.execute(update(Trajectory).where(Trajectory.id == trajectory_id).values(followed=followed))


def close_followed(conn: Connection, group_id: str) -> bool:
    """Close a lone attempt's group that its follow-up completes (close_reason "followed"): with no
    reward it distills, and a reward posted after is kept, never trained on. False where it closed already."""
    closed = conn.execute(update(Group).where(Group.id == group_id, Group.closed_at.is_(None)).values(closed_at=utcnow(), close_reason=FOLLOWED))
    if closed.rowcount:
        settle(conn, [group_id])
    return bool(closed.rowcount)


def judged(conn: Connection, policy: str) -> None:
    """One more answer scored by the judge, in the policy's status."""
    conn.execute(update(PolicyRow).where(PolicyRow.name == policy).values(next_judged=PolicyRow.next_judged + 1))


def judge_failed(conn: Connection, policy: str, group_id: str, message: str) -> None:
    """Why the judge gave no score for a lone attempt: shown on its group, counted in the policy's status."""
    conn.execute(update(Group).where(Group.id == group_id).values(ruler_error=message[:2000]))
    conn.execute(update(PolicyRow).where(PolicyRow.name == policy).values(next_unreadable=PolicyRow.next_unreadable + 1))
