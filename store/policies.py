"""Policies and training steps in the store: what the admin API writes and the trainer advances.

The admin API states intent (create, change, pause, train now, roll back); the trainer
acts on it (trains, loads adapters into vLLM, switches the served step). Both go through
these functions, which are sync functions of a ``Connection`` (``Database.transaction``
for writes, ``Database.read`` for reads). A check that fails raises a domain error
(``NotFound``, ``Conflict``) and changes nothing.

A policy's versions (its head, served step and candidate) and the decisions on its steps are
written by ``store/versions.py`` alone.
"""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Connection

from burnish_server.core.api.views import CandidateView, LoneView, PolicyView, ReplicaView, StepView
from burnish_server.core.learning.groups import FOLLOWED
from burnish_server.core.learning.health import RecentGroups, health
from burnish_server.core.learning.policies import (
    LoraSettings,
    Policy,
    PromotionSettings,
    RulerSettings,
    ServingSettings,
    TrainSettings,
    settings_conflicts,
)
from burnish_server.core.learning.promotion import Outcome
from burnish_server.core.learning.steps import StepMetrics, split_totals
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import Conflict, NotFound
from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.protocols.records import DEMONSTRATION
from burnish_server.store import groups, promotion
from burnish_server.store.evals import eval_scores
from burnish_server.store.lone import lone_counts
from burnish_server.store.models import Group, PolicyRow, StepRow, iso
from burnish_server.store.training import count_ready, credited, group_members, training_rules


def to_policy(row: Any) -> Policy:
    return Policy(
        name=row.name,
        base_model=row.base_model,
        model_path=row.model_path,
        lora=msgspec.convert(row.lora, LoraSettings),
        train=msgspec.convert(row.train, TrainSettings),
        ruler=msgspec.convert(row.ruler or {}, RulerSettings),
        promotion=msgspec.convert(row.promotion or {}, PromotionSettings),
        serving=msgspec.convert(row.serving or {}, ServingSettings),
        project=row.project,
        shared_with=tuple(row.shared_with or ()),
        paused=row.paused,
        step=row.step,
        head=row.head,
        candidate=row.candidate,
        candidate_since=row.candidate_since,
        train_requested_at=row.train_requested_at,
        load_error=row.load_error,
    )


def load_policies(conn: Connection) -> list[Policy]:
    return [to_policy(row) for row in conn.execute(select(PolicyRow).order_by(PolicyRow.pk))]


def _find(conn: Connection, name: str) -> Any | None:
    return conn.execute(select(PolicyRow).where(PolicyRow.name == name)).one_or_none()


def _row(conn: Connection, name: str) -> Any:
    row = _find(conn, name)
    if row is None:
        raise NotFound(f"no policy {name!r}", "policy_not_found", "name")
    return row


def get_policy(conn: Connection, name: str) -> Policy:
    return to_policy(_row(conn, name))


def lock_policy(conn: Connection, name: str) -> None:
    """Hold the policy's row until the transaction ends (PostgreSQL; SQLite's writer lock already does)."""
    conn.execute(select(PolicyRow.pk).where(PolicyRow.name == name).with_for_update())


def create_policy(conn: Connection, policy: Policy) -> Policy:
    if conn.execute(select(PolicyRow.pk).where(PolicyRow.name == policy.name)).first() is not None:
        raise Conflict(f"policy {policy.name!r} exists; PATCH it to change its settings", "policy_exists", "name")
    conn.execute(
        insert(PolicyRow).values(
            name=policy.name,
            base_model=policy.base_model,
            model_path=policy.model_path,
            lora=msgspec.to_builtins(policy.lora),
            train=msgspec.to_builtins(policy.train),
            ruler=msgspec.to_builtins(policy.ruler),
            promotion=msgspec.to_builtins(policy.promotion),
            serving=msgspec.to_builtins(policy.serving),
            project=policy.project,
            shared_with=list(policy.shared_with),
            paused=policy.paused,
            step=0,
            head=0,
        )
    )
    return get_policy(conn, policy.name)


def ensure_policy(conn: Connection, policy: Policy) -> Policy:
    """Create the policy unless one of that name exists; return the stored one."""
    row = _find(conn, policy.name)
    return to_policy(row) if row is not None else create_policy(conn, policy)


