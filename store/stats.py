"""Counts for the gateway's /metrics gauges, read from the store when it is scraped."""

from __future__ import annotations

import msgspec
from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from burnish_server.core.learning.steps import StepMetrics, split_totals
from burnish_server.store import evals, groups, promotion
from burnish_server.store.evals import Score
from burnish_server.store.models import Group, PolicyRow, StepRow, Trajectory


class LastStep(msgspec.Struct, frozen=True):
    """A policy's steps so far, and its newest step's duration and train reward."""

    steps: int
    seconds: float | None
    reward: float | None


class Versions(msgspec.Struct, frozen=True):
    served: int
    candidate: int | None  # the step on trial, if any


class StoreState(msgspec.Struct, kw_only=True):
    """The store as the gauges show it (gateway/edge/metrics.py)."""

    trajectories: dict[str, int]  # rewarded / unrewarded
    groups: dict[tuple[str | None, str], int]  # (policy, state) -> groups trained on (held-out apart)
    steps: dict[str, LastStep]
    evals: dict[tuple[str, int], Score]  # (policy, step) -> held-out score
    splits: dict[str, dict[str, int]]  # policy -> reason -> calls split
    decisions: dict[tuple[str, str], int]  # (policy, outcome) -> decisions made
    versions: dict[str, Versions]


def store_state(conn: Connection) -> StoreState:
    """Counts for the gauges, in a handful of aggregate queries."""
    rewarded = case((Trajectory.reward.is_(None), "unrewarded"), else_="rewarded")
    trajectories = {"rewarded": 0, "unrewarded": 0} | dict(conn.execute(select(rewarded, func.count()).group_by(rewarded)).all())
    # Groups for training only: a held-out group never trains, and would sit in "closed" for good.
    by_state = {
        (p, s): n
        for p, s, n in conn.execute(select(Group.policy, groups.STATE, func.count()).where(Group.eval.is_(False)).group_by(Group.policy, groups.STATE))
    }
    last = select(StepRow.policy, func.max(StepRow.step).label("step"), func.count().label("steps")).group_by(StepRow.policy).subquery()
    steps: dict[str, LastStep] = {}
    for policy, n, stored in conn.execute(
        select(last.c.policy, last.c.steps, StepRow.metrics).join(StepRow, (StepRow.policy == last.c.policy) & (StepRow.step == last.c.step))
    ):
        metrics = StepMetrics.read(stored)
        steps[policy] = LastStep(n, metrics.seconds, metrics.reward_mean)
    histories: dict[str, list[StepMetrics]] = {}
    for policy, stored in conn.execute(select(StepRow.policy, StepRow.metrics)):
        histories.setdefault(policy, []).append(StepMetrics.read(stored))
    decisions: dict[tuple[str, str], int] = {}  # every decision made, a promotion later rolled back included
    for policy, made in conn.execute(select(StepRow.policy, StepRow.decisions).where(StepRow.decisions.is_not(None))):
        for record in promotion.decisions(made):
            key = (policy, str(record.decision))
            decisions[key] = decisions.get(key, 0) + 1
    return StoreState(
        trajectories=trajectories,
        groups=by_state,
        steps=steps,
        evals=evals.for_metrics(conn),
        splits={policy: split_totals(history) for policy, history in histories.items()},
        decisions=decisions,
        versions={name: Versions(step, candidate) for name, step, candidate in conn.execute(select(PolicyRow.name, PolicyRow.step, PolicyRow.candidate))},
    )
