"""Held-out scores: per policy version, the mean reward of its rewarded evaluation trajectories.

A trajectory marked for evaluation (``trajectories.eval``) is recorded and rewarded like any
other and never trained on (``store/training.py``). Its *version* of a policy is the step
that answered its ok calls to that policy (``calls.policy``, ``calls.policy_step``; a pinned
``<policy>@<step>`` call counts for that step). If its calls span versions (the policy
switched while it ran), the latest step: the trajectory ended on that version. Only rewarded
eval trajectories count; one that called two policies counts for each.

The read starts from the eval trajectories (a partial index holds only them) and reaches
their calls by trajectory, so its cost follows the held-out set, not the whole store.
These are sync functions of a ``Connection``, run with ``Database.read``.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Select, func, select, true
from sqlalchemy.engine import Connection

from burnish_server.core.policies import adapter_name
from burnish_server.core.records import OK
from burnish_server.core.views import EvalScore
from burnish_server.store.models import Call, PolicyRow, StepRow, Trajectory

# /metrics shows, per policy, the base (step 0), the served step and this many newest steps
# with held-out scores: a bounded number of series however long a policy trains.
METRICS_NEWEST = 3


class Score(NamedTuple):
    trajectories: int
    score: float


def _scores() -> Select:
    """(policy, step, trajectories, mean reward) for each policy's versions with rewarded eval trajectories."""
    held_out = (
        select(Trajectory.id, Trajectory.reward)
        # `= true` (not `IS true`): the form SQLite's planner matches to the partial index.
        .where(Trajectory.eval == true(), Trajectory.reward.is_not(None))
        .subquery()
    )
    latest = (
        select(Call.policy, held_out.c.id, held_out.c.reward, func.coalesce(func.max(Call.policy_step), 0).label("step"))
        .join(held_out, held_out.c.id == Call.trajectory_id)
        .where(Call.status == OK, Call.policy.is_not(None))
        .group_by(Call.policy, held_out.c.id, held_out.c.reward)
        .subquery()
    )
    return (
        select(latest.c.policy, latest.c.step, func.count().label("trajectories"), func.avg(latest.c.reward).label("score"))
        .group_by(latest.c.policy, latest.c.step)
        .order_by(latest.c.policy, latest.c.step)
    )


def scores_by_step(conn: Connection, policy: str) -> dict[int, Score]:
    """The policy's held-out score at each version that has one. Each rewarded held-out
    trajectory (the partial index) looks up its latest step of this policy in the calls'
    index (``ix_calls_trajectory``): one probe each, never the policy's other calls."""
    step = (
        select(func.max(func.coalesce(Call.policy_step, 0)))
        .where(Call.trajectory_id == Trajectory.id, Call.policy == policy, Call.status == OK)
        .scalar_subquery()
    )
    # `= true` (not `IS true`): the form SQLite's planner matches to the partial index.
    latest = select(Trajectory.reward, step.label("step")).where(Trajectory.eval == true(), Trajectory.reward.is_not(None)).subquery()
    query = (
        select(latest.c.step, func.count().label("trajectories"), func.avg(latest.c.reward).label("score"))
        .where(latest.c.step.is_not(None))  # held out, but it never called this policy
        .group_by(latest.c.step)
    )
    return {row.step: Score(row.trajectories, float(row.score)) for row in conn.execute(query)}


def eval_scores(conn: Connection, policy: str, served: int, *, every_version: bool) -> list[EvalScore]:
    """The policy's versions, oldest first, each with its held-out score. ``every_version``: the
    base (step 0), each trained step and each step with a score, null where none was rewarded;
    otherwise only the versions that have a score."""
    scores = scores_by_step(conn, policy)
    steps = set(scores)
    if every_version:
        steps |= {0, served, *conn.execute(select(StepRow.step).where(StepRow.policy == policy)).scalars()}
    out = []
    for step in sorted(steps):
        found = scores.get(step)
        out.append(
            EvalScore(
                step=step,
                version=adapter_name(policy, step),
                serving=step == served,
                trajectories=found.trajectories if found else 0,
                score=found.score if found else None,
            )
        )
    return out


def for_metrics(conn: Connection) -> dict[tuple[str, int], Score]:
    """Held-out scores for /metrics, by (policy, step): per policy only the base, the served step
    and the ``METRICS_NEWEST`` newest steps that have a score, so label cardinality stays bounded."""
    served: dict[str, int] = dict(conn.execute(select(PolicyRow.name, PolicyRow.step)).all())
    by_policy: dict[str, dict[int, Score]] = {}
    for row in conn.execute(_scores()):
        by_policy.setdefault(row.policy, {})[row.step] = Score(row.trajectories, float(row.score))
    out: dict[tuple[str, int], Score] = {}
    for policy, scores in by_policy.items():
        keep = {0, served.get(policy, 0), *sorted(scores)[-METRICS_NEWEST:]}
        out |= {(policy, step): score for step, score in scores.items() if step in keep}
    return out