def update_policy(conn: Connection, name: str, **values: Any) -> Policy:
    """Change a policy's columns (settings structs are stored as JSON)."""
    current = get_policy(conn, name)
    in_flight = conn.execute(select(Group.pk).where(Group.policy == name, groups.is_training()).limit(1)).first()
    trained = current.head > 0 or last_step(conn, name) > 0 or in_flight is not None
    if trained and any(key in values and values[key] != getattr(current, key) for key in ("base_model", "model_path", "lora")):
        # The checkpoints were trained on this base with this adapter shape.
        raise Conflict("base_model, model_path and lora cannot change once a policy has trained (or is training); create a new policy", "policy_trained")
    values = {k: msgspec.to_builtins(v) if isinstance(v, msgspec.Struct | tuple) else v for k, v in values.items()}
    if "promotion" in values and values["promotion"] != msgspec.to_builtins(current.promotion):
        values |= {"candidate_test": None, "candidate_tested_at": None}  # read under the old rule
    conn.execute(update(PolicyRow).where(PolicyRow.name == name).values(**values, updated_at=utcnow()))
    return get_policy(conn, name)


def request_training(conn: Connection, name: str) -> int:
    """Ask the trainer to train now on the ready groups, even fewer than groups_per_step."""
    get_policy(conn, name)
    ready = count_ready(conn, name)
    if ready == 0:
        raise Conflict(f"policy {name!r} has no ready groups (closed; on GRPO alone, every member rewarded and rewards not all equal)", "no_ready_groups")
    conn.execute(update(PolicyRow).where(PolicyRow.name == name).values(train_requested_at=utcnow(), updated_at=utcnow()))
    return ready


# ---- the trainer's side -------------------------------------------------------------


def last_step(conn: Connection, name: str) -> int:
    """The newest step ever trained: the next one is numbered after it, whatever was rolled back."""
    return conn.execute(select(func.max(StepRow.step)).where(StepRow.policy == name)).scalar() or 0


def clear_training_request(conn: Connection, name: str) -> None:
    conn.execute(update(PolicyRow).where(PolicyRow.name == name).values(train_requested_at=None))


def mark_replicas(conn: Connection, name: str, replicas: list[ReplicaView]) -> None:
    """Where each vLLM replica stands for the policy (the trainer writes it when it changes)."""
    conn.execute(update(PolicyRow).where(PolicyRow.name == name).values(replicas=msgspec.to_builtins(replicas)))


# ---- reads for the admin API --------------------------------------------------------


def step_view(row: Any, served: int) -> StepView:
    return StepView(
        step=row.step,
        parent=row.parent,
        created_at=iso(row.created_at),
        published_at=iso(row.published_at),
        publish_seconds=row.publish_seconds,
        serving=row.step == served,
        groups=row.groups,
        checkpoint=row.checkpoint,
        trainer=row.trainer,
        metrics=StepMetrics.read(row.metrics),
        decision=None if row.decision is None else Outcome(row.decision),
        decided_at=iso(row.decided_at),
        decisions=promotion.decisions(row.decisions),
    )


def list_steps(conn: Connection, name: str, limit: int | None = None) -> list[StepView]:
    policy = get_policy(conn, name)
    query = select(StepRow).where(StepRow.policy == name).order_by(StepRow.step.desc())
    rows = list(conn.execute(query.limit(limit) if limit else query))
    return [step_view(row, policy.step) for row in reversed(rows)]


# Closed groups the health report reads for ties (core/learning/health.py).
RECENT_GROUPS = 16


