"""Counts for the gateway's /metrics gauges, read from the store when it is scraped."""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from burnish_server.core.drift import split_totals
from burnish_server.store import evals, groups, promotion
from burnish_server.store.models import Group, PolicyRow, StepRow, Trajectory


def store_state(conn: Connection) -> dict[str, Any]:
    """Counts for the gauges, in a handful of aggregate queries."""
    rewarded = case((Trajectory.reward.is_(None), "unrewarded"), else_="rewarded")
    trajectories = {"rewarded": 0, "unrewarded": 0} | dict(conn.execute(select(rewarded, func.count()).group_by(rewarded)).all())
    # Groups for training only: a held-out group never trains, and would sit in "closed" for good.
    by_state = {
        (p, s): n
        for p, s, n in conn.execute(select(Group.policy, groups.STATE, func.count()).where(Group.eval.is_(False)).group_by(Group.policy, groups.STATE))
    }
    last = select(StepRow.policy, func.max(StepRow.step).label("step"), func.count().label("steps")).group_by(StepRow.policy).subquery()
    rows = conn.execute(select(last.c.policy, last.c.steps, StepRow.metrics).join(StepRow, (StepRow.policy == last.c.policy) & (StepRow.step == last.c.step)))
    steps = {p: (n, (m or {}).get("seconds"), (m or {}).get("reward_mean")) for p, n, m in rows}
    histories: dict[str, list[dict[str, Any]]] = {}
    for policy, metrics in conn.execute(select(StepRow.policy, StepRow.metrics)):
        histories.setdefault(policy, []).append(metrics or {})
    splits = {policy: split_totals(history) for policy, history in histories.items()}
    decisions: dict[tuple[str, str], int] = {}  # every decision made, a promotion later rolled back included
    for policy, made in conn.execute(select(StepRow.policy, StepRow.decisions).where(StepRow.decisions.is_not(None))):
        for record in promotion.decisions(made):
            key = (policy, str(record.decision))
            decisions[key] = decisions.get(key, 0) + 1
    versions = {name: (step, candidate) for name, step, candidate in conn.execute(select(PolicyRow.name, PolicyRow.step, PolicyRow.candidate))}
    return {
        "trajectories": trajectories,
        "groups": by_state,
        "steps": steps,
        "evals": evals.for_metrics(conn),
        "splits": splits,
        "decisions": decisions,
        "versions": versions,
    }
