"""Lone attempts in the store (core/learning/lone.py): made into a group of their own when something happens to them.

A policy's call that names no group is recorded as it always was: a trajectory in no group,
now with its policy (``trajectories.policy``), so the proxy path writes nothing more. While it
waits for its reward it is an entry of ``ix_trajectories_lone``. Its group is made only when
it is needed, named after the trajectory, of size 1 (``make_group``):

    its reward comes in time          -> the group, closed "complete" by the reward: ready
    its reward comes too late          -> the group, closed "expired": the reward kept, never trained
    a follow-up to its answer (a judge or a teacher with hindsight claims it) -> the group, open

An attempt whose reward never comes never gets one: nothing of it waits in a queue. Those are
counted as they pass their policy's ``group_idle_close_s`` (``sweep``), one slice of time after
another, so that a count costs the traffic of the slice, never the history.

Sync functions of a ``Connection``, run in the writer's transactions (``store/writes.py``) or
by the gateway's loops.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import NamedTuple

import msgspec
from sqlalchemy import ColumnElement, and_, false, func, insert, or_, select, update
from sqlalchemy.engine import Connection

from burnish_server.core.learning.groups import FOLLOWED, Lack
from burnish_server.core.learning.policies import TrainSettings
from burnish_server.core.platform.access import project_of
from burnish_server.store.groups import is_closed
from burnish_server.store.models import Group, PolicyRow, Trajectory
from burnish_server.store.training import lone_group


def waiting_terms() -> tuple[ColumnElement[bool], ...]:
    """The terms of ``ix_trajectories_lone``, as its queries must name them."""
    return (Trajectory.policy.is_not(None), Trajectory.group_id.is_(None), Trajectory.reward.is_(None), Trajectory.eval == false())


class Lone(NamedTuple):
    """A trajectory that is a lone attempt of a policy that trains them, as a reward finds it."""

    policy: str
    wait_s: float | None  # the policy's group_idle_close_s: how long its reward may take
    updated_at: datetime
    swept_until: datetime | None  # how far the policy's expired attempts were counted

    def expired(self, now: datetime) -> bool:
        last = self.updated_at if self.updated_at.tzinfo else self.updated_at.replace(tzinfo=now.tzinfo)
        return self.wait_s is not None and last < now - timedelta(seconds=self.wait_s)

    def counted(self) -> bool:
        """Already counted as expired by the sweep (its last call is inside a swept slice)."""
        if self.swept_until is None:
            return False
        swept = self.swept_until if self.swept_until.tzinfo else self.swept_until.replace(tzinfo=self.updated_at.tzinfo)
        return self.updated_at <= swept


def lone_of(conn: Connection, trajectory_id: str) -> Lone | None:
    """The trajectory as a lone attempt: in no group, not held out, with a policy whose
    ``train.lone_baseline`` is set; None otherwise (it is rewarded as before, in no group)."""
    row = conn.execute(
        select(Trajectory.policy, Trajectory.updated_at, PolicyRow.train, PolicyRow.lone_swept_until)
        .join(PolicyRow, PolicyRow.name == Trajectory.policy)
        .where(Trajectory.id == trajectory_id, Trajectory.group_id.is_(None), Trajectory.eval == false())
    ).first()
    if row is None:
        return None
    train = msgspec.convert(row.train or {}, TrainSettings)
    if train.lone_baseline is None:
        return None
    return Lone(row.policy, train.group_idle_close_s, row.updated_at, row.lone_swept_until)


def make_group(conn: Connection, trajectory_id: str, policy: str, now: datetime, *, close_reason: str | None = None, claimed: bool = False) -> bool:
    """The lone attempt's group, named after it, of size 1, with the trajectory in it: open, or
    closed for ``close_reason``; ``claimed``: stamped for the next-message judge (``ruler_at``).
    False where a group of that name exists already (another's, or made meanwhile)."""
    if conn.execute(select(Group.pk).where(Group.id == trajectory_id)).first() is not None:
        return False
    created = conn.execute(select(Trajectory.created_at).where(Trajectory.id == trajectory_id)).scalar_one()
    conn.execute(
        insert(Group).values(
            id=trajectory_id,
            project=project_of(trajectory_id),
            expected_size=1,
            policy=policy,
            eval=False,
            created_at=created,
            closed_at=now if close_reason is not None else None,
            close_reason=close_reason,
            ruler_at=now if claimed else None,
        )
    )
    conn.execute(update(Trajectory).where(Trajectory.id == trajectory_id).values(group_id=trajectory_id))
    return True


def expired_late(conn: Connection, lone: Lone) -> None:
    """A lone attempt whose reward came after it expired: counted, unless the sweep counted it."""
    if not lone.counted():
        conn.execute(update(PolicyRow).where(PolicyRow.name == lone.policy).values(lone_expired=PolicyRow.lone_expired + 1))


def count_waiting(conn: Connection, policy: str, wait_s: float | None, now: datetime) -> int:
    """The policy's lone attempts still waiting for their reward (not yet expired)."""
    terms = [*waiting_terms(), Trajectory.policy == policy]
    if wait_s is not None:
        terms.append(Trajectory.updated_at > now - timedelta(seconds=wait_s))
    return conn.execute(select(func.count()).select_from(Trajectory).where(*terms)).scalar_one()


class LoneCounts(NamedTuple):
    waiting: int  # no reward yet, and not expired
    ready: int  # rewarded, waiting for a step


def lone_counts(conn: Connection, policy: str, wait_s: float | None, now: datetime) -> LoneCounts:
    """The waiting ones from ``ix_trajectories_lone``; the ready ones from ``ix_groups_waiting``:
    rewarded (their lack, ``PEERS``, says they are lone and rewarded) or completed by their
    follow-up, for a teacher with hindsight."""
    taught = or_(Group.lacks == int(Lack.PEERS), and_(Group.close_reason == FOLLOWED, lone_group()))
    ready = conn.execute(
        select(func.count()).where(Group.policy == policy, Group.closed_at.is_not(None), Group.trained_at.is_(None), taught, is_closed())
    ).scalar_one()
    return LoneCounts(count_waiting(conn, policy, wait_s, now), ready)


def sweep(conn: Connection, waits: Mapping[str, float], now: datetime) -> dict[str, int]:
    """Count each policy's lone attempts that expired since its last sweep (their last call
    between ``lone_swept_until`` and ``now - wait``; the first sweep counts from the start, which
    is when the store learnt trajectories' policies, migration 0023) into ``lone_expired``.
    Several gateways may sweep: the update that moves a policy's mark from where it read it
    wins, the others count nothing."""
    counted: dict[str, int] = {}
    for policy, wait_s in sorted(waits.items()):
        swept = conn.execute(select(PolicyRow.lone_swept_until).where(PolicyRow.name == policy)).first()
        if swept is None:
            continue
        until = now - timedelta(seconds=wait_s)
        since = swept.lone_swept_until
        if since is not None and until <= (since if since.tzinfo else since.replace(tzinfo=until.tzinfo)):
            continue
        after = [] if since is None else [Trajectory.updated_at > since]
        n = conn.execute(
            select(func.count()).select_from(Trajectory).where(*waiting_terms(), Trajectory.policy == policy, *after, Trajectory.updated_at <= until)
        ).scalar_one()
        moved = conn.execute(
            update(PolicyRow)
            .where(PolicyRow.name == policy, PolicyRow.lone_swept_until.is_(None) if since is None else PolicyRow.lone_swept_until == since)
            .values(lone_swept_until=until, lone_expired=PolicyRow.lone_expired + n)
        )
        if moved.rowcount and n:
            counted[policy] = n
    return counted
