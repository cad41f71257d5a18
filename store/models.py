"""The store's tables: groups, trajectories, calls, rewards; policies and their training steps; each project's retention.

Request and response bodies are stored as the JSON bytes that crossed the wire
(``LargeBinary``), so recording never re-encodes them; token ids and logprobs are
packed little-endian arrays (see ``core/protocols/packed.py``). Each table's typed view lives in
the domain: a call is ``core.protocols.records.CallRecord``, a policy ``core.learning.policies.Policy``, a
group's state ``core.learning.groups.GroupState``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from burnish_server.core.platform.access import DEFAULT_PROJECT, STORED_ID_MAX
from burnish_server.core.platform.clock import utcnow

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
PK = BigInteger().with_variant(Integer(), "sqlite")


def iso(value: datetime | None) -> str | None:
    """A stored time as ISO 8601 in UTC (SQLite hands back naive datetimes; they were written in UTC)."""
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


WAITING = "closed_at IS NOT NULL AND trained_at IS NULL"
CLAIMED = "claimed_by IS NOT NULL AND trained_at IS NULL"
# Partial indexes on "column not NULL" (migration 0022): every read names the column.
IN_GROUP, TO_POLICY, HAS_RESPONSE_ID = "group_id IS NOT NULL", "policy IS NOT NULL", "response_id IS NOT NULL"
# In each dialect's own words: SQLite's planner uses a partial index only for a query that names its terms as written.
UNSCORED = {"sqlite": "eval = 1 AND reward IS NOT NULL AND scored = 0", "postgresql": "eval AND reward IS NOT NULL AND NOT scored"}
# A lone attempt still waiting for its reward (core/learning/lone.py): a policy's trajectory in no group, unrewarded, not held out.
LONE = {
    "sqlite": "policy IS NOT NULL AND group_id IS NULL AND reward IS NULL AND eval = 0",
    "postgresql": "policy IS NOT NULL AND group_id IS NULL AND reward IS NULL AND NOT eval",
}


class Group(Base):
    """Trajectories that answer the same task; GRPO compares them."""

    __tablename__ = "groups"
    __table_args__ = (
        # A policy's open groups, oldest first: what the idle close reads (store/writes.py).
        Index("ix_groups_open", "policy", "created_at", sqlite_where=text("closed_at IS NULL"), postgresql_where=text("closed_at IS NULL")),
        # A policy's closed groups no trainer has finished, by what they lack, oldest closed
        # first: the training queue that readiness and the trainer's poll read, a ready group
        # one entry however many ties wait beside it (store/training.py: ready_groups).
        Index("ix_groups_waiting", "policy", "lacks", "closed_at", sqlite_where=text(WAITING), postgresql_where=text(WAITING)),
        # A policy's groups a trainer holds (a step's worth at most): whether another trainer is
        # mid-step (store/training.py: other_trainer_busy), and the status' count of closed groups.
        Index("ix_groups_claimed", "policy", sqlite_where=text(CLAIMED), postgresql_where=text(CLAIMED)),
        # A policy's groups newest first: the groups list filtered to a policy walks it (SQLite
        # otherwise read all the policy's groups by when they closed, then sorted them).
        Index("ix_groups_policy_pk", "policy", "pk"),
        # A policy's groups by when they closed: its last closed groups (store/policies.py: recent_groups).
        Index("ix_groups_policy_closed", "policy", "closed_at"),
    )

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    # Namespaced by project: "<project>/<id>", or the bare id in the default project (core/platform/access.py).
    id: Mapped[str] = mapped_column(String(STORED_ID_MAX), unique=True)
    project: Mapped[str] = mapped_column(String(64), default=DEFAULT_PROJECT, server_default=DEFAULT_PROJECT)
    # Members expected (X-Group-Size); the group closes itself when that many are rewarded.
    expected_size: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # "complete" (all expected members rewarded), "closed" (POST /v1/groups/{id}/close),
    # "ruler" (a verdict closed it) or "idle" (its policy's group_idle_close_s passed).
    close_reason: Mapped[str | None] = mapped_column(String(16))
    # The policy whose calls made this group (the first one seen); what it trains.
    policy: Mapped[str | None] = mapped_column(String(128))
    # Training: a trainer claims a ready group, then marks it trained at a step.
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    trained_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    trained_step: Mapped[int | None] = mapped_column(Integer)
    # RULER: when it last ran on the group, the verdict it stored, or why it failed.
    ruler_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ruler_key: Mapped[str | None] = mapped_column(String(64))
    ruler_error: Mapped[str | None] = mapped_column(Text)
    # Held out for evaluation: a member's call was marked (X-Eval, /eval/...). Never trained
    # on; once set, never cleared.
    eval: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # What it lacks to train (core.learning.groups.Lack), settled when it closes (store/training.py:
    # settle); None while open, or until settled again after a call that came after its close.
    lacks: Mapped[int | None] = mapped_column(SmallInteger)


class Trajectory(Base):
    """One episode of an agent: its calls in order, and the reward it earned."""

    __tablename__ = "trajectories"
    # Only the held-out trajectories (a few among many): where their scores are read from.
    __table_args__ = (
        Index("ix_trajectories_eval", "eval", sqlite_where=text("eval = 1"), postgresql_where=text("eval")),
        # A project's page of trajectories, newest first.
        Index("ix_trajectories_project_pk", "project", "pk"),
        # A group's members with what readiness counts of them (store/training.py:
        # group_members), read from the index alone. Partial, like the calls' two below: a
        # trajectory in no group writes no entry (every read names a group).
        Index("ix_trajectories_group_members", "group_id", "eval", "reward", sqlite_where=text(IN_GROUP), postgresql_where=text(IN_GROUP)),
        # Held out and rewarded, but not settled into `held_out` (a few at most): read apart. Keyed
        # by `scored`, which the query names: SQLite prefers an index it searches to one it scans.
        Index("ix_trajectories_unscored", "scored", sqlite_where=text(UNSCORED["sqlite"]), postgresql_where=text(UNSCORED["postgresql"])),
        # Lone attempts waiting for their reward, by policy and last call: how many wait, and the
        # slice that expired since the last look (store/lone.py), read by time, never by history.
        Index("ix_trajectories_lone", "policy", "updated_at", sqlite_where=text(LONE["sqlite"]), postgresql_where=text(LONE["postgresql"])),
    )

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    # Namespaced by project, like Group.id.
    id: Mapped[str] = mapped_column(String(STORED_ID_MAX), unique=True)
    project: Mapped[str] = mapped_column(String(64), default=DEFAULT_PROJECT, server_default=DEFAULT_PROJECT)
    group_id: Mapped[str | None] = mapped_column(ForeignKey("groups.id"))
    # The first policy its calls went to (None: only other models'): a trajectory in no group
    # with a policy is a lone attempt of it (core/learning/lone.py).
    policy: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The latest reward; every posted reward is also kept in `rewards`.
    reward: Mapped[float | None] = mapped_column(Float)
    reward_components: Mapped[dict[str, float] | None] = mapped_column(JSON)
    rewarded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Held out for evaluation: one of its calls was marked. Never trained on; once set, never
    # cleared.
    eval: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Held out and rewarded: its rows in `held_out` are its versions and reward as they stand.
    # Settled when its reward is stored (store/evals.py: settle); false again after any later
    # call, until settled again (a rewarded held-out trajectory that is not: ix_trajectories_unscored).
    scored: Mapped[bool] = mapped_column(Boolean, server_default="0")  # no Python default: the writer's prepared insert names its columns
    # What followed its answer (a lone attempt's: the user's next turn, a tool's result), as chat
    # messages, for a teacher with hindsight (core/learning/followups.py).
    followed: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)


class HeldOut(Base):
    """A rewarded held-out trajectory's version of a policy it called, and its reward: what held-out
    scores and an eval trial read, a version's entries together (store/evals.py)."""

    __tablename__ = "held_out"
    __table_args__ = (Index("ix_held_out_version", "policy", "last_step", "first_step", "reward", "trajectory_pk"),)

    trajectory_pk: Mapped[int] = mapped_column(PK, ForeignKey("trajectories.pk"), primary_key=True)
    policy: Mapped[str] = mapped_column(String(128), primary_key=True)
    # The lowest and highest step that answered its ok calls to the policy: the same where one
    # version answered them all (an eval trial counts only those); the highest is the version
    # it ended on (its held-out score's).
    first_step: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float] = mapped_column(Float)


