"""A policy's versions in the store: every write of its head, its served step, its candidate and
the decisions on its steps' rows.

What may move, and where to, is ``core/learning/promotion.py``'s (``recorded``, ``served``, ``on_trial``,
``decided``, ``rolled_back``, ``admin_rolled_back``): each function here locks the policy's row,
reads where its versions stand, asks the transition, and writes what it returns in the same
transaction. The trainer's stepper, publisher and promoter and the admin API write versions
through this module alone.

Sync functions of a ``Connection``, run with ``Database.transaction`` (``Database.read`` for
``publishing``). Each returns whether it moved anything: one that finds the versions moved
meanwhile (a rollback, another decision) writes nothing, and what came first stands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from burnish_server.core.learning.lone import Baseline
from burnish_server.core.learning.policies import Policy
from burnish_server.core.learning.promotion import (
    Comparison,
    DecisionRecord,
    Move,
    Outcome,
    Publishing,
    Versions,
    admin_rolled_back,
    decided,
    on_trial,
    publishing,
    recorded,
    rolled_back,
    served,
)
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import Conflict, NotFound
from burnish_server.store.baselines import keep_baselines
from burnish_server.store.models import PolicyRow, StepRow
from burnish_server.store.promotion import evidence
from burnish_server.store.training import complete_groups


def versions(conn: Connection, name: str) -> Versions | None:
    """Where the policy's versions stand, its row held until the transaction ends (PostgreSQL's
    row lock; SQLite's writer lock already holds it). None for no such policy."""
    row = conn.execute(select(PolicyRow.head, PolicyRow.step, PolicyRow.candidate).where(PolicyRow.name == name).with_for_update()).one_or_none()
    return None if row is None else Versions(head=row.head, step=row.step, candidate=row.candidate)


def _move(conn: Connection, name: str, transition: Callable[[Versions], Move | None], **values: Any) -> bool:
    """Read where the policy's versions stand, ask ``transition``, and write what it returns
    (``_write``). Whether anything moved."""
    now = versions(conn, name)
    move = None if now is None else transition(now)
    return move is not None and _write(conn, name, move, **values)


def _write(conn: Connection, name: str, move: Move, **values: Any) -> bool:
    """Write a move's versions (with ``values``, columns that go with it; a candidate gone takes
    its ``candidate_since`` with it) and its decisions."""
    after = move.versions
    if after.candidate is None:
        values.setdefault("candidate_since", None)
    conn.execute(
        update(PolicyRow).where(PolicyRow.name == name).values(head=after.head, step=after.step, candidate=after.candidate, updated_at=utcnow(), **values)
    )
    for step, record in move.decisions:
        note(conn, name, step, record)
    return True


def _published(conn: Connection, name: str, step: int, seconds: float | None) -> None:
    conn.execute(
        update(StepRow)
        .where(StepRow.policy == name, StepRow.step == step, StepRow.published_at.is_(None))
        .values(published_at=utcnow(), publish_seconds=seconds)
    )


# ---- the trainer's side -------------------------------------------------------------


def record_step(
    conn: Connection,
    name: str,
    step: int,
    parent: int,
    groups: list[str],
    worker: str,
    metrics: StepMetrics,
    checkpoint: str,
    baselines: Mapping[str, Baseline] | None = None,
) -> bool:
    """The commit point of a step: its groups are trained, its row exists, its lone attempts'
    baselines are moved (store/baselines.py), and it becomes the head (``recorded``). Returns
    whether it became the head."""
    complete_groups(conn, groups, worker, step)
    keep_baselines(conn, name, baselines or {})
    metrics = msgspec.structs.replace(metrics, groups=len(groups))  # what the status counts as trained
    conn.execute(
        insert(StepRow).values(
            policy=name, step=step, parent=parent, groups=groups, metrics=msgspec.to_builtins(metrics), checkpoint=checkpoint, trainer=worker
        )
    )
    return _move(conn, name, lambda now: recorded(now, parent, step), train_requested_at=None)


