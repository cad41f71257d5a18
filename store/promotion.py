"""Candidates in the store: the samples a trial and the rollback watch read.

A step trained under a promotion rule that tries it first (``PromotionSettings.trials``) is
published to vLLM as the policy's *candidate*; the trainer's ``Promoter``
(``trainer/promoter.py``) tests it against the served version on each pass (``trial_samples``
here, then ``core/learning/promotion.py: trial``) and promotes or rejects it through
``store/versions.py``, which writes every decision on the step's row as a ``DecisionRecord``.
This module only reads; what the samples mean is ``core/learning/promotion.py``'s.

A trajectory's *version* is the step that answered its ok calls to the policy; one whose calls
span versions counts for neither. Under ``canary`` both sides count the trajectories begun
since the candidate went live (the same days, the same traffic: a fair comparison); under
``eval`` only held-out trajectories count, the candidate's (pinned to it) against the served
version's.

These are sync functions of a ``Connection``, run with ``Database.read`` or ``.transaction``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import case, exists, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import aliased

from burnish_server.core.learning.followups import SOURCE as JUDGED
from burnish_server.core.learning.policies import Policy
from burnish_server.core.learning.promotion import Comparison, DecisionRecord, Outcome, Sample, trial
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.protocols.records import OK
from burnish_server.store import evals
from burnish_server.store.models import Call, Reward, StepRow, Trajectory

# The rollback watch reads a version's newest calls this many windows at a time, then this many
# times more while the window is not full (``latest_sample``): a trajectory makes a few calls.
READ_AHEAD = 4


def verdict() -> Any:
    """Over ``Trajectory``: its reward is a verdict, not the next-message judge's (core/learning/followups.py:
    SOURCE, its newest trajectory reward's source). A trial and the rollback watch read verdicts
    alone: the judge taught the candidate, and would vouch for it."""
    mine, newer = aliased(Reward), aliased(Reward)
    judged = exists().where(
        mine.trajectory_id == Trajectory.id,
        mine.call_pk.is_(None),
        mine.source == JUDGED,
        ~exists().where(newer.trajectory_id == mine.trajectory_id, newer.call_pk.is_(None), newer.pk > mine.pk),
    )
    return ~judged


def _one_step() -> Any:
    """Over a trajectory's calls (an aggregate): the step that answered all of them, or NULL."""
    return case((func.min(Call.policy_step) == func.max(Call.policy_step), func.max(Call.policy_step)))


def samples(conn: Connection, policy: str, steps: list[int], *, since: datetime | None = None, held_out: bool = False) -> dict[int, Sample]:
    """Rewarded trajectories per version among ``steps``: count, mean and variance of rewards.

    With ``since`` (a canary's trial), what every version of the policy served since then, read
    in one pass of ``ix_calls_version`` (a range per step) and grouped by trajectory: the cost
    follows the trial, not the policy's history. Else the held-out trajectories the versions
    answered alone, as settled (``store/evals.py``): the versions' own entries."""
    if since is not None:
        # Steps are numbered from 0 and never deleted: these are all the versions that can have served.
        top = conn.execute(select(func.max(StepRow.step)).where(StepRow.policy == policy)).scalar() or 0
        versions = (
            select(Call.trajectory_id.label("id"), _one_step().label("step"))
            .where(Call.policy == policy, Call.policy_step.in_(range(max(top, *steps) + 1)), Call.started_at >= since, Call.status == OK)
            .group_by(Call.trajectory_id)
            .subquery()
        )
        rows = select(versions.c.step, Trajectory.reward).join(Trajectory, Trajectory.id == versions.c.id)
        rows = rows.where(versions.c.step.in_(steps), Trajectory.reward.is_not(None), verdict())
        found = [(row.step, row.reward) for row in conn.execute(rows)]
    else:
        assert held_out, "a trial reads the traffic since it began, or the held-out set"
        found = [(v.last, v.reward) for v in evals.versions(conn, policy, steps) if v.first == v.last]
    rewards: dict[int, list[float]] = {step: [] for step in steps}
    for step, reward in found:
        if step in rewards:
            rewards[step].append(float(reward))
    return {step: Sample.of(found_rewards) for step, found_rewards in rewards.items()}