class Call(Base):
    """One request through the gateway and what came back."""

    __tablename__ = "calls"
    __table_args__ = (
        # A trajectory's calls in order, with what a lookup of its versions reads (which policy
        # and step answered, and how it ended): held-out scores, a version's filter, a trial.
        Index("ix_calls_trajectory", "trajectory_id", "started_at", "policy", "policy_step", "status"),
        # A version's calls by time: what a canary trial served, a version's newest trajectories
        # (the rollback watch: store/promotion.py). Only a policy's calls: every read names the
        # policy, and a pass-through call then writes no entry (a WAL page less on SQLite).
        Index(
            "ix_calls_version", "policy", "policy_step", "started_at", "trajectory_id", "status", sqlite_where=text(TO_POLICY), postgresql_where=text(TO_POLICY)
        ),
        # A Responses API answer found by its id (store/responses.py); no entry for other calls.
        Index("ix_calls_response_id", "response_id", sqlite_where=text(HAS_RESPONSE_ID), postgresql_where=text(HAS_RESPONSE_ID)),
    )

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    trajectory_id: Mapped[str] = mapped_column(ForeignKey("trajectories.id"))
    # "chat.completions", "completions", "responses" or "messages".
    endpoint: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(256))
    # For a call to a policy: its name and the step (adapter version) that served it;
    # `upstream_model` is the name vLLM was asked for (`<policy>@<step>`, or the base model).
    policy: Mapped[str | None] = mapped_column(String(128))
    policy_step: Mapped[int | None] = mapped_column(Integer)
    upstream_model: Mapped[str | None] = mapped_column(String(256))
    stream: Mapped[bool] = mapped_column(default=False)
    status: Mapped[str] = mapped_column(String(32))
    http_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    request: Mapped[bytes] = mapped_column(LargeBinary)
    # A plain response as received; a stream reassembled into the plain response's shape.
    response: Mapped[bytes | None] = mapped_column(LargeBinary)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    prompt_token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    # All choices' sampled tokens end to end; `completion_lengths` splits them per choice.
    completion_token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    completion_logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    completion_lengths: Mapped[bytes | None] = mapped_column(LargeBinary)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    # Milliseconds from sending to the upstream until its first byte, and until its last.
    upstream_first_byte_ms: Mapped[float | None] = mapped_column(Float)
    upstream_ms: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # A Responses API answer the gateway served for a policy (and the client let it store):
    # its id, so a later call can continue it with `previous_response_id`.
    response_id: Mapped[str | None] = mapped_column(String(128))
    # What the gateway changed to serve the call (core/protocols/records.py: Adjustments); None: nothing.
    adjustments: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Reward(Base):
    """Every reward ever posted for a trajectory, or for one of its calls, newest last."""

    __tablename__ = "rewards"

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    trajectory_id: Mapped[str] = mapped_column(ForeignKey("trajectories.id"), index=True)
    # The call it rewards (credit per turn), or None for the trajectory's own reward; a call's
    # reward is its newest such row.
    call_pk: Mapped[int | None] = mapped_column(PK, index=True)
    reward: Mapped[float] = mapped_column(Float)
    components: Mapped[dict[str, float] | None] = mapped_column(JSON)
    # "user" for POST /reward, "ruler" for a judge's verdict.
    source: Mapped[str] = mapped_column(String(32), default="user")
    # The judge's reasons, for a RULER reward.
    explanation: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PolicyRow(Base):
    """A trainable model (``core.learning.policies.Policy`` is its typed view)."""

    __tablename__ = "policies"

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    base_model: Mapped[str] = mapped_column(String(256))
    model_path: Mapped[str | None] = mapped_column(String(1024))
    # core.learning.policies.LoraSettings / TrainSettings, as JSON objects.
    lora: Mapped[dict[str, Any]] = mapped_column(JSON)
    train: Mapped[dict[str, Any]] = mapped_column(JSON)
    # core.learning.policies.RulerSettings; None for a policy made before RULER existed (defaults).
    ruler: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The project it belongs to (None: shared by every project) and the other projects an
    # admin shared it with (a JSON list of names).
    project: Mapped[str | None] = mapped_column(String(64))
    shared_with: Mapped[list[str] | None] = mapped_column(JSON)
    # core.learning.policies.PromotionSettings; None for a policy made before promotion existed (defaults).
    promotion: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # core.learning.policies.ServingSettings; None for a policy made before it existed (defaults).
    serving: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    # The version served, and the one the next step trains from (and that should be served).
    step: Mapped[int] = mapped_column(Integer, default=0)
    head: Mapped[int] = mapped_column(Integer, default=0)
    # The version on trial (core/learning/promotion.py), and since when it serves.
    candidate: Mapped[int | None] = mapped_column(Integer)
    candidate_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Its test as the trainer last read it (core.learning.promotion.Comparison), and when: the status
    # shows it rather than read the trial again (a canary's costs what the trial served).
    candidate_test: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    candidate_tested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # POST /admin/policies/{name}/train: train on what is ready, even short of groups_per_step.
    train_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Its lone attempts that expired unrewarded (store/writes.py: close_idle_groups), counted as they expire.
    lone_expired: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Lone attempts whose last call came before this were counted into lone_expired (store/lone.py: sweep).
    lone_swept_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Answers the next-message judge scored, and those it gave no readable verdict for (gateway/groups/followups.py).
    next_judged: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_unreadable: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The last failure to load a version into vLLM; cleared when one loads.
    load_error: Mapped[str | None] = mapped_column(Text)
    load_error_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # core.api.views.ReplicaView objects, one per vLLM replica, as the trainer last saw them.
    replicas: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StepRow(Base):
    """One training step of a policy: its checkpoint and its metrics."""

    __tablename__ = "steps"
    __table_args__ = (UniqueConstraint("policy", "step"),)

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    policy: Mapped[str] = mapped_column(ForeignKey("policies.name"))
    step: Mapped[int] = mapped_column(Integer)
    # The checkpoint this step started from (step - 1, or the one rolled back to).
    parent: Mapped[int] = mapped_column(Integer)
    groups: Mapped[list[str]] = mapped_column(JSON)
    # core/learning/steps.py: StepMetrics, as JSON (read back with StepMetrics.read).
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    checkpoint: Mapped[str] = mapped_column(String(1024))
    trainer: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # When vLLM first served it, and how long loading and checking took.
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    publish_seconds: Mapped[float | None] = mapped_column(Float)
    # Whether it served: the latest decision, "promoted", "rejected" or "rolled_back" (None:
    # not decided, or never tried), and when; every decision in order, each with who made
    # it, why, and the test's figures (core.learning.promotion.Comparison) where a test made it.
    decision: Mapped[str | None] = mapped_column(String(16))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    decisions: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)