def publishing_of(conn: Connection, policy: Policy) -> Publishing:
    """How the policy's head is published (``core/learning/promotion.py: publishing``), by its step's row."""
    row = conn.execute(select(StepRow.decision, StepRow.published_at).where(StepRow.policy == policy.name, StepRow.step == policy.head)).one_or_none()
    decision = None if row is None or row.decision is None else Outcome(row.decision)
    return publishing(policy.promotion, policy.head, decision, row is not None and row.published_at is not None)


def mark_served(conn: Connection, name: str, step: int, seconds: float | None) -> bool:
    """vLLM serves ``step``, loaded and checked: it is the served version (``served``)."""
    moved = _move(conn, name, lambda now: served(now, step), load_error=None, load_error_at=None)
    _published(conn, name, step, seconds)
    return moved


def mark_candidate(conn: Connection, name: str, step: int, seconds: float | None) -> bool:
    """vLLM serves ``step``, loaded and checked, as the candidate: its trial begins (``on_trial``)."""
    moved = _move(
        conn,
        name,
        lambda now: on_trial(now, step),
        candidate_since=utcnow(),
        candidate_test=None,
        candidate_tested_at=None,
        load_error=None,
    )
    _published(conn, name, step, seconds)
    return moved


def mark_load_error(conn: Connection, name: str, error: str) -> None:
    """The head could not be served: why, for the status (the served version stays)."""
    conn.execute(update(PolicyRow).where(PolicyRow.name == name).values(load_error=error[:2000], load_error_at=utcnow()))


def record_test(conn: Connection, name: str, step: int, test: Comparison) -> None:
    """Keep the canary ``step``'s test as the trainer just read it (the status shows it), if
    ``step`` is still on trial."""
    values = {"candidate_test": msgspec.to_builtins(test), "candidate_tested_at": utcnow()}
    conn.execute(update(PolicyRow).where(PolicyRow.name == name, PolicyRow.candidate == step).values(values))


def decide(conn: Connection, policy: Policy, step: int, record: DecisionRecord) -> bool:
    """End ``step``'s trial as ``record`` says (``decided``)."""
    return _move(conn, policy.name, lambda now: decided(now, policy.promotion, step, record))


def roll_back(conn: Connection, policy: Policy, to: int, record: DecisionRecord) -> bool:
    """The served version regressed: serve ``to`` again (``rolled_back``)."""
    seen = Versions(head=policy.head, step=policy.step, candidate=policy.candidate)
    return _move(conn, policy.name, lambda now: rolled_back(now, seen, to, record))


# ---- the admin's side ---------------------------------------------------------------


def admin_decide(conn: Connection, policy: Policy, decision: Outcome) -> None:
    """An admin promotes or rejects the candidate, with the evidence as it stands."""
    if policy.candidate is None:
        raise Conflict(f"policy {policy.name!r} has no candidate on trial", "no_candidate")
    record = DecisionRecord(decision=decision, by="admin", reason=f"{decision} by an admin", test=evidence(conn, policy))
    decide(conn, policy, policy.candidate, record)


def request_rollback(conn: Connection, name: str, step: int) -> None:
    """Make ``step`` the version to serve and to train from (``admin_rolled_back``); the trainer
    loads it and switches. A new intent: an error from loading the version it replaces no
    longer applies."""
    now = versions(conn, name)
    if now is None:
        raise NotFound(f"no policy {name!r}", "policy_not_found", "name")
    target = conn.execute(select(StepRow.decision).where(StepRow.policy == name, StepRow.step == step)).one_or_none()
    if step != 0 and target is None:
        raise NotFound(f"policy {name!r} has no checkpoint at step {step}", "checkpoint_not_found", "step")
    decision = None if target is None or target.decision is None else Outcome(target.decision)
    _write(conn, name, admin_rolled_back(now, step, decision), load_error=None, load_error_at=None)


def note(conn: Connection, policy: str, step: int, record: DecisionRecord) -> None:
    """Write a decision on the step's row: the latest, and added to its list."""
    now = record.decided_at or utcnow()
    earlier = conn.execute(select(StepRow.decisions).where(StepRow.policy == policy, StepRow.step == step)).scalar() or []
    entry = msgspec.to_builtins(msgspec.structs.replace(record, decided_at=now))
    conn.execute(
        update(StepRow).where(StepRow.policy == policy, StepRow.step == step).values(decision=record.decision, decided_at=now, decisions=[*earlier, entry])
    )
