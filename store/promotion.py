"""Candidates in the store: the samples a trial reads, and the decisions that end it.

A step trained under a promotion rule that tries it first (``PromotionSettings.trials``) is
published to vLLM as the policy's *candidate* (``mark_candidate``); the trainer's ``Promoter``
(``trainer/promoter.py``) tests it against the served version on each pass (``trial_samples``
here, then ``core/promotion.py: trial``) and ``decide`` promotes it (it becomes the served
version) or rejects it (the served version stays; the next step trains from the served version
or from the candidate, as the policy says). An admin may decide at any time
(``admin_decide``). Every decision is written on the step's row as a ``DecisionRecord``, so the
step list, the metrics history and the status show it. This module reads samples and writes
records; what they mean is ``core/promotion.py``'s.

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
from sqlalchemy import case, func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import aliased

from burnish_server.core.errors import Conflict
from burnish_server.core.policies import Policy
from burnish_server.core.promotion import Comparison, DecisionRecord, Outcome, Sample, trial
from burnish_server.core.records import OK
from burnish_server.store import evals
from burnish_server.store.models import Call, PolicyRow, StepRow, Trajectory, utcnow

# The rollback watch reads a version's newest calls this many windows at a time, then this many
# times more while the window is not full (``_latest``): a trajectory makes a few calls.
READ_AHEAD = 4


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
        rows = rows.where(versions.c.step.in_(steps), Trajectory.reward.is_not(None))
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
    before, now = (_latest(conn, policy.name, step, rule.rollback_window) for step in (row.parent, policy.step))
    return row.parent, before, now


def _latest(conn: Connection, policy: str, step: int, window: int) -> Sample:
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
        .where(Call.policy == policy, Call.policy_step == step, Call.status == OK, Trajectory.reward.is_not(None), ~other)
        .order_by(Call.started_at.desc())
    )
    rows = READ_AHEAD * window
    while True:
        found = conn.execute(newest.limit(rows)).all()
        rewards = list({row.id: float(row.reward) for row in found}.values())  # each trajectory once, where its newest call puts it
        if len(rewards) >= window or len(found) < rows:
            return Sample.of(rewards[:window])
        rows *= READ_AHEAD


def record_test(conn: Connection, name: str, step: int, test: Comparison) -> None:
    """Keep the canary ``step``'s test as the trainer just read it (the status shows it), if
    ``step`` is still on trial."""
    values = {"candidate_test": msgspec.to_builtins(test), "candidate_tested_at": utcnow()}
    conn.execute(update(PolicyRow).where(PolicyRow.name == name, PolicyRow.candidate == step).values(values))


def shown_test(conn: Connection, policy: Policy, tested: Any, tested_at: datetime | None) -> tuple[Comparison | None, datetime | None]:
    """The candidate's test as the status shows it, and when it was read. A canary's as the
    trainer last read it (``record_test``, every ``trainer_review_every`` seconds): its trial
    costs what it served, up to ``max_trajectories`` over the canary's share. An eval trial's
    (an index-only read of the two versions' held-out entries) and a canary's before the
    trainer's first read, as they stand."""
    if tested_at is not None and policy.promotion.canary:
        return msgspec.convert(tested, Comparison), tested_at
    test = evidence(conn, policy)
    return test, None if test is None else utcnow()


def mark_candidate(conn: Connection, name: str, step: int, seconds: float | None) -> None:
    """vLLM serves ``step`` (loaded and checked): its trial begins, if it is still the head."""
    now = utcnow()
    conn.execute(
        update(PolicyRow)
        .where(PolicyRow.name == name, PolicyRow.head == step)
        .values(candidate=step, candidate_since=now, candidate_test=None, candidate_tested_at=None, load_error=None, updated_at=now)
    )
    conn.execute(
        update(StepRow).where(StepRow.policy == name, StepRow.step == step, StepRow.published_at.is_(None)).values(published_at=now, publish_seconds=seconds)
    )


def decide(conn: Connection, policy: Policy, step: int, record: DecisionRecord) -> bool:
    """End ``step``'s trial: promoted (it serves) or rejected (the served version stays; the
    head goes back to it unless the policy trains from candidates). Only if it is still the
    candidate: a decision made elsewhere meanwhile stands. Returns whether this one was made."""
    now = utcnow()
    values: dict[str, Any] = {"candidate": None, "candidate_since": None, "updated_at": now}
    if record.decision == Outcome.PROMOTED:
        values["step"] = step
    elif policy.promotion.train_from == "served":
        values["head"] = PolicyRow.step
    moved = conn.execute(update(PolicyRow).where(PolicyRow.name == policy.name, PolicyRow.candidate == step).values(**values)).rowcount
    if moved:
        note(conn, policy.name, step, record)
    return bool(moved)


def note(conn: Connection, policy: str, step: int, record: DecisionRecord) -> None:
    """Write a decision on the step's row: the latest, and added to its list."""
    now = record.decided_at or utcnow()
    earlier = conn.execute(select(StepRow.decisions).where(StepRow.policy == policy, StepRow.step == step)).scalar() or []
    entry = msgspec.to_builtins(msgspec.structs.replace(record, decided_at=now))
    conn.execute(
        update(StepRow).where(StepRow.policy == policy, StepRow.step == step).values(decision=record.decision, decided_at=now, decisions=[*earlier, entry])
    )


def decisions(stored: list[dict[str, Any]] | None) -> list[DecisionRecord]:
    """A step row's decisions, as written by ``note``."""
    return msgspec.convert(stored or [], list[DecisionRecord], strict=False)  # strict=False: decided_at is an ISO string in JSON


def admin_decide(conn: Connection, policy: Policy, decision: Outcome) -> None:
    """An admin promotes or rejects the candidate, with the evidence as it stands."""
    if policy.candidate is None:
        raise Conflict(f"policy {policy.name!r} has no candidate on trial", "no_candidate")
    record = DecisionRecord(decision=decision, by="admin", reason=f"{decision} by an admin", test=evidence(conn, policy))
    decide(conn, policy, policy.candidate, record)


def roll_back(conn: Connection, policy: Policy, to: int, record: DecisionRecord) -> bool:
    """The served version regressed: serve ``to`` again (the trainer loads it) and say why."""
    now = utcnow()
    moved = conn.execute(
        update(PolicyRow).where(PolicyRow.name == policy.name, PolicyRow.step == policy.step, PolicyRow.head == policy.head).values(head=to, updated_at=now)
    ).rowcount
    if moved:
        note(conn, policy.name, policy.step, record)
    return bool(moved)


def goes_on_trial(conn: Connection, policy: Policy) -> bool | None:
    """How the policy's head is published: on trial as the candidate (True), served outright
    (False), or not at all (None: a rejected candidate kept only to train from). A step goes
    on trial under a rule that tries steps when it never served nor was decided; a
    version served before (a rollback's target, the base model) serves outright."""
    if policy.head == 0:
        return False
    row = conn.execute(select(StepRow.decision, StepRow.published_at).where(StepRow.policy == policy.name, StepRow.step == policy.head)).one_or_none()
    if row is not None and row.decision == Outcome.REJECTED:
        return None
    fresh = row is None or (row.decision is None and row.published_at is None)
    return policy.promotion.trials and fresh
