"""Everything that changes the store, as statements run by the writer in its transactions.

These are plain functions of a sync ``Connection`` (see ``Database.transaction``).

Calls are written in bulk: one upsert of their groups, one of their trajectories,
one insert of the calls, for a whole commit batch. Rewards and closes are small
operations that check before they change anything; a check that fails raises a domain
error (``core/platform/errors.py``), which the writer hands to that operation's caller alone.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, case, exists, false, func, insert, null, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from burnish_server.core.learning.groups import EXPIRED, UNREWARDED, Lack
from burnish_server.core.platform.access import local, project_of
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import Conflict, NotFound
from burnish_server.core.protocols.records import DEMONSTRATION, CallRecord
from burnish_server.store import evals, lone
from burnish_server.store.calls import CALL_COLUMNS, to_row
from burnish_server.store.models import Call, Group, PolicyRow, Reward, Trajectory
from burnish_server.store.training import settle


@functools.cache
def _upserts(dialect: str) -> tuple[Any, Any]:
    """The group and trajectory upserts, built once per dialect (building one costs ~0.2 ms)."""
    upsert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    groups = upsert(Group)
    groups = groups.on_conflict_do_update(
        index_elements=["id"],
        # The first size (and policy) given wins; a later call may fill it in if none was given.
        # A call marked for evaluation makes the group held out, and nothing makes it trainable again.
        # A call after the group closed may bring a member with no reward, or a mark: what the
        # group lacks is settled again (store/training.py: settle), never read stale.
        set_={
            "expected_size": func.coalesce(Group.expected_size, groups.excluded.expected_size),
            "policy": func.coalesce(Group.policy, groups.excluded.policy),
            "eval": or_(Group.eval, groups.excluded.eval),
            "lacks": null(),
        },
    )
    trajectories = upsert(Trajectory)
    trajectories = trajectories.on_conflict_do_update(
        index_elements=["id"],
        # A trajectory joins a group once; the first group it was seen with stays. Held out once, always.
        # A call may change a held-out trajectory's versions: settled again (store/evals.py: settle).
        set_={
            "group_id": func.coalesce(Trajectory.group_id, trajectories.excluded.group_id),
            "policy": func.coalesce(Trajectory.policy, trajectories.excluded.policy),
            "updated_at": trajectories.excluded.updated_at,
            "eval": or_(Trajectory.eval, trajectories.excluded.eval),
            "scored": false(),
        },
    )
    return groups, trajectories


_INSERT_CALLS = insert(Call)
# A held-out trajectory's group, marked on its row as never to train (see _held_out).
_HOLD_OUT = (
    update(Group)
    .where(Group.id == select(Trajectory.group_id).where(Trajectory.id == bindparam("trajectory_id")).scalar_subquery())
    .values(lacks=bindparam("lacks"))
)


class _Prepared:
    """A statement compiled once, run straight on the DBAPI cursor.

    For SQLite only: there SQLAlchemy's execution machinery cost more than the
    statements themselves (0.18 ms against 0.07 ms per commit, the latency a lone
    call waits for). SQL text and value conversions still come from SQLAlchemy:
    the compiled statement and each column type's ``bind_processor``.
    """

    def __init__(self, stmt: Any, dialect: Any, keys: tuple[str, ...]) -> None:
        compiled = stmt.compile(dialect=dialect, column_keys=list(keys))
        self.sql = compiled.string
        order = compiled.positiontup or ()
        # A row's values in the statement's order (itemgetter gives a tuple for two keys or more).
        self.values = operator.itemgetter(*order) if len(order) > 1 else lambda row: tuple(row[k] for k in order)
        processors = [compiled.binds[name].type.bind_processor(dialect) for name in order]
        # Only the few columns whose type converts its values (datetimes, JSON) are visited.
        self.conversions = [(i, p) for i, p in enumerate(processors) if p is not None]

    def _params(self, row: dict[str, Any]) -> list[Any]:
        values = list(self.values(row))
        for i, convert in self.conversions:
            values[i] = convert(values[i])
        return values

    def executemany(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        params = [self._params(row) for row in rows]
        driver = conn.connection.driver_connection
        assert driver is not None, "the writer's connection is open"
        driver.cursor().executemany(self.sql, params)


@functools.cache
def _prepared_sqlite(dialect: Any) -> tuple[_Prepared, _Prepared, _Prepared, _Prepared]:
    groups, trajectories = _upserts("sqlite")
    return (
        _Prepared(groups, dialect, ("id", "project", "expected_size", "policy", "eval", "created_at")),
        _Prepared(trajectories, dialect, ("id", "project", "group_id", "policy", "eval", "created_at", "updated_at")),
        _Prepared(_INSERT_CALLS, dialect, CALL_COLUMNS),
        _Prepared(_HOLD_OUT, dialect, ("trajectory_id", "lacks")),
    )


def insert_calls(conn: Connection, records: list[CallRecord]) -> None:
    groups: dict[str, dict[str, Any]] = {}
    trajectories: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.group_id is not None:
            group = groups.setdefault(
                rec.group_id, {"id": rec.group_id, "project": project_of(rec.group_id), "expected_size": None, "policy": None, "eval": False}
            )
            group["expected_size"] = group["expected_size"] or rec.group_size
            group["policy"] = group["policy"] or rec.policy
            group["eval"] = group["eval"] or rec.eval
        row = trajectories.get(rec.trajectory_id)
        if row is None:
            trajectories[rec.trajectory_id] = {
                "id": rec.trajectory_id,
                "project": project_of(rec.trajectory_id),
                "group_id": rec.group_id,
                "policy": rec.policy,
                "eval": rec.eval,
                "created_at": rec.started_at,
                "updated_at": rec.finished_at,
            }
        else:
            row["group_id"] = row["group_id"] or rec.group_id
            row["policy"] = row["policy"] or rec.policy
            row["eval"] = row["eval"] or rec.eval
            row["created_at"] = min(row["created_at"], rec.started_at)
            row["updated_at"] = max(row["updated_at"], rec.finished_at)

    # Sorted keys: concurrent writers (several gateways on PostgreSQL) lock rows in one order.
    now = utcnow()
    group_rows = [{**groups[g], "created_at": now} for g in sorted(groups)]
    trajectory_rows = [trajectories[t] for t in sorted(trajectories)]
    call_rows = [to_row(rec) for rec in records]
    if conn.dialect.name == "sqlite":
        upsert_groups, upsert_trajectories, insert_rows, hold_out = _prepared_sqlite(conn.dialect)
        if group_rows:
            upsert_groups.executemany(conn, group_rows)
        upsert_trajectories.executemany(conn, trajectory_rows)
        insert_rows.executemany(conn, call_rows)
        if held_out := _held_out(records):
            hold_out.executemany(conn, held_out)
        return
    upsert_groups, upsert_trajectories = _upserts(conn.dialect.name)
    if group_rows:
        conn.execute(upsert_groups, group_rows)
    conn.execute(upsert_trajectories, trajectory_rows)
    conn.execute(_INSERT_CALLS, call_rows)
    if held_out := _held_out(records):
        conn.execute(_HOLD_OUT, held_out)


def _held_out(records: list[CallRecord]) -> list[dict[str, Any]]:
    """A call marked for evaluation without its group's key (``X-Trajectory-Id`` alone) still
    holds its trajectory's group out: ``_HOLD_OUT``'s rows, which say so on the group's row
    (core/learning/groups.py: Lack.HELD_OUT)."""
    marked = sorted({rec.trajectory_id for rec in records if rec.eval and rec.group_id is None})
    return [{"trajectory_id": t, "lacks": int(Lack.HELD_OUT)} for t in marked]


def _rewarded(conn: Connection, trajectory_id: str) -> tuple[str | None, Any]:
    """The trajectory a reward is for, held until the reward commits: its group id, and its
    group's row (None outside a group) locked FOR UPDATE; then the trajectory's row FOR SHARE
    (in the order the writer's upserts and ``burnish db prune`` take them: group, then
    trajectory). On PostgreSQL a prune that deleted either meanwhile leaves no row here, and the
    reward is a 404, never a foreign key's failure (a 500); on SQLite the locks are no-ops, the
    writer being alone."""
    found = conn.execute(select(Trajectory.group_id).where(Trajectory.id == trajectory_id)).first()
    group = None
    if found is not None and found.group_id is not None:
        group = conn.execute(
            select(Group.id, Group.expected_size, Group.closed_at, Group.close_reason, Group.claimed_by, Group.trained_at)
            .where(Group.id == found.group_id)
            .with_for_update()
        ).first()
        if group is None:  # pruned with its group meanwhile
            found = None
    if found is not None and conn.execute(select(Trajectory.pk).where(Trajectory.id == trajectory_id).with_for_update(read=True)).first() is None:
        found = None  # pruned meanwhile
    if found is None:
        raise NotFound(f"no trajectory {local(trajectory_id)!r}", "trajectory_not_found", "trajectory_id")
    return found.group_id, group


@dataclass(slots=True)
class PostReward:
    trajectory_id: str
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    source: str = "user"  # or "next_message": the judge read what followed the answer (gateway/groups/followups.py)
    explanation: str | None = None

    def apply(self, conn: Connection) -> dict[str, Any]:
        # The group's row locked: concurrent rewards of one group take turns, so the last of
        # them sees all the others and closes the group.
        group_id, group = _rewarded(conn, self.trajectory_id)
        now = utcnow()
        if group is None and (attempt := lone.lone_of(conn, self.trajectory_id)) is not None:
            # A lone attempt: its group of one is made now, closed "expired" where the reward came
            # after the policy's group_idle_close_s (store/lone.py).
            late = attempt.expired(now)
            if lone.make_group(conn, self.trajectory_id, attempt.policy, now, close_reason=EXPIRED if late else None):
                if late:
                    lone.expired_late(conn, attempt)
                group_id, group = _rewarded(conn, self.trajectory_id)
        # A lone attempt whose reward came too late: kept, as every reward is, never trained on.
        expired = group is not None and group.close_reason in UNREWARDED
        # A lone attempt's reward may be put right (a user's verdict after the judge's) until a trainer takes it.
        amend = (
            self.source == "user"
            and group is not None
            and group.expected_size == 1
            and group.close_reason == "complete"
            and group.claimed_by is None
            and group.trained_at is None
        )
        if group is not None and not expired and not amend and group.closed_at is not None:
            raise Conflict(
                f"group {local(group.id)!r} is closed{_why_closed(group.close_reason)}; its rewards can no longer change", "group_closed", "trajectory_id"
            )
        stored = conn.execute(
            update(Trajectory)
            .where(Trajectory.id == self.trajectory_id)
            .values(reward=self.reward, reward_components=self.components, rewarded_at=now)
            .returning(Trajectory.pk, Trajectory.eval)
        ).one()
        if stored.eval:  # its held-out scores' rows, with this reward
            evals.settle(conn, [stored.pk])
        conn.execute(
            insert(Reward).values(
                trajectory_id=self.trajectory_id,
                reward=self.reward,
                components=self.components,
                source=self.source,
                explanation=self.explanation,
                created_at=now,
            )
        )
        closed = False
        if amend or expired:
            settle(conn, [group.id])  # amend and expired say there is a group
        elif group is not None and group.expected_size is not None:
            rewarded = conn.execute(
                select(func.count()).select_from(Trajectory).where(Trajectory.group_id == group_id, Trajectory.reward.is_not(None))
            ).scalar_one()
            if rewarded >= group.expected_size:
                conn.execute(update(Group).where(Group.id == group_id).values(closed_at=now, close_reason="complete"))
                settle(conn, [group.id])
                closed = True
        return {"group_id": group_id, "group_closed": closed, "expired": expired}


@dataclass(slots=True)
class PostCallReward:
    """A reward for one call of a trajectory: the ``index``-th in the trajectory's order (as
    ``GET /v1/trajectories/{id}`` lists them; -1 is the last). Kept beside the trajectory's
    rewards; the newest for a call is its reward. It neither sets the trajectory's reward
    nor closes its group, and a closed group's calls take no more rewards."""

    trajectory_id: str
    index: int
    reward: float
    components: dict[str, float] = field(default_factory=dict)

    def apply(self, conn: Connection) -> dict[str, Any]:
        # Locked as PostReward locks them: a call's reward cannot slip in after the group closed.
        group_id, group = _rewarded(conn, self.trajectory_id)
        if group is not None and group.closed_at is not None:
            raise Conflict(f"group {local(group.id)!r} is closed; its rewards can no longer change", "group_closed", "trajectory_id")
        calls = list(conn.execute(select(Call.pk).where(Call.trajectory_id == self.trajectory_id).order_by(Call.started_at, Call.pk)).scalars())
        if not -len(calls) <= self.index < len(calls):
            raise NotFound(f"trajectory {local(self.trajectory_id)!r} has {len(calls)} calls; no call {self.index}", "call_not_found", "index")
        call_pk = calls[self.index]
        conn.execute(
            insert(Reward).values(
                trajectory_id=self.trajectory_id, call_pk=call_pk, reward=self.reward, components=self.components, source="user", created_at=utcnow()
            )
        )
        return {"group_id": group_id, "call": self.index % len(calls)}