def trial_samples(conn: Connection, policy: Policy) -> tuple[Sample, Sample] | None:
    """The served version's and the candidate's rewarded trajectories, as the rule compares
    them (None without a candidate, or under a rule no test decides)."""
    rule = policy.promotion
    if policy.candidate is None or not rule.tested:
        return None
    steps = [policy.step, policy.candidate]
    found = samples(conn, policy.name, steps, since=policy.candidate_since) if rule.canary else samples(conn, policy.name, steps, held_out=True)
    return found[policy.step], found[policy.candidate]


def evidence(conn: Connection, policy: Policy) -> Comparison | None:
    """The candidate's test as it stands (the status shows it; an admin's decision records it)."""
    found = trial_samples(conn, policy)
    return None if found is None else trial(policy.promotion, *found)


def regression_samples(conn: Connection, policy: Policy) -> tuple[int, Sample, Sample] | None:
    """What the rollback test reads: the version the served one replaced, and the latest
    ``rollback_window`` rewarded trajectories of each (None where nothing is watched)."""
    rule = policy.promotion
    if not rule.watched or policy.step == 0 or policy.head != policy.step:
        return None
    # Only a version that won its trial, and whose promotion is the policy's latest decision:
    # after a rollback, the version served again is not itself compared with its own parent.
    row = conn.execute(
        select(StepRow.step, StepRow.parent, StepRow.decision)
        .where(StepRow.policy == policy.name, StepRow.decision.is_not(None))
        .order_by(StepRow.decided_at.desc(), StepRow.pk.desc())
        .limit(1)
    ).one_or_none()
    if row is None or row.step != policy.step or row.decision != Outcome.PROMOTED:
        return None
    before, now = (latest_sample(conn, policy.name, step, rule.rollback_window) for step in (row.parent, policy.step))
    return row.parent, before, now


def latest_sample(conn: Connection, policy: str, step: int, window: int) -> Sample:
    """The newest ``window`` rewarded trajectories that version ``step`` alone answered, newest
    by their calls. The version's calls are walked newest first (``ix_calls_version``), each
    call's trajectory checked (rewarded, and no other version's call among its own), until the
    window is full: its cost follows the window, not the version's history. A trajectory of
    several calls comes up once per call, hence the read ahead."""
    mine = aliased(Call)  # the trajectory's own calls, apart from the version's call that found it
    other = select(mine.pk).where(mine.trajectory_id == Trajectory.id, mine.policy == policy, mine.status == OK, mine.policy_step != step).exists()
    newest = (
        select(Trajectory.id, Trajectory.reward)
        .join(Call, Call.trajectory_id == Trajectory.id)
        .where(Call.policy == policy, Call.policy_step == step, Call.status == OK, Trajectory.reward.is_not(None), ~other, verdict())
        .order_by(Call.started_at.desc())
    )
    rows = READ_AHEAD * window
    while True:
        found = conn.execute(newest.limit(rows)).all()
        rewards = list({row.id: float(row.reward) for row in found}.values())  # each trajectory once, where its newest call puts it
        if len(rewards) >= window or len(found) < rows:
            return Sample.of(rewards[:window])
        rows *= READ_AHEAD


def shown_test(conn: Connection, policy: Policy, tested: Any, tested_at: datetime | None) -> tuple[Comparison | None, datetime | None]:
    """The candidate's test as the status shows it, and when it was read. A canary's as the
    trainer last read it (``store/versions.py: record_test``, every ``trainer_review_every`` seconds): its trial
    costs what it served, up to ``max_trajectories`` over the canary's share. An eval trial's
    (an index-only read of the two versions' held-out entries) and a canary's before the
    trainer's first read, as they stand."""
    if tested_at is not None and policy.promotion.canary:
        return msgspec.convert(tested, Comparison), tested_at
    test = evidence(conn, policy)
    return test, None if test is None else utcnow()


def decisions(stored: list[dict[str, Any]] | None) -> list[DecisionRecord]:
    """A step row's decisions, as written by ``store/versions.py: note``."""
    return msgspec.convert(stored or [], list[DecisionRecord], strict=False)  # strict=False: decided_at is an ISO string in JSON
