"""What the dashboard reads (``gateway/ui/``): groups and trajectories filtered and paged in
the store, and two versions' answers to the same held-out tasks.

Pages are keyset pages, newest first: ``before`` is the last row's key (``pk``) of the page
before, so a page costs the same at row one million as at row one, and nothing is counted
that the page does not show. Every filter is a WHERE clause the store evaluates; the
browser is never sent more than one page. A key's pages are its project's (``core/access.py``);
an admin's are every project's unless one is named. Each page names its rows by stored id,
with their project.

These are sync functions of a ``Connection``, run with ``Database.read``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

from sqlalchemy import Select, and_, exists, func, select, true
from sqlalchemy.engine import Connection

from burnish_server.core.access import qualify
from burnish_server.core.groups import GroupState
from burnish_server.core.records import OK
from burnish_server.core.transcript import UnreadableCall, exchange
from burnish_server.store import groups
from burnish_server.store.calls import to_record
from burnish_server.store.models import Call, Group, Trajectory

PAGE = 50  # rows a page shows


@dataclass(frozen=True, slots=True)
class Filters:
    """What a page of groups or trajectories is narrowed to; None: any."""

    project: str | None  # None: every project (an admin's view)
    policy: str | None = None
    version: int | None = None  # a step of ``policy`` that answered one of the trajectory's calls
    state: GroupState | None = None  # the group's
    eval: bool | None = None  # held out, or trained on
    reward_min: float | None = None
    reward_max: float | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


class Page(NamedTuple):
    rows: list[Any]
    next_before: int | None  # the key to pass as ``before`` for the next page; None: this is the last


def _page(conn: Connection, stmt: Select, key: Any, before: int | None, limit: int) -> Page:
    if before is not None:
        stmt = stmt.where(key < before)
    rows = conn.execute(stmt.order_by(key.desc()).limit(limit + 1)).all()
    return Page(list(rows[:limit]), rows[limit - 1].pk if len(rows) > limit else None)


def _answered_by(policy: str, version: int | None) -> Any:
    """The trajectory has a call that ``policy`` (at ``version``) answered: read from the calls'
    (policy, trajectory_id, policy_step) index alone."""
    where = [Call.trajectory_id == Trajectory.id, Call.policy == policy]
    if version is not None:
        where.append(Call.policy_step == version)
    return exists().where(*where)


def trajectories(conn: Connection, filters: Filters, before: int | None = None, limit: int = PAGE) -> Page:
    """A page of trajectories with their call count and group state, newest first."""
    calls = select(func.count()).where(Call.trajectory_id == Trajectory.id).scalar_subquery()
    stmt = select(
        Trajectory.pk,
        Trajectory.id,
        Trajectory.project,
        Trajectory.group_id,
        Trajectory.created_at,
        Trajectory.reward,
        Trajectory.eval,
        calls.label("calls"),
        groups.STATE.label("state"),
        Group.policy,
    ).outerjoin(Group, Group.id == Trajectory.group_id)
    if filters.project is not None:
        stmt = stmt.where(Trajectory.project == filters.project)
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
    return _page(conn, stmt, Trajectory.pk, before, limit)


def group_list(conn: Connection, filters: Filters, before: int | None = None, limit: int = PAGE) -> Page:
    """A page of groups with their members' count, rewards and mean reward, newest first. A
    group is held out (``eval``) if it was marked or any member was; a reward filter applies to
    the group's mean reward; a version filter to its members' calls."""
    stmt = select(
        Group.pk, Group.id, Group.project, Group.policy, Group.created_at, Group.expected_size, Group.eval, groups.STATE.label("state"), Group.trained_step
    )
    if filters.project is not None:
        stmt = stmt.where(Group.project == filters.project)
    if filters.policy is not None:
        stmt = stmt.where(Group.policy == filters.policy)
        if filters.version is not None:
            member = select(Trajectory.id).where(Trajectory.group_id == Group.id, _answered_by(filters.policy, filters.version))
            stmt = stmt.where(member.exists())
    if filters.state is not None:
        stmt = stmt.where(groups.STATE == filters.state.value)
    if filters.eval is not None:
        # `IS true`, not `= true`: SQLite would read the held-out trajectories' partial index
        # for each group (10 s at a million calls) instead of the group's members by group_id.
        marked = select(Trajectory.id).where(Trajectory.group_id == Group.id, Trajectory.eval.is_(True)).exists()
        stmt = stmt.where((Group.eval | marked) if filters.eval else and_(~Group.eval, ~marked))
    if filters.reward_min is not None or filters.reward_max is not None:
        mean = select(func.avg(Trajectory.reward)).where(Trajectory.group_id == Group.id).scalar_subquery()
        if filters.reward_min is not None:
            stmt = stmt.where(mean >= filters.reward_min)
        if filters.reward_max is not None:
            stmt = stmt.where(mean <= filters.reward_max)
    if filters.created_after is not None:
        stmt = stmt.where(Group.created_at > filters.created_after)
    if filters.created_before is not None:
        stmt = stmt.where(Group.created_at < filters.created_before)
    page = _page(conn, stmt, Group.pk, before, limit)
    ids = [row.id for row in page.rows]
    members = {
        row.group_id: row
        for row in conn.execute(
            select(Trajectory.group_id, func.count().label("size"), func.count(Trajectory.reward).label("rewarded"), func.avg(Trajectory.reward).label("mean"))
            .where(Trajectory.group_id.in_(ids))
            .group_by(Trajectory.group_id)
        )
    }
    return Page([(row, members.get(row.id)) for row in page.rows], page.next_before)


def group_row(conn: Connection, group_id: str) -> Any:
    """A group's row (its state's columns, its policy, the step that trained it), or None."""
    return conn.execute(select(Group).where(Group.id == group_id)).first()


def group_rewards(conn: Connection, group_id: str) -> list[tuple[str, float | None]]:
    """The group's members, in order, with their rewards: what its advantages are computed from."""
    return [
        (row.id, row.reward) for row in conn.execute(select(Trajectory.id, Trajectory.reward).where(Trajectory.group_id == group_id).order_by(Trajectory.pk))
    ]


