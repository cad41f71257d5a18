"""The one listing of trajectories and groups: filtered and paged in the store, for the JSON
API (``GET /v1/trajectories``, the export) and the dashboard's lists alike.

Every filter (``core/api/listing.py: Filters``) is a WHERE clause the store evaluates, and a page
is a keyset page (``Keyset``): the rows after the previous page's last row by key (``pk``),
found by its stored id through the unique index, so a page costs the same at row one million
as at row one, and nothing is counted that the page does not show.

These are sync functions of a ``Connection``, run with ``Database.read``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec
from sqlalchemy import Select, and_, func, select
from sqlalchemy.engine import Connection

from burnish_server.core.api.listing import Filters, Keyset
from burnish_server.store import groups
from burnish_server.store.models import Call, Group, Trajectory

R = TypeVar("R")


class TrajectoryRow(msgspec.Struct, frozen=True, kw_only=True):
    """A trajectory as a list shows it: its own columns, its calls counted, its group's state and policy."""

    pk: int
    id: str  # stored
    project: str
    group_id: str | None  # stored
    created_at: datetime
    updated_at: datetime
    reward: float | None
    reward_components: dict[str, float] | None
    rewarded_at: datetime | None
    eval: bool
    calls: int
    state: str | None  # its group's (core/learning/groups.py); None outside any group
    policy: str | None  # its group's


class GroupRow(msgspec.Struct, frozen=True, kw_only=True):
    """A group as a list shows it, with its members counted: how many, how many rewarded, their mean reward."""

    pk: int
    id: str  # stored
    project: str
    policy: str | None
    created_at: datetime
    expected_size: int | None
    eval: bool  # marked, or any member marked
    state: str
    trained_step: int | None
    size: int
    rewarded: int
    mean: float | None


class Page(msgspec.Struct, Generic[R], frozen=True):
    rows: list[R]
    has_more: bool  # another page follows the last row


def _answered_by(policy: str, version: int | None) -> Any:
    """The trajectory has a call that ``policy`` (at ``version``) answered: read from the calls'
    index (``ix_calls_trajectory``) alone."""
    where = [Call.trajectory_id == Trajectory.id, Call.policy == policy]
    if version is not None:
        where.append(Call.policy_step == version)
    # `SELECT pk`, not `*`: SQLite would read each call's row where the index holds all it needs.
    return select(Call.pk).where(*where).exists()


def narrowed(stmt: Select, filters: Filters) -> Select:
    """``stmt`` over trajectories narrowed to ``filters``. A filter on the group's state reads
    the group's columns: ``stmt`` must join ``groups`` then (``trajectories`` does)."""
    if filters.project is not None:
        stmt = stmt.where(Trajectory.project == filters.project)
    if filters.group_id is not None:
        stmt = stmt.where(Trajectory.group_id == filters.group_id)
    if filters.rewarded is not None:
        stmt = stmt.where(Trajectory.reward.is_not(None) if filters.rewarded else Trajectory.reward.is_(None))
    if filters.policy is not None:
        stmt = stmt.where(_answered_by(filters.policy, filters.version))
    if filters.state is not None:  # a trajectory outside any group has no state
        stmt = stmt.where(Trajectory.group_id.is_not(None), groups.STATE == filters.state.value)
    if filters.eval is not None:
        stmt = stmt.where(Trajectory.eval == filters.eval)
    if filters.reward_min is not None:
        stmt = stmt.where(Trajectory.reward >= filters.reward_min)
    if filters.reward_max is not None:
        stmt = stmt.where(Trajectory.reward <= filters.reward_max)
    if filters.created_after is not None:
        stmt = stmt.where(Trajectory.created_at > filters.created_after)
    if filters.created_before is not None:
        stmt = stmt.where(Trajectory.created_at < filters.created_before)
    return stmt


def _page(conn: Connection, stmt: Select, table: type[Group] | type[Trajectory], keyset: Keyset) -> tuple[list[Any], bool] | None:
    """The keyset page of ``stmt`` over ``table``; None if ``keyset.after`` names no row."""
    if keyset.after is not None:
        after = conn.execute(select(table.pk).where(table.id == keyset.after)).scalar()
        if after is None:
            return None
        stmt = stmt.where(table.pk < after if keyset.descending else table.pk > after)
    rows = conn.execute(stmt.order_by(table.pk.desc() if keyset.descending else table.pk).limit(keyset.limit + 1)).all()
    return list(rows[: keyset.limit]), len(rows) > keyset.limit


