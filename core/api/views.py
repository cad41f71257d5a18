"""What the JSON APIs answer, as typed structs: built by the store's reads, returned by the gateway.

Litestar encodes them and derives the OpenAPI schema from them, so what the schema says
is what a client gets. Times are ISO 8601 strings in UTC. A field that is ``UNSET`` is left
out of the answer: a trajectory carries its calls only when read alone, a list entry has
no calls. Recorded bodies travel as the bytes that were recorded (``msgspec.Raw``), typed
``Any`` here: they are whatever JSON the client and the upstream exchanged.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from burnish_server.core.learning.health import Health
from burnish_server.core.learning.policies import LoraSettings, PromotionSettings, RulerSettings, ServingSettings, TrainSettings
from burnish_server.core.learning.promotion import Comparison, DecisionRecord, Outcome
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.protocols.records import Adjustments


class View(msgspec.Struct):
    """Base of the answers (each is keyword-only: its `object` tag has a default and comes first)."""


class CallTokensView(View, kw_only=True):
    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]] | None  # one list per choice
    completion_logprobs: list[list[float]] | None


class CallView(View, kw_only=True):
    object: Literal["trajectory.call"] = "trajectory.call"
    id: int
    endpoint: str
    model: str | None
    policy: str | None
    policy_step: int | None
    upstream_model: str | None
    stream: bool
    status: str
    http_status: int | None
    error: str | None
    request: Any  # the request body as the client sent it
    response: Any  # the response as the client received it (a stream folded into one body); null if none
    usage: dict[str, Any] | None
    tokens: CallTokensView | None
    # Whether this call's prompt ids start with the trajectory so far (the previous single-choice
    # call's prompt and completion), so that the trainer merges it into the same sequence
    # (core/learning/continuity.py: Continuity). False: a split, a new sequence starts here. None: not merged:
    # several choices, or not trained at all (no prompt or completion ids, not ok, or not
    # answered by the policy the trajectory's group trains).
    extends_previous: bool | None
    # Where extends_previous is false: why (core/learning/drift.py: tool_call_rerendered, reasoning_dropped,
    # system_changed, prompt_cut, history_rewritten, another_model, retokenized).
    split_reason: str | None
    # What the gateway changed to serve the call (tools left out, max_tokens lowered); None: nothing.
    adjustments: Adjustments | None = None
    # The newest reward posted for this call alone (credit per turn), if any.
    reward: float | None
    attempts: int
    upstream_first_byte_ms: float | None
    upstream_ms: float | None
    started_at: str | None
    finished_at: str | None


class RewardView(View, kw_only=True):
    reward: float
    components: dict[str, float] | None
    source: str  # "user" or "ruler"
    explanation: str | None
    created_at: str | None
    # The call it rewards, by its index in ``calls``; None: the trajectory's reward.
    call: int | None = None


class TrajectoryView(View, kw_only=True):
    object: Literal["trajectory"] = "trajectory"
    id: str
    group_id: str | None
    created_at: str | None
    updated_at: str | None
    reward: float | None
    reward_components: dict[str, float] | None
    rewarded_at: str | None
    # Held out for evaluation (X-Eval, /eval/...): rewarded like any other, never trained on.
    eval: bool
    call_count: int | UnsetType = UNSET
    # Read alone (GET /v1/trajectories/{id}): its calls in order and every reward posted.
    calls: list[CallView] | UnsetType = UNSET
    rewards: list[RewardView] | UnsetType = UNSET
    # Read alone: the calls whose extends_previous is false, where training starts a new sequence.
    sequence_splits: int | UnsetType = UNSET
    # Answering a reward: whether that reward closed the trajectory's group, and whether the
    # trajectory was a lone attempt that expired before it came (the reward is kept, never trained on).
    group_closed: bool | UnsetType = UNSET
    expired: bool | UnsetType = UNSET


class GroupView(View, kw_only=True):
    object: Literal["group"] = "group"
    id: str
    expected_size: int | None
    created_at: str | None
    state: str  # open, closed, training, trained (core/learning/groups.py)
    # Held out for evaluation: a member was marked, so the group is never trained on.
    eval: bool
    closed_at: str | None
    close_reason: str | None
    ruler_at: str | None
    ruler_error: str | None
    size: int
    rewarded: int
    members: list[TrajectoryView]
    # A closed group that will never be trained: why (core/learning/groups.py: cannot_train).
    cannot_train: str | None = None


class TrajectoryPage(View, kw_only=True):
    object: Literal["list"] = "list"
    data: list[TrajectoryView]
    first_id: str | None
    last_id: str | None
    has_more: bool


class StepView(View, kw_only=True):
    object: Literal["policy.step"] = "policy.step"
    step: int
    parent: int
    created_at: str | None
    published_at: str | None
    publish_seconds: float | None
    serving: bool
    groups: list[str]
    checkpoint: str
    trainer: str
    metrics: StepMetrics | UnsetType = UNSET  # core/learning/steps.py; docs/trainer.md
    # Whether it served after its trial (docs/promotion.md): the latest decision,
    # promoted, rejected or rolled_back (null while undecided, or under the immediate rule),
    # and every decision in order.
    decision: Outcome | None = None
    decided_at: str | None = None
    decisions: list[DecisionRecord] = []


class CandidateView(View, kw_only=True):
    """The version on trial and the evidence so far."""

    step: int
    version: str
    since: str | None
    rule: str
    share: float | None  # of unpinned trajectories (canary); null: pinned calls only
    # The test (null under manual): counts, means, bounds, decision if any; as the trainer last
    # read it, every few seconds, or as it stands where the trainer has not read it yet.
    test: Comparison | None
    tested_at: str | None = None  # when the test shown was read


class EvalScore(View, kw_only=True):
    """A policy version's held-out score (store/evals.py)."""

    object: Literal["policy.eval"] = "policy.eval"
    step: int  # 0: the base model
    version: str  # <policy>@<step>
    serving: bool  # the version the policy serves now
    trajectories: int  # rewarded eval trajectories this version answered
    score: float | None  # their mean reward; null where there are none


