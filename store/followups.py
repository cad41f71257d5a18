"""What the next-message judge reads and claims (gateway/groups/followups.py; core/learning/followups.py).

Sync functions of a ``Connection``. The judge reads the calls recorded since its last look, in
the order they were recorded (by key: ``calls.pk``), for the policies that learn from what followed
their answers, and claims an answer before judging it by making its lone attempt's group
(store/lone.py), so that of several gateways one judges it. A gateway that dies while judging
leaves the group open: it closes as expired after the policy's group_idle_close_s.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import and_, false, func, or_, select, update
from sqlalchemy.engine import Connection

from burnish_server.core.learning.groups import FOLLOWED
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.protocols.records import OK, CallRecord
from burnish_server.store.calls import to_record
from burnish_server.store.lone import make_group, waiting_terms
from burnish_server.store.models import Call, Group, PolicyRow, Trajectory
from burnish_server.store.training import settle


class Recorded(NamedTuple):
    pk: int
    call: CallRecord
    lone: bool  # its trajectory is a lone attempt (store/lone.py): waiting for its reward, or in its own group


def last_call(conn: Connection) -> int:
    """The newest call's key: where a judge that starts looks from (less its look-back)."""
    return conn.execute(select(func.max(Call.pk))).scalar() or 0


def recorded_since(conn: Connection, after: int, policies: list[str], limit: int = 500) -> list[Recorded]:
    """The ok calls to ``policies`` recorded after key ``after``, oldest first."""
    # A lone attempt: waiting (no group yet), or in the group of its own that a reward made.
    alone = or_(Trajectory.group_id.is_(None), Trajectory.group_id == Trajectory.id)
    waiting = and_(Trajectory.policy.is_not(None), Trajectory.eval == false(), alone).label("waiting")
    rows = conn.execute(
        select(Call, waiting)
        .join(Trajectory, Trajectory.id == Call.trajectory_id)
        .where(Call.pk > after, Call.policy.in_(policies), Call.status == OK)
        .order_by(Call.pk)
        .limit(limit)
    )
    return [Recorded(row.pk, to_record(row), bool(row.waiting)) for row in rows]


def claim_answer(conn: Connection, trajectory_id: str, policy: str) -> bool:
    """Claim a lone attempt still waiting for its reward, by making its group (open, stamped):
    False where it has one already (a reward came first, or another gateway claimed it)."""
    if conn.execute(select(Trajectory.pk).where(Trajectory.id == trajectory_id, *waiting_terms()).with_for_update()).first() is None:
        return False
    return make_group(conn, trajectory_id, policy, utcnow(), claimed=True)


def keep_followed(conn: Connection, trajectory_id: str, followed: list[dict[str, Any]]) -> None:
    """What followed a lone attempt's answer, for a teacher with hindsight (``TrainingCall.followed``)."""
    conn.execute(update(Trajectory).where(Trajectory.id == trajectory_id).values(followed=followed))


def keep_followed_rewarded(conn: Connection, trajectory_id: str, policy: str, followed: list[dict[str, Any]]) -> bool:
    """What followed a lone attempt whose reward came first, while no trainer has taken it: it
    trains on both, and the step sees whether the teacher agrees with the reward. False where
    it is not the policy's lone attempt, or a trainer took it."""
    untaken = select(Group.id).where(Group.id == trajectory_id, Group.policy == policy, Group.expected_size == 1, Group.claimed_by.is_(None))
    kept = conn.execute(update(Trajectory).where(Trajectory.id == trajectory_id, Trajectory.group_id.in_(untaken)).values(followed=followed))
    return bool(kept.rowcount)


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