class LoneBaseline(Base):
    """A policy's running statistics of its lone attempts' rewards, per kind of request
    (``core.learning.lone.Baseline`` is its typed view): moved by each step that trained them."""

    __tablename__ = "lone_baselines"

    policy: Mapped[str] = mapped_column(String(128), primary_key=True)
    # core/learning/lone.py: kind_of, a digest of the system prompt and the tools offered.
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    mean: Mapped[float] = mapped_column(Float)
    variance: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RulerVerdict(Base):
    """A judge's verdict, keyed by a hash of judge, rubric and trajectories: asked again, it is reused."""

    __tablename__ = "ruler_verdicts"

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    judge: Mapped[str] = mapped_column(String(1024))
    # {trajectory_id: {"score", "explanation"}} for the trajectories shown to the judge.
    scores: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKeyRow(Base):
    """An API key (``core.platform.access.ApiKey`` is its typed view). Never deleted: revoking keeps the row,
    so that a gateway which has had keys never falls back to being open."""

    __tablename__ = "api_keys"

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(32), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    project: Mapped[str] = mapped_column(String(64), index=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    # SHA-256 of the secret, hex; the secret itself is never stored.
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The secret's first characters, to tell keys apart in a listing.
    prefix: Mapped[str] = mapped_column(String(16))
    rpm_limit: Mapped[int | None] = mapped_column(Integer)
    max_parallel_requests: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class GatewayRow(Base):
    """A gateway process that is up, by its heartbeat: per-key limits are shared among them."""

    __tablename__ = "gateways"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UiSessionRow(Base):
    """A dashboard sign-in (``core.platform.sessions.UiSession`` is its typed view). Deleted when it ends by
    sign-out or by an admin; one past its lifetime is swept at the next sign-in."""

    __tablename__ = "ui_sessions"

    pk: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    # The public id, by which an admin lists and ends it.
    id: Mapped[str] = mapped_column(String(32), unique=True)
    # SHA-256 of the secret in the browser's cookie, hex; the secret itself is never stored.
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The key it was signed in with (its revocation ends it); None: the admin token.
    key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), index=True)
    project: Mapped[str] = mapped_column(String(64))
    # For the admin token's sessions: a fingerprint of the token (core/platform/sessions.py).
    admin_fingerprint: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Its terms, from the settings of the gateway that made it.
    idle_s: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class RetentionRow(Base):
    """A project's retention (``core.platform.retention.Retention`` is its typed view); a project
    without a row takes the server's default (``store/retention.py`` reads and writes it)."""

    __tablename__ = "retention"

    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    days: Mapped[float | None] = mapped_column(Float)
    prune_trained: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