class EvalList(View, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EvalScore]


class ReplicaView(View, kw_only=True):
    """Where one vLLM replica stands for a policy, as the trainer last saw it."""

    url: str
    reachable: bool
    # The policy's versions it holds as adapters (step 0, the base model, is always there).
    steps: list[int]
    serving: bool  # it holds the served version: the gateways send it the policy's calls
    error: str | None = None  # why it does not hold the served version, if it tried and failed
    since: str | None = None  # when it came to stand so


class LoneView(View, kw_only=True):
    """The policy's lone attempts (a trajectory answered once, in a group of its own:
    core/learning/lone.py): where they stand."""

    waiting: int  # open: no reward yet (each expires after the policy's group_idle_close_s without one)
    ready: int  # rewarded, waiting for a step
    trained: int  # by the steps that trained them
    expired: int  # their reward never came in time: never trained on
    # Answers the next-message judge (ruler.next_message) scored by what followed them, and those
    # it gave no readable verdict for (neither yes nor no): no reward.
    judged: int = 0
    unreadable: int = 0


class PolicyView(View, kw_only=True):
    object: Literal["policy"] = "policy"
    name: str
    base_model: str
    model_path: str | None
    lora: LoraSettings
    train: TrainSettings
    ruler: RulerSettings
    paused: bool
    promotion: PromotionSettings = PromotionSettings()
    serving: ServingSettings = ServingSettings()
    project: str | None = None  # the project it belongs to; null: shared by every project
    shared_with: list[str] = []  # other projects an admin shared it with
    step: int  # the version served (0: the base model)
    head: int  # the version to serve and to train from next
    candidate: CandidateView | None = None
    served_version: str
    pending_version: str | None  # a trained or rolled-back version not switched to yet
    # Groups the policy trains on (held-out groups are not among them: they never wait for training).
    groups_ready: int
    # Whether a group whose members are all rewarded alike trains (SFT, or a teacher that teaches
    # every call: TrainSettings.readiness); on GRPO alone, or with hindsight alone, it does not.
    ties_train: bool = False
    groups_open: int
    groups_trained: int  # by the steps that trained them (record_step): pruned ones still count
    # Closed and not taken by a trainer: the ready ones, and those that cannot train (health says why).
    groups_closed: int = 0
    groups_eval: int  # groups held out for evaluation (marked, or closed with a held-out member), not trained
    # Of those groups, the lone attempts (groups of one).
    lone: LoneView = msgspec.field(default_factory=lambda: LoneView(waiting=0, ready=0, trained=0, expired=0))
    last_step: StepView | None
    # Calls whose prompt did not extend their trajectory, in every step trained, by reason
    # (core/learning/drift.py; docs/health.md, "The drift report").
    splits: dict[str, int] = {}
    # Learning health from the steps' metrics (core/learning/health.py): reward trend, entropy, distance, a warning.
    health: Health | None = None
    # Settings that can never do what they configure (core/learning/policies.py: settings_conflicts),
    # kept from before the admin API refused them.
    settings_warnings: list[str] = []
    # Held-out scores of the versions that have one, oldest first (GET .../evals lists every version).
    eval: list[EvalScore]
    train_requested_at: str | None
    load_error: str | None
    load_error_at: str | None
    # Each vLLM replica, as the trainer last saw it (empty until it has looked).
    replicas: list[ReplicaView]
    created_at: str | None
    updated_at: str | None