class Answer(NamedTuple):
    trajectory_id: str
    reward: float
    task: str  # the conversation's first user message
    answer: str  # its last answer


# At most this many held-out trajectories a version are read to compare (the newest).
COMPARE_MAX = 50


class ProjectCount(NamedTuple):
    project: str
    groups: int
    trajectories: int


def projects(conn: Connection) -> list[ProjectCount]:
    """Every project with recorded data, and how many groups and trajectories it has. Reads
    each table's project column whole: the dashboard keeps the answer a while (gateway/ui/pages.py)."""
    group_counts: dict[str, int] = {p: n for p, n in conn.execute(select(Group.project, func.count()).group_by(Group.project))}
    trajectory_counts: dict[str, int] = {p: n for p, n in conn.execute(select(Trajectory.project, func.count()).group_by(Trajectory.project))}
    names = sorted(set(group_counts) | set(trajectory_counts))
    return [ProjectCount(n, group_counts.get(n, 0), trajectory_counts.get(n, 0)) for n in names]


def find_project(conn: Connection, kind: Literal["group", "trajectory"], local_id: str, candidates: list[str]) -> str | None:
    """The project among ``candidates`` that holds the group or trajectory ``local_id``, by
    its stored id in each (unique index lookups): an admin's link that named no project."""
    table = Group if kind == "group" else Trajectory
    stored = {qualify(p, local_id): p for p in candidates}
    found = conn.execute(select(table.id).where(table.id.in_(list(stored))).limit(1)).scalar()
    return stored[found] if found is not None else None


def _held_out(conn: Connection, policy: str, step: int, project: str) -> list[Answer]:
    """The newest rewarded held-out trajectories ``policy``'s version ``step`` answered (the
    latest version among their ok calls, as ``store/evals.py`` scores them). The read starts
    from the held-out trajectories (a partial index holds only them), newest first, and looks
    each one's version up in the calls' (policy, trajectory_id, policy_step) index: it stops at
    COMPARE_MAX, whatever the policy's history."""
    mine = (Call.trajectory_id == Trajectory.id, Call.policy == policy, Call.status == OK)
    version = select(func.coalesce(func.max(Call.policy_step), 0)).where(*mine).scalar_subquery()
    rows = conn.execute(
        select(Trajectory.id, Trajectory.reward)
        .where(Trajectory.eval == true(), Trajectory.reward.is_not(None), Trajectory.project == project, exists().where(*mine), version == step)
        .order_by(Trajectory.pk.desc())
        .limit(COMPARE_MAX)
    ).all()
    calls: dict[str, list[Any]] = {}
    if rows:
        found = select(Call).where(Call.trajectory_id.in_([r.id for r in rows]), Call.status == OK).order_by(Call.trajectory_id, Call.started_at, Call.pk)
        for call in conn.execute(found):
            calls.setdefault(call.trajectory_id, []).append(call)
    out = []
    for row in rows:
        mine_calls = calls.get(row.id)
        if not mine_calls:
            continue
        try:
            first, last = exchange(to_record(mine_calls[0])), exchange(to_record(mine_calls[-1]))
        except UnreadableCall:
            continue
        task = next((m.content for m in first.prompt if m.role == "user"), "")
        answer = last.answers[0].content if last.answers else ""
        out.append(Answer(row.id, row.reward, task, answer))
    return out


class Comparison(NamedTuple):
    pairs: list[tuple[str, Answer | None, Answer | None]]  # by task: version a's answer, version b's
    a: list[Answer]
    b: list[Answer]


def compare(conn: Connection, policy: str, a: int, b: int, project: str) -> Comparison:
    """Two versions' answers to the same held-out tasks, matched by the task's text (its first
    user message), the newest answer of each version to each task; tasks only one version
    answered are listed after those both did."""
    first_a, first_b = _held_out(conn, policy, a, project), _held_out(conn, policy, b, project)
    by_task_a = {x.task: x for x in reversed(first_a)}  # reversed: the newest wins
    by_task_b = {x.task: x for x in reversed(first_b)}
    both = [t for t in by_task_a if t in by_task_b]
    alone = [t for t in by_task_a if t not in by_task_b] + [t for t in by_task_b if t not in by_task_a]
    pairs = [(t, by_task_a.get(t), by_task_b.get(t)) for t in both + alone]
    return Comparison(pairs, first_a, first_b)
