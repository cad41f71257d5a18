"""Retention: each project's setting, and removing old trajectories (prune) and putting them back (restore).

What may go (``core/platform/retention.py`` says it for users): a trajectory whose last call and last
reward are older than the cutoff, taken whole with its calls and rewards; a trajectory in a
group only with the whole group (every member that old), which must be closed, neither being
trained nor ready to train, and, unless asked, not trained on by a kept version of its policy.
The group's row and its RULER verdict go with its last members.

Prune goes in small batches, each in two short transactions, so that live traffic is never
held up for long:

1. ``select_batch`` (a read) finds the next candidates after a cursor, and ``read_batch``
   reads everything about them into archive records (``core/platform/archive.py``);
2. ``delete_batch`` (a write transaction) locks the candidates' rows (groups first, then
   trajectories, each in id order, as the writer takes them), checks that nothing changed
   since the read (no call, no reward, no claim, no change of state), deletes what did not
   change, hands the records of what it deleted to ``archive`` (which writes and syncs them),
   and only then commits. A failure of the archive rolls the batch back: nothing is ever
   deleted that is not in the archive. A call that comes for a trajectory being deleted waits
   for the commit, then starts it afresh (the writer's upsert).

Restore inserts each archived trajectory that is not in the store, with its group and verdict
if they are not there either; one that is (restored before, or recorded again since) is
skipped and counted: restoring twice never duplicates a row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, exists, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from burnish_server.core.learning.promotion import Outcome
from burnish_server.core.platform.archive import ArchivedCall, ArchivedGroup, ArchivedReward, ArchivedTrajectory, ArchivedVerdict, utc
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.retention import Retention
from burnish_server.store.models import Call, Group, HeldOut, PolicyRow, RetentionRow, Reward, RulerVerdict, StepRow, Trajectory
from burnish_server.store.training import ready_groups, training_rules

# ---- the setting --------------------------------------------------------------------------


def get_retention(conn: Connection, project: str) -> tuple[Retention | None, datetime | None]:
    """A project's own setting and when it was set; (None, None) if it has none."""
    row = conn.execute(select(RetentionRow).where(RetentionRow.project == project)).one_or_none()
    if row is None:
        return None, None
    return Retention(days=row.days, prune_trained=row.prune_trained), utc(row.updated_at)


def set_retention(conn: Connection, project: str, setting: Retention) -> datetime:
    now = utcnow()
    values = {"project": project, "days": setting.days, "prune_trained": setting.prune_trained, "updated_at": now}
    upsert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(RetentionRow).values(values)
    conn.execute(upsert.on_conflict_do_update(index_elements=["project"], set_={k: v for k, v in values.items() if k != "project"}))
    return now


def all_retention(conn: Connection) -> dict[str, Retention]:
    """Every project's own setting."""
    return {row.project: Retention(days=row.days, prune_trained=row.prune_trained) for row in conn.execute(select(RetentionRow))}


def recorded_projects(conn: Connection) -> list[str]:
    """The projects that have trajectories."""
    return sorted(conn.execute(select(Trajectory.project).distinct()).scalars())


# ---- what a kept version trained on ---------------------------------------------------------


def kept_versions(conn: Connection) -> set[tuple[str, int]]:
    """(policy, step) of every version kept: each policy's served version, its head and its
    candidate, every version promoted, and the versions each of these was trained from."""
    parents: dict[tuple[str, int], int] = {}
    live: set[tuple[str, int]] = set()
    for row in conn.execute(select(StepRow.policy, StepRow.step, StepRow.parent, StepRow.decision)):
        parents[(row.policy, row.step)] = row.parent
        if row.decision == Outcome.PROMOTED:
            live.add((row.policy, row.step))
    for policy in conn.execute(select(PolicyRow.name, PolicyRow.step, PolicyRow.head, PolicyRow.candidate)):
        live |= {(policy.name, s) for s in (policy.step, policy.head, policy.candidate) if s}
    kept: set[tuple[str, int]] = set()
    for version in live:
        while version[1] and version not in kept:  # back to the base (step 0), or to a version seen
            kept.add(version)
            parent = parents.get(version)
            if parent is None:
                break
            version = (version[0], parent)
    return kept


