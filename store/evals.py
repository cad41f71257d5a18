"""Held-out scores: per policy version, the mean reward of its rewarded evaluation trajectories.

A trajectory marked for evaluation (``trajectories.eval``) is recorded and rewarded like any
other and never trained on (``store/training.py``). Its *version* of a policy is the step
that answered its ok calls to that policy (``calls.policy``, ``calls.policy_step``; a pinned
``<policy>@<step>`` call counts for that step). If its calls span versions (the policy
switched while it ran), the latest step: the trajectory ended on that version. Only rewarded
eval trajectories count; one that called two policies counts for each.

Each rewarded held-out trajectory's versions are *settled* into ``held_out`` when its reward is
stored (``settle``): a row per policy it called, with the lowest and highest step of its ok
calls and its reward, indexed by version. A call that comes after marks the trajectory
unsettled (``trajectories.scored`` false, store/writes.py) until its next reward or the
trainer's next poll settles it again (``settle_unscored``); meanwhile its rows are passed over
and its versions worked out from its calls, in the same statement. So a policy's scores read that policy's entries
and a few unsettled trajectories, not the whole held-out set's calls, and are never stale.

These are sync functions of a ``Connection``, run with ``Database.read`` (the settling ones
with ``Database.transaction``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from sqlalchemy import String, delete, false, func, insert, literal, select, true, union_all, update
from sqlalchemy.engine import Connection

from burnish_server.core.api.views import EvalScore
from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.protocols.records import OK
from burnish_server.store.models import Call, HeldOut, PolicyRow, StepRow, Trajectory

# /metrics shows, per policy, the base (step 0), the served step and this many newest steps
# with held-out scores: a bounded number of series however long a policy trains.
METRICS_NEWEST = 3
# Unsettled trajectories the trainer's poll settles at a time (a store upgraded or restored
# may hold many; each poll takes this many more).
SETTLE_BATCH = 500


class Score(NamedTuple):
    trajectories: int
    score: float


class Version(NamedTuple):
    """A rewarded held-out trajectory's steps of a policy: the lowest and highest of its ok calls."""

    first: int
    last: int
    reward: float


def _step() -> Any:
    return func.coalesce(Call.policy_step, 0)


def settle(conn: Connection, pks: Sequence[int]) -> None:
    """Write the ``held_out`` rows of those trajectories (by pk) that are held out and rewarded,
    from their calls, and mark them scored. The caller holds their rows: its reward's UPDATE,
    or ``settle_unscored``'s lock."""
    if not pks:
        return
    conn.execute(delete(HeldOut).where(HeldOut.trajectory_pk.in_(pks)))
    rewarded = (Trajectory.pk.in_(pks), Trajectory.eval == true(), Trajectory.reward.is_not(None))
    versions = (
        select(Trajectory.pk, Call.policy, func.min(_step()), func.max(_step()), Trajectory.reward)
        .join(Call, Call.trajectory_id == Trajectory.id)
        .where(*rewarded, Call.status == OK, Call.policy.is_not(None))
        .group_by(Trajectory.pk, Call.policy, Trajectory.reward)
    )
    conn.execute(insert(HeldOut).from_select(["trajectory_pk", "policy", "first_step", "last_step", "reward"], versions))
    conn.execute(update(Trajectory).where(*rewarded, Trajectory.scored == false()).values(scored=True))


def _unscored() -> Any:
    """Rewarded held-out trajectories whose ``held_out`` rows do not stand (ix_trajectories_unscored)."""
    # `= true`, `= false` (not `IS`): the form SQLite's planner matches to the partial index.
    return select(Trajectory.pk, Trajectory.id, Trajectory.reward).where(
        Trajectory.eval == true(), Trajectory.reward.is_not(None), Trajectory.scored == false()
    )


def any_unscored(conn: Connection) -> bool:
    return conn.execute(_unscored().with_only_columns(Trajectory.pk).limit(1)).first() is not None


def settle_unscored(conn: Connection, limit: int = SETTLE_BATCH) -> None:
    """Settle what later calls unsettled (the trainer's poll; rows another transaction holds wait)."""
    pks = list(conn.execute(_unscored().with_only_columns(Trajectory.pk).order_by(Trajectory.pk).limit(limit).with_for_update(skip_locked=True)).scalars())
    settle(conn, pks)