def recent_groups(conn: Connection, policy: str, last: int = RECENT_GROUPS) -> RecentGroups:
    """The policy's ``last`` closed groups (held-out ones apart, and any with a held-out member
    left out of the count): how many tied, as readiness
    sees it (``store/training.py: ready_groups``): every trajectory rewarded alike and no
    call's credit to train on; and how many can never train for want of a reward or of a
    second member (core/learning/groups.py: cannot_train)."""
    closed = (
        select(Group.id)
        .where(
            Group.policy == policy,
            Group.eval.is_(False),
            Group.closed_at.is_not(None),
            Group.close_reason != DEMONSTRATION,  # posted, not sampled: no reward to tie or lack
        )
        .order_by(Group.closed_at.desc(), Group.pk.desc())
        .limit(last)
    )
    # Those groups from ix_groups_policy_closed, and their members alone (ix_trajectories_group_members).
    members = group_members(closed)
    rows = conn.execute(
        select(members.c.size, members.c.rewarded, members.c.low, members.c.high, credited(members.c.group_id), Group.close_reason)
        .join(Group, Group.id == members.c.group_id)
        .where(members.c.held_out == 0)
    ).all()
    rules = training_rules(conn, policy)
    # A lone attempt its follow-up completed trains without a reward where the teacher learns from it.
    rewarded = [r for r in rows if r.size == r.rewarded or (rules.followed and r.close_reason == FOLLOWED)]
    tied = [r.low for r in rewarded if r.size == r.rewarded and r.low == r.high and not r[4] and r.size > 1]
    objective = rules.objective
    if not objective.needs_rewards:  # a policy that distills trains on every closed group
        return RecentGroups(groups=len(rows), tied=0)
    if not objective.needs_spread:  # with SFT, a tie trains too
        tied = []
    return RecentGroups(
        groups=len(rows),
        tied=len(tied),
        tied_reward=sum(tied) / len(tied) if tied else None,
        unrewarded=len(rows) - len(rewarded),
        lone=sum(1 for r in rewarded if r.size == 1 and not r[4]) if objective.needs_spread and not rules.lone else 0,
    )


def _candidate(conn: Connection, policy: Policy, row: Any) -> CandidateView | None:
    if policy.candidate is None:
        return None
    test, tested_at = promotion.shown_test(conn, policy, row.candidate_test, row.candidate_tested_at)
    return CandidateView(
        step=policy.candidate,
        version=adapter_name(policy.name, policy.candidate),
        since=iso(policy.candidate_since),
        rule=policy.promotion.rule,
        share=policy.promotion.canary_share if policy.promotion.canary else None,
        test=test,
        tested_at=iso(tested_at),
    )


def policy_status(conn: Connection, name: str) -> PolicyView:
    """A policy's settings and where it stands: served and head step, groups waiting, last metrics."""
    row = _row(conn, name)
    policy = to_policy(row)
    last = list_steps(conn, name, limit=1)
    # Every step's metrics, oldest first: the splits by reason and the run's health are read from them.
    history = [StepMetrics.read(m) for m in conn.execute(select(StepRow.metrics).where(StepRow.policy == name).order_by(StepRow.step)).scalars()]
    # Held-out groups apart: they never wait for training, whatever their state.
    counted = groups.counts(conn, name)
    lone = lone_counts(conn, name, policy.train.group_idle_close_s, utcnow())
    return PolicyView(
        name=policy.name,
        base_model=policy.base_model,
        model_path=policy.model_path,
        lora=policy.lora,
        train=policy.train,
        ruler=policy.ruler,
        paused=policy.paused,
        promotion=policy.promotion,
        serving=policy.serving,
        project=policy.project,
        shared_with=list(policy.shared_with),
        step=policy.step,
        head=policy.head,
        candidate=_candidate(conn, policy, row),
        served_version=adapter_name(name, policy.step),
        pending_version=adapter_name(name, policy.head) if policy.head != policy.step else None,
        groups_ready=count_ready(conn, name),
        ties_train=not policy.train.readiness.needs_spread,
        groups_open=counted.open,
        # Each step's own count of the groups it trained (record_step), not the groups' rows: the
        # history the status reads anyway, and groups pruned since still count.
        groups_trained=sum(m.groups for m in history),
        groups_closed=counted.closed,
        groups_eval=counted.eval,
        lone=LoneView(
            waiting=lone.waiting,
            ready=lone.ready,
            trained=sum(m.lone for m in history),
            expired=row.lone_expired or 0,
            judged=row.next_judged or 0,
            unreadable=row.next_unreadable or 0,
        ),
        last_step=last[0] if last else None,
        eval=eval_scores(conn, name, policy.step, every_version=False),
        splits=split_totals(history),
        health=health(history, recent_groups(conn, name), row.next_judged or 0, row.next_unreadable or 0),
        settings_warnings=settings_conflicts(policy.promotion, policy.lora, train=policy.train),
        train_requested_at=iso(policy.train_requested_at),
        load_error=policy.load_error,
        load_error_at=iso(row.load_error_at),
        replicas=msgspec.convert(row.replicas or [], list[ReplicaView]),
        created_at=iso(row.created_at),
        updated_at=iso(row.updated_at),
    )
