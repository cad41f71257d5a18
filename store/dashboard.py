"""What the dashboard reads (``gateway/ui/``) beyond its lists (``store/listing.py``, shared
with the API): a group's row and rewards, the projects, and two versions' answers to the same
held-out tasks.

These are sync functions of a ``Connection``, run with ``Database.read``.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from burnish_server.core.platform.access import qualify
from burnish_server.core.protocols.records import OK
from burnish_server.core.protocols.transcript import UnreadableCall, exchange
from burnish_server.store import evals
from burnish_server.store.calls import to_record
from burnish_server.store.models import Call, Group, Trajectory


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
    latest version among their ok calls, as ``store/evals.py`` scores them), at most
    COMPARE_MAX: read from that version's own held-out entries (``evals.answered``), not by
    walking every held-out trajectory newest first until old versions turn up."""
    # The version's pks first, then their rows a batch at a time: joined in one statement, the
    # generic plan PostgreSQL keeps for a prepared statement walked every trajectory instead
    # (1.1 s at a million calls, 4 ms planned for the version).
    pks = sorted(conn.execute(select(evals.answered(policy, step).c.pk)).scalars(), reverse=True)
    rows: list[Any] = []
    for lo in range(0, len(pks), COMPARE_MAX * 4):
        batch = pks[lo : lo + COMPARE_MAX * 4]
        rows += conn.execute(
            select(Trajectory.id, Trajectory.reward).where(Trajectory.pk.in_(batch), Trajectory.project == project).order_by(Trajectory.pk.desc())
        ).all()
        if len(rows) >= COMPARE_MAX:
            break
    rows = rows[:COMPARE_MAX]
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


class HeldOutAnswers(NamedTuple):
    """Two versions' answers to held-out tasks, side by side (the dashboard's compare page)."""

    pairs: list[tuple[str, Answer | None, Answer | None]]  # by task: version a's answer, version b's
    a: list[Answer]
    b: list[Answer]


def held_out_answers(conn: Connection, policy: str, a: int, b: int, project: str) -> HeldOutAnswers:
    """Two versions' answers to the same held-out tasks, matched by the task's text (its first
    user message), the newest answer of each version to each task; tasks only one version
    answered are listed after those both did."""
    first_a, first_b = _held_out(conn, policy, a, project), _held_out(conn, policy, b, project)
    by_task_a = {x.task: x for x in reversed(first_a)}  # reversed: the newest wins
    by_task_b = {x.task: x for x in reversed(first_b)}
    both = [t for t in by_task_a if t in by_task_b]
    alone = [t for t in by_task_a if t not in by_task_b] + [t for t in by_task_b if t not in by_task_a]
    pairs = [(t, by_task_a.get(t), by_task_b.get(t)) for t in both + alone]
    return HeldOutAnswers(pairs, first_a, first_b)