# ---- prune ----------------------------------------------------------------------------------


@dataclass
class Counts:
    """What a prune did (or, dry, would do), and what it kept that was old enough to go."""

    trajectories: int = 0
    calls: int = 0
    rewards: int = 0
    groups: int = 0
    # Old enough, kept: a kept version trained on it; ready to train; open; changed while pruning.
    kept_trained: int = 0
    kept_ready: int = 0
    kept_open: int = 0
    kept_changed: int = 0

    def add(self, other: Counts) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Unit:
    """What goes together: an ungrouped trajectory, or a group with every member."""

    group_id: str | None
    trajectory_ids: list[str]
    # As read: what must not have changed for it to go.
    seen: dict[str, Any] = field(default_factory=dict)
    records: list[ArchivedTrajectory] = field(default_factory=list)


def _active_since(cut: datetime) -> Any:
    """A trajectory with a call or a reward at or after ``cut`` (never NULL: it is negated)."""
    rewarded = exists().where(Reward.trajectory_id == Trajectory.id, Reward.created_at >= cut)
    return or_(Trajectory.updated_at >= cut, and_(Trajectory.rewarded_at.is_not(None), Trajectory.rewarded_at >= cut), rewarded)


@dataclass
class PruneBatch:
    """One batch of what prune takes: its units, where to go on from, and what they count."""

    units: list[Unit]
    # The cursors to go on from: the last trajectory's and group's pk looked at (None: done).
    after_trajectory: int | None
    after_group: int | None
    counts: Counts


def select_batch(
    conn: Connection,
    project: str,
    cut: datetime,
    *,
    include_trained: bool,
    after_trajectory: int | None,
    after_group: int | None,
    limit: int,
    kept: set[tuple[str, int]] | None = None,
) -> PruneBatch:
    """The next ``limit`` ungrouped trajectories and ``limit`` groups of ``project`` that may go,
    after the cursors (None: that kind is done); the counts say what was old enough and kept."""
    counts = Counts()
    units: list[Unit] = []
    next_trajectory = next_group = None
    if after_trajectory is not None:
        rows = conn.execute(
            select(Trajectory.pk, Trajectory.id)
            .where(Trajectory.project == project, Trajectory.group_id.is_(None), Trajectory.pk > after_trajectory, ~_active_since(cut))
            .order_by(Trajectory.pk)
            .limit(limit)
        ).all()
        units += [Unit(None, [row.id]) for row in rows]
        next_trajectory = rows[-1].pk if len(rows) == limit else None
    if after_group is not None:
        member_active = exists().where(Trajectory.group_id == Group.id, _active_since(cut))
        found = conn.execute(
            select(Group.pk, Group.id, Group.policy, Group.trained_at, Group.trained_step, Group.claimed_by)
            .where(
                Group.project == project, Group.pk > after_group, Group.closed_at.is_not(None), Group.closed_at < cut, Group.created_at < cut, ~member_active
            )
            .order_by(Group.pk)
            .limit(limit)
        ).all()
        next_group = found[-1].pk if len(found) == limit else None
        if kept is None:
            kept = kept_versions(conn)
        untrained = [row for row in found if row.trained_at is None]
        ready: set[str] = set()
        for policy in {row.policy for row in untrained if row.policy is not None}:
            ids = [row.id for row in untrained if row.policy == policy]
            ready |= set(conn.execute(ready_groups(policy, now=utcnow(), rules=training_rules(conn, policy)).where(Group.id.in_(ids))).scalars())
        goes: list[str] = []
        for row in found:
            if row.trained_at is None and (row.claimed_by is not None or row.id in ready):
                counts.kept_ready += 1  # being trained, or waiting to be
            elif row.trained_at is not None and not include_trained and (row.policy, row.trained_step) in kept:
                counts.kept_trained += 1
            else:
                goes.append(row.id)
        members: dict[str, list[str]] = {g: [] for g in goes}
        for gid, tid in conn.execute(select(Trajectory.group_id, Trajectory.id).where(Trajectory.group_id.in_(goes)).order_by(Trajectory.pk)):
            if gid is not None:
                members[gid].append(tid)
        units += [Unit(g, members[g]) for g in goes]
    return PruneBatch(units=units, after_trajectory=next_trajectory, after_group=next_group, counts=counts)