def _why_closed(reason: str | None) -> str:
    if reason == "idle":
        return " (it was idle for its policy's group_idle_close_s, with no call and no reward)"
    return ""


def close_idle_groups(conn: Connection, idle_s: Mapping[str, float], now: datetime | None = None, limit: int = 500) -> list[str]:
    """Close the open groups of each policy in ``idle_s`` (policy: seconds) that have seen no
    member's call and no reward for that long; return their ids. Run every few seconds by
    each gateway (gateway/groups/idle.py): closing an open group twice is harmless, and a
    group another gateway is closing is skipped (``SKIP LOCKED``). A lone attempt (a group of
    size 1) closed so without its reward has *expired* (close_reason "expired"): it never
    trains, and its policy's count of them (``PolicyRow.lone_expired``) grows by one."""
    now = now or utcnow()
    closed: list[str] = []
    for policy, seconds in sorted(idle_s.items()):
        cutoff = now - timedelta(seconds=seconds)
        rewarded_since = exists().where(Reward.trajectory_id == Trajectory.id, Reward.created_at >= cutoff)
        active = exists().where(Trajectory.group_id == Group.id, or_(Trajectory.updated_at >= cutoff, rewarded_since))
        ids = list(
            conn.execute(
                select(Group.id)
                .where(Group.policy == policy, Group.closed_at.is_(None), Group.created_at < cutoff, ~active)
                .order_by(Group.created_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).scalars()
        )
        if ids:
            unrewarded = ~exists().where(Trajectory.group_id == Group.id, Trajectory.reward.is_not(None))
            reason = case((and_(Group.expected_size == 1, unrewarded), EXPIRED), else_="idle")
            conn.execute(update(Group).where(Group.id.in_(ids), Group.closed_at.is_(None)).values(closed_at=now, close_reason=reason))
            expired = conn.execute(select(func.count()).where(Group.id.in_(ids), Group.close_reason == EXPIRED)).scalar_one()
            if expired:
                conn.execute(update(PolicyRow).where(PolicyRow.name == policy).values(lone_expired=PolicyRow.lone_expired + expired))
            settle(conn, ids)
            closed += ids
    return closed


@dataclass(slots=True)
class CloseGroup:
    group_id: str

    def apply(self, conn: Connection) -> dict[str, Any]:
        row = conn.execute(select(Group.closed_at).where(Group.id == self.group_id).with_for_update()).first()
        if row is None:
            raise NotFound(f"no group {local(self.group_id)!r}", "group_not_found", "group_id")
        if row.closed_at is None:  # closing twice is not an error: the first close stands
            conn.execute(update(Group).where(Group.id == self.group_id).values(closed_at=utcnow(), close_reason="closed"))
            settle(conn, [self.group_id])
        return {"group_id": self.group_id}


@dataclass(slots=True)
class RecordDemonstrations:
    """Posted demonstrations (core/learning/demonstrations.py: ``record``), each a trajectory in a group
    of its own, closed at once: it takes no reward and waits for a policy that trains on SFT."""

    records: list[CallRecord]

    def apply(self, conn: Connection) -> dict[str, Any]:
        ids = [r.trajectory_id for r in self.records]
        taken = set(conn.execute(select(Trajectory.id).where(Trajectory.id.in_(ids))).scalars())
        if taken:
            raise Conflict(f"trajectory {local(sorted(taken)[0])!r} exists already: a demonstration is a trajectory of its own", "trajectory_exists", "id")
        insert_calls(conn, self.records)
        conn.execute(update(Group).where(Group.id.in_(ids)).values(closed_at=utcnow(), close_reason=DEMONSTRATION))
        settle(conn, ids)
        return {"ids": ids}