class PolicyList(View, kw_only=True):
    object: Literal["list"] = "list"
    data: list[PolicyView]


class StepList(View, kw_only=True):
    object: Literal["list"] = "list"
    data: list[StepView]


class StepFigures(StepMetrics, kw_only=True):
    """A step in the metrics history: its figures, when it was made and served, the held-out
    score of its version (null where none) and its promotion decisions."""

    step: int
    created_at: str | None
    published_at: str | None
    eval_score: float | None
    eval_trajectories: int | None
    decision: Outcome | None = None
    decided_at: str | None = None
    decisions: list[DecisionRecord] = []


class MetricsList(View, kw_only=True):
    object: Literal["list"] = "list"
    data: list[StepFigures]  # one per step, oldest first


class JudgeView(View, kw_only=True):
    model: str
    base_url: str


class ScoreView(View, kw_only=True):
    trajectory_id: str
    score: float
    explanation: str
    reward: float  # the reward the score set (combine "set") or changed (combine "add")


class RulerView(View, kw_only=True):
    object: Literal["group.ruler"] = "group.ruler"
    group_id: str
    judge: JudgeView
    combine: str
    cached: bool
    judge_calls: int
    distinct_trajectories: int
    scores: list[ScoreView]


class KeyView(View, kw_only=True):
    """An API key as listed: never its secret (shown once, when made) nor the secret's hash."""

    object: Literal["api_key"] = "api_key"
    id: str
    name: str
    project: str
    scopes: list[str]
    # The secret's first characters, to tell keys apart.
    prefix: str
    rpm_limit: int | None
    max_parallel_requests: int | None
    created_at: str | None
    expires_at: str | None
    revoked_at: str | None
    # "active", "revoked" or "expired".
    status: str


class NewKeyView(KeyView, kw_only=True):
    """A key just made: the only answer that carries its secret."""

    secret: str


class KeyList(View, kw_only=True):
    object: Literal["list"] = "list"
    data: list[KeyView]


class SessionView(View, kw_only=True):
    """A dashboard sign-in as an admin lists it (core/platform/sessions.py): never its secret nor the secret's hash."""

    object: Literal["ui_session"] = "ui_session"
    id: str
    # The key it was signed in with; null: the admin token.
    key_id: str | None
    project: str
    created_at: str | None
    # The last page view, to within a minute.
    last_seen_at: str | None
    # When it ends unused (the last page view and the idle timeout), and however used.
    idle_until: str | None
    expires_at: str | None
    # "active"; "idle" or "expired" (its own terms); "key_revoked" or "key_expired"; "admin_token_changed";
    # "ended" in the answer that ends it.
    status: str


class SessionList(View, kw_only=True):
    object: Literal["list"] = "list"
    data: list[SessionView]