def count_open(conn: Connection, project: str, cut: datetime) -> int:
    """Groups old enough to go but still open (an open group is never removed)."""
    member_active = exists().where(Trajectory.group_id == Group.id, _active_since(cut))
    query = select(func.count()).select_from(Group).where(Group.project == project, Group.closed_at.is_(None), Group.created_at < cut, ~member_active)
    return int(conn.execute(query).scalar_one())


def _columns(row: Any, names: Iterable[str]) -> dict[str, Any]:
    values = {name: getattr(row, name) for name in names}
    return {name: utc(value) if isinstance(value, datetime) else value for name, value in values.items()}


_CALL_FIELDS = tuple(ArchivedCall.__struct_fields__)
_GROUP_FIELDS = tuple(ArchivedGroup.__struct_fields__)
_VERDICT_FIELDS = tuple(ArchivedVerdict.__struct_fields__)
_REWARD_FIELDS = tuple(ArchivedReward.__struct_fields__)
_TRAJECTORY_FIELDS = ("id", "project", "group_id", "created_at", "updated_at", "reward", "reward_components", "rewarded_at", "eval", "policy", "followed")


def _fingerprint(conn: Connection, units: Sequence[Unit]) -> dict[str, Any]:
    """What must stay the same between the read and the delete, per unit: the group's state,
    its members, each member's times, its calls' and rewards' count and newest key."""
    group_ids = [u.group_id for u in units if u.group_id is not None]
    trajectory_ids = [t for u in units for t in u.trajectory_ids]
    seen: dict[str, Any] = {}
    for row in conn.execute(
        select(Group.id, Group.closed_at, Group.claimed_by, Group.trained_at, Group.trained_step, Group.ruler_key).where(Group.id.in_(group_ids))
    ):
        seen[f"g:{row.id}"] = tuple(row)
    for gid, tid in conn.execute(select(Trajectory.group_id, Trajectory.id).where(Trajectory.group_id.in_(group_ids)).order_by(Trajectory.id)):
        seen.setdefault(f"m:{gid}", []).append(tid)
    for member in conn.execute(
        select(Trajectory.id, Trajectory.group_id, Trajectory.updated_at, Trajectory.rewarded_at, Trajectory.reward).where(Trajectory.id.in_(trajectory_ids))
    ):
        seen[f"t:{member.id}"] = tuple(member)
    for tid, count, newest in conn.execute(
        select(Call.trajectory_id, func.count(), func.max(Call.pk)).where(Call.trajectory_id.in_(trajectory_ids)).group_by(Call.trajectory_id)
    ):
        seen[f"c:{tid}"] = (count, newest)
    for tid, count, newest in conn.execute(
        select(Reward.trajectory_id, func.count(), func.max(Reward.pk)).where(Reward.trajectory_id.in_(trajectory_ids)).group_by(Reward.trajectory_id)
    ):
        seen[f"r:{tid}"] = (count, newest)
    return seen


def _unit_keys(unit: Unit) -> list[str]:
    keys = [f"{kind}:{t}" for t in unit.trajectory_ids for kind in "tcr"]
    if unit.group_id is not None:
        keys += [f"g:{unit.group_id}", f"m:{unit.group_id}"]
    return keys