def _rows(policy: str | None, last: Collection[int] | None = None) -> Any:
    """(policy, first, last, reward, pk) of each rewarded held-out trajectory (its pk) and policy it called:
    the settled rows that stand (``ix_held_out_version``), then each unsettled trajectory's from
    its calls. One statement, so one snapshot: on PostgreSQL a trajectory settled or unsettled
    between two statements would count twice, or not at all."""
    settled = select(HeldOut.policy, HeldOut.first_step.label("first"), HeldOut.last_step.label("last"), HeldOut.reward, HeldOut.trajectory_pk.label("pk"))
    # The rows of a trajectory a later call unsettled are passed over: its calls say what stands.
    settled = settled.where(HeldOut.trajectory_pk.not_in(_unscored().with_only_columns(Trajectory.pk)))
    unscored = _unscored().subquery()
    if policy is None:  # every policy's (/metrics): grouped by the policies the trajectories called
        fresh = (
            select(Call.policy, func.min(_step()), func.max(_step()), unscored.c.reward, unscored.c.pk)
            .join(unscored, unscored.c.id == Call.trajectory_id)
            .where(Call.status == OK, Call.policy.is_not(None))
            .group_by(unscored.c.pk, Call.policy, unscored.c.reward)
        )
    else:
        # One policy's: each unsettled trajectory's steps looked up among its own calls
        # (ix_calls_trajectory), whatever the planner guesses of how many are unsettled
        # (PostgreSQL, misled by `scored` following `eval`, read all the policy's calls instead).
        settled = settled.where(HeldOut.policy == policy)
        mine = (Call.trajectory_id == unscored.c.id, Call.policy == policy, Call.status == OK)
        steps = select(
            literal(policy, String).label("policy"),
            select(func.min(_step())).where(*mine).scalar_subquery().label("first"),
            select(func.max(_step())).where(*mine).scalar_subquery().label("last"),
            unscored.c.reward,
            unscored.c.pk,
        ).subquery()
        fresh = select(steps).where(steps.c.last.is_not(None))  # it called the policy
    if last is not None:
        settled = settled.where(HeldOut.last_step.in_(last))
    rows = union_all(settled, fresh).subquery()
    return rows if last is None else select(rows).where(rows.c.last.in_(last)).subquery()


def versions(conn: Connection, policy: str, last: Collection[int]) -> list[Version]:
    """The rewarded held-out trajectories whose latest step of ``policy`` is among ``last``."""
    rows = _rows(policy, last)
    return [Version(*row) for row in conn.execute(select(rows.c.first, rows.c.last, rows.c.reward))]


def answered(policy: str, step: int) -> Any:
    """The rewarded held-out trajectories (``_rows``, with their ``pk``) whose latest step of
    ``policy`` is ``step``: the version's own entries, however long the policy's history (the
    dashboard's compare)."""
    return _rows(policy, [step])


def _scores(conn: Connection, policy: str | None) -> dict[tuple[str, int], Score]:
    """(policy, step) -> the held-out score, of one policy or all: an index-only sum of the
    settled rows per version, the few unsettled added."""
    rows = _rows(policy)
    summed = select(rows.c.policy, rows.c.last, func.count(), func.avg(rows.c.reward)).group_by(rows.c.policy, rows.c.last)
    return {(p, step): Score(n, float(mean)) for p, step, n, mean in conn.execute(summed.order_by(rows.c.policy, rows.c.last))}


def scores_by_step(conn: Connection, policy: str) -> dict[int, Score]:
    """The policy's held-out score at each version that has one."""
    return {step: score for (_, step), score in _scores(conn, policy).items()}


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
    for (policy, step), score in _scores(conn, None).items():
        by_policy.setdefault(policy, {})[step] = score
    out: dict[tuple[str, int], Score] = {}
    for policy, scores in by_policy.items():
        keep = {0, served.get(policy, 0), *sorted(scores)[-METRICS_NEWEST:]}
        out |= {(policy, step): score for step, score in scores.items() if step in keep}
    return out