def trajectories(conn: Connection, filters: Filters, keyset: Keyset) -> Page[TrajectoryRow] | None:
    """A page of trajectories with their call count and group; None if ``keyset.after`` names no trajectory."""
    calls = select(func.count()).where(Call.trajectory_id == Trajectory.id).scalar_subquery()
    stmt = select(
        Trajectory.pk,
        Trajectory.id,
        Trajectory.project,
        Trajectory.group_id,
        Trajectory.created_at,
        Trajectory.updated_at,
        Trajectory.reward,
        Trajectory.reward_components,
        Trajectory.rewarded_at,
        Trajectory.eval,
        calls.label("calls"),
        groups.STATE.label("state"),
        Group.policy,
    ).outerjoin(Group, Group.id == Trajectory.group_id)
    found = _page(conn, narrowed(stmt, filters), Trajectory, keyset)
    if found is None:
        return None
    rows, more = found
    out = [TrajectoryRow(**{**row._mapping, "state": row.state if row.group_id is not None else None}) for row in rows]
    return Page(out, more)


def group_list(conn: Connection, filters: Filters, keyset: Keyset) -> Page[GroupRow] | None:
    """A page of groups with their members' count, rewards and mean reward; None if
    ``keyset.after`` names no group. A group is held out (``eval``) if it was marked or any
    member was; a reward filter applies to the group's mean reward; a version filter to its
    members' calls."""
    stmt = select(
        Group.pk, Group.id, Group.project, Group.policy, Group.created_at, Group.expected_size, Group.eval, groups.STATE.label("state"), Group.trained_step
    )
    if filters.project is not None:
        stmt = stmt.where(Group.project == filters.project)
    if filters.group_id is not None:
        stmt = stmt.where(Group.id == filters.group_id)
    if filters.policy is not None:
        stmt = stmt.where(Group.policy == filters.policy)
        if filters.version is not None:
            member = select(Trajectory.id).where(Trajectory.group_id == Group.id, _answered_by(filters.policy, filters.version))
            stmt = stmt.where(member.exists())
    if filters.state is not None:
        stmt = stmt.where(groups.STATE == filters.state.value)
    if filters.eval is not None:
        # Each group's members probed by group_id, as the page walks the groups: `IS true`, not
        # `= true`, or SQLite reads the held-out trajectories' partial index for each group (10 s
        # at a million calls); a scalar subquery, not EXISTS, or PostgreSQL hashes every held-out
        # trajectory first (118 ms at ten million calls; 2 ms probed).
        marked = select(Trajectory.pk).where(Trajectory.group_id == Group.id, Trajectory.eval.is_(True)).limit(1).scalar_subquery()
        stmt = stmt.where((Group.eval | marked.is_not(None)) if filters.eval else and_(~Group.eval, marked.is_(None)))
    if filters.rewarded is not None or filters.reward_min is not None or filters.reward_max is not None:
        mean = select(func.avg(Trajectory.reward)).where(Trajectory.group_id == Group.id).scalar_subquery()
        if filters.rewarded is not None:  # a mean only where some member has a reward
            stmt = stmt.where(mean.is_not(None) if filters.rewarded else mean.is_(None))
        if filters.reward_min is not None:
            stmt = stmt.where(mean >= filters.reward_min)
        if filters.reward_max is not None:
            stmt = stmt.where(mean <= filters.reward_max)
    if filters.created_after is not None:
        stmt = stmt.where(Group.created_at > filters.created_after)
    if filters.created_before is not None:
        stmt = stmt.where(Group.created_at < filters.created_before)
    found = _page(conn, stmt, Group, keyset)
    if found is None:
        return None
    rows, more = found
    members = {
        row.group_id: row
        for row in conn.execute(
            select(Trajectory.group_id, func.count().label("size"), func.count(Trajectory.reward).label("rewarded"), func.avg(Trajectory.reward).label("mean"))
            .where(Trajectory.group_id.in_([row.id for row in rows]))
            .group_by(Trajectory.group_id)
        )
    }
    out = []
    for row in rows:
        m = members.get(row.id)
        out.append(GroupRow(**row._mapping, size=m.size if m else 0, rewarded=m.rewarded if m else 0, mean=m.mean if m else None))
    return Page(out, more)