def read_batch(conn: Connection, units: list[Unit], now: datetime | None = None) -> None:
    """Fill each unit's archive records and what it looked like (``seen``), in one read."""
    now = now or utcnow()
    seen = _fingerprint(conn, units)
    trajectory_ids = [t for u in units for t in u.trajectory_ids]
    group_ids = [u.group_id for u in units if u.group_id is not None]
    calls: dict[str, list[ArchivedCall]] = {}
    for row in conn.execute(select(Call).where(Call.trajectory_id.in_(trajectory_ids)).order_by(Call.started_at, Call.pk)):
        calls.setdefault(row.trajectory_id, []).append(ArchivedCall(**_columns(row, _CALL_FIELDS)))
    rewards: dict[str, list[ArchivedReward]] = {}
    for reward in conn.execute(select(Reward).where(Reward.trajectory_id.in_(trajectory_ids)).order_by(Reward.pk)):
        rewards.setdefault(reward.trajectory_id, []).append(ArchivedReward(**_columns(reward, _REWARD_FIELDS)))
    groups = {row.id: ArchivedGroup(**_columns(row, _GROUP_FIELDS)) for row in conn.execute(select(Group).where(Group.id.in_(group_ids)))}
    keys = {g.ruler_key for g in groups.values() if g.ruler_key}
    verdicts = {row.key: ArchivedVerdict(**_columns(row, _VERDICT_FIELDS)) for row in conn.execute(select(RulerVerdict).where(RulerVerdict.key.in_(keys)))}
    trajectories = {row.id: row for row in conn.execute(select(Trajectory).where(Trajectory.id.in_(trajectory_ids)))}
    for unit in units:
        unit.seen = {key: seen.get(key) for key in _unit_keys(unit)}
        group = groups.get(unit.group_id) if unit.group_id else None
        verdict = verdicts.get(group.ruler_key) if group is not None and group.ruler_key else None
        unit.records = [
            ArchivedTrajectory(
                **_columns(trajectories[t], _TRAJECTORY_FIELDS),
                calls=calls.get(t, []),
                rewards=rewards.get(t, []),
                group=group,
                verdict=verdict,
                archived_at=now,
            )
            for t in unit.trajectory_ids
            if t in trajectories
        ]


def delete_batch(conn: Connection, units: list[Unit], archive: Callable[[list[ArchivedTrajectory]], None] | None) -> tuple[Counts, list[Unit]]:
    """In one transaction: lock the units' rows, delete those unchanged since ``read_batch``,
    hand their records to ``archive`` (None: a dry run, nothing deleted), then commit (the
    caller's transaction). Returns what was deleted and the units that went."""
    group_ids = sorted(u.group_id for u in units if u.group_id is not None)
    trajectory_ids = sorted(t for u in units for t in u.trajectory_ids)
    # Groups, then trajectories, each in id order: the order in which the writer takes them.
    conn.execute(select(Group.pk).where(Group.id.in_(group_ids)).order_by(Group.id).with_for_update())
    conn.execute(select(Trajectory.pk).where(Trajectory.id.in_(trajectory_ids)).order_by(Trajectory.id).with_for_update())
    now = _fingerprint(conn, units)
    counts = Counts()
    going = []
    for unit in units:
        if all(now.get(key) == unit.seen.get(key) for key in _unit_keys(unit)) and len(unit.records) == len(unit.trajectory_ids):
            going.append(unit)
        else:
            counts.kept_changed += 1
    ids = [t for u in going for t in u.trajectory_ids]
    gone_groups = [u.group_id for u in going if u.group_id is not None]
    counts.trajectories = len(ids)
    counts.groups = len(gone_groups)
    counts.calls = sum(len(r.calls) for u in going for r in u.records)
    counts.rewards = sum(len(r.rewards) for u in going for r in u.records)
    if archive is None or not going:
        return counts, going
    conn.execute(delete(Reward).where(Reward.trajectory_id.in_(ids)))
    conn.execute(delete(HeldOut).where(HeldOut.trajectory_pk.in_(select(Trajectory.pk).where(Trajectory.id.in_(ids)))))
    conn.execute(delete(Call).where(Call.trajectory_id.in_(ids)))
    conn.execute(delete(Trajectory).where(Trajectory.id.in_(ids)))
    if gone_groups:
        keys = {r.group.ruler_key for u in going for r in u.records[:1] if r.group is not None and r.group.ruler_key}
        conn.execute(delete(Group).where(Group.id.in_(gone_groups)))
        if keys:  # a verdict goes with the last group that names it
            still = set(conn.execute(select(Group.ruler_key).where(Group.ruler_key.in_(keys))).scalars())
            if keys - still:
                conn.execute(delete(RulerVerdict).where(RulerVerdict.key.in_(keys - still)))
    archive([r for u in going for r in u.records])  # written and synced before the commit
    return counts, going


# ---- restore --------------------------------------------------------------------------------


def _upsert(conn: Connection) -> Any:
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


def restore_records(conn: Connection, records: list[ArchivedTrajectory]) -> tuple[int, int]:
    """Insert each record's trajectory, calls and rewards, and its group and verdict where
    they are not in the store; a trajectory that is, is skipped. Returns (restored, skipped)."""
    upsert = _upsert(conn)
    restored = skipped = 0
    joined: set[str] = set()
    for record in records:
        if record.group is not None:
            group = {name: getattr(record.group, name) for name in _GROUP_FIELDS}
            conn.execute(upsert(Group).values(group).on_conflict_do_nothing(index_elements=["id"]))
        if record.verdict is not None:
            verdict = {name: getattr(record.verdict, name) for name in _VERDICT_FIELDS}
            conn.execute(upsert(RulerVerdict).values(verdict).on_conflict_do_nothing(index_elements=["key"]))
        trajectory = {name: getattr(record, name) for name in _TRAJECTORY_FIELDS}
        added = conn.execute(upsert(Trajectory).values(trajectory).on_conflict_do_nothing(index_elements=["id"])).rowcount
        if not added:
            skipped += 1
            continue
        keys: dict[int, int] = {}
        for call in record.calls:
            values = {name: getattr(call, name) for name in _CALL_FIELDS if name != "pk"}
            inserted = conn.execute(insert(Call).values(trajectory_id=record.id, **values)).inserted_primary_key
            assert inserted is not None
            keys[call.pk] = inserted[0]
        if record.rewards:
            rows = [{name: getattr(r, name) for name in _REWARD_FIELDS} | {"trajectory_id": record.id} for r in record.rewards]
            for row in rows:
                row["call_pk"] = None if row["call_pk"] is None else keys[row["call_pk"]]
            conn.execute(insert(Reward), rows)
        restored += 1
        if record.group_id is not None:
            joined.add(record.group_id)
    # A member back in its group changes what the group lacks: worked out again (store/training.py: settle).
    if joined:
        conn.execute(update(Group).where(Group.id.in_(sorted(joined))).values(lacks=None))
    return restored, skipped


@functools.cache
def _tables() -> dict[str, tuple[str, ...]]:
    """Each archived table's columns (tests check the archive has a field for each)."""
    return {
        "calls": tuple(c.name for c in Call.__table__.columns),
        "rewards": tuple(c.name for c in Reward.__table__.columns),
        # What a group lacks to train is worked out again from its members: a restored group
        # comes back unsettled (store/training.py: settle), never with a stale answer.
        "groups": tuple(c.name for c in Group.__table__.columns if c.name != "lacks"),
        # Likewise a held-out trajectory's scored versions (store/evals.py: settle).
        "trajectories": tuple(c.name for c in Trajectory.__table__.columns if c.name != "scored"),
        "ruler_verdicts": tuple(c.name for c in RulerVerdict.__table__.columns),
    }


def archived_columns() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per table: its columns, and the archive's fields for it (a column the archive lacks would
    be lost by a prune and a restore)."""
    tables = _tables()
    return {
        "calls": (tables["calls"], ("pk", "trajectory_id", *_CALL_FIELDS)),
        "rewards": (tables["rewards"], ("pk", "trajectory_id", *_REWARD_FIELDS)),
        "groups": (tables["groups"], ("pk", *_GROUP_FIELDS)),
        "trajectories": (tables["trajectories"], ("pk", *_TRAJECTORY_FIELDS)),
        "ruler_verdicts": (tables["ruler_verdicts"], ("pk", *_VERDICT_FIELDS)),
    }
