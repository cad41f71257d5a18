"""Policies: trainable models, their settings, and how a request's ``model`` maps to what vLLM serves.

A policy has a name, a base model, LoRA and training settings, and the step it serves.
vLLM serves step N > 0 as the LoRA adapter ``<policy>@<N>``; step 0 is the base model
itself. So:

    model: "<policy>"       -> the current step: "<policy>@<step>", or the base model at 0
    model: "<policy>@<N>"   -> that step, pinned
    anything else           -> passed through untouched (and still recorded)

Policies live in the store (``store/policies.py``), are created and changed over the
admin API, and are advanced by the trainer. The gateway routes from a snapshot of that
table (``gateway/policies/routing.py``).

Every training knob and its default is here, and only here: the admin API validates
against these structs, the store keeps them as JSON, the trainer reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from hashlib import blake2b
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from burnish_server.core.learning.messages import Turn, problem
from burnish_server.core.platform.access import NO_NUL, PRINTABLE
from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.protocols.translate.common import HostedTools


class LoraSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # vLLM must be started with --max-lora-rank at least this (burnish up: 16).
    rank: Annotated[int, Meta(ge=1, le=512)] = 16
    alpha: Annotated[int, Meta(ge=1)] = 32
    dropout: Annotated[float, Meta(ge=0, lt=1)] = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


class Objective(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a step minimises: a weighted sum of objectives, each normalised by the tokens it
    trains on (docs/objectives.md). Any may be 0; not all of them.

    grpo     the group-relative policy gradient on rewards (trainer/grpo.py)
    sft      supervised: the log-likelihood of each group's best members at or above
             ``sft_min_reward`` (rejection-sampling fine-tuning)
    distill  on-policy distillation: the per-token reverse KL to the policy's ``teacher`` on
             the policy's own samples (trainer/objectives.py)
    """

    grpo: Annotated[float, Meta(ge=0, le=1000)] = 1.0  # the group-relative policy gradient on rewards
    sft: Annotated[float, Meta(ge=0, le=1000)] = 0.0  # imitating each group's best members at or above sft_min_reward
    distill: Annotated[float, Meta(ge=0, le=1000)] = 0.0  # on-policy distillation toward the teacher

    @property
    def needs_rewards(self) -> bool:
        """A group trains only once every member has a reward (GRPO compares them, SFT picks by them).
        Distillation alone needs none: the teacher scores the samples."""
        return self.distill == 0

    @property
    def needs_spread(self) -> bool:
        """A group trains only where its rewards differ (or a call's own reward is not 0): GRPO
        alone learns nothing from a tie."""
        return self.sft == 0 and self.distill == 0


# The three objectives by name: ``"objective": "distill"`` is ``{"grpo": 0, "distill": 1}``.
OBJECTIVES = {"grpo": Objective(), "sft": Objective(grpo=0, sft=1), "distill": Objective(grpo=0, distill=1)}


# The most teacher tokens kept per sampled position (top-k distillation): each costs 12 bytes a
# position in the batch, and the policy's logprob of each is gathered from the chunked head.
MAX_TOP_K = 128
# The base teacher's default k: on SmolLM2, a house style the base never samples (0 of 320) was
# learned to 0.97 held-out in 6 steps with 16, and not at all on the sampled token alone
# (docs/objectives.md, "Distillation beyond the sampled token").
DEFAULT_TOP_K = 16


# A turn of a teacher's context: a chat message, an assistant's tool calls and their results included.
TeacherTurn = Turn


class Teacher(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who scores the policy's samples for on-policy distillation.

    ``model`` None: the policy's own base model, with its adapter off, in the trainer. A name:
    a model vLLM serves with the policy's tokenizer (a larger sibling), asked for its
    logprobs of each sampled token (``prompt_logprobs``); another tokenizer is refused when set.
    ``context``: turns shown before each conversation (after its own system message, if it
    has one): instructions in a system turn, worked examples as earlier user and assistant
    turns, which small models follow far more readily than examples described in a system
    prompt; a tool agent's worked episodes hold the assistant's tool calls and the tool
    results, as a demonstration does (core/learning/messages.py). The base needs a context to teach
    anything; a served model may go without."""

    # Turns shown before each conversation, after its own system message: chat messages
    # ({"role", "content"}; an assistant's tool_calls and tool results too).
    context: Annotated[tuple[TeacherTurn, ...], Meta(max_length=200)] = ()
    # None: the policy's base, adapter off; a name: a model vLLM serves with the policy's tokenizer.
    model: Annotated[str, Meta(min_length=1, max_length=256, pattern=PRINTABLE)] | None = None
    # 0: the reverse KL on the sampled token alone, so the teacher can only push down what the
    # policy samples. k: at each sampled position, the forward KL from the teacher's k likeliest
    # tokens and the rest of its mass as one bucket, so it also pulls up tokens the policy has
    # never sampled there (docs/objectives.md, "Distillation beyond the sampled token"). The base
    # teacher only: a served teacher answers the sampled token alone. None: DEFAULT_TOP_K for
    # the base, 0 for a served teacher (``top()``).
    top_k: Annotated[int, Meta(ge=0, le=MAX_TOP_K)] | None = None
    # Hindsight: a lone attempt's answer is scored by the teacher shown what followed it (the
    # user's next turn, a tool's result: core/learning/followups.py) as a hint, so that the answer
    # moves toward what that reply shows was wanted. A call with nothing after it is taught by
    # the context alone, or not at all without one. The base teacher only.
    hindsight: bool = False

    def __post_init__(self) -> None:
        if (why := problem(self.context)) is not None:
            raise ValueError(f"teacher.context {why}")
        if self.top_k and self.model is not None:
            raise ValueError("teacher.top_k is for the policy's own base as teacher; a served teacher (teacher.model) scores the sampled token alone")
        if self.hindsight and self.model is not None:
            raise ValueError("teacher.hindsight is for the policy's own base as teacher: set teacher.model to null")

    def top(self) -> int:
        """How many of the teacher's likeliest tokens each sampled position learns from."""
        if self.top_k is not None:
            return self.top_k
        return 0 if self.model is not None else DEFAULT_TOP_K


class TrainSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # For real models; the tiny embedded model learns at 5e-3 (docs/trainer.md).
    learning_rate: Annotated[float, Meta(gt=0, le=1)] = 1e-5
    adam_betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: Annotated[float, Meta(ge=0)] = 0.0
    grad_clip: Annotated[float, Meta(gt=0)] = 1.0
    # Ready groups trained in one optimizer step (a step waits until there are this many,
    # unless training is asked for now).
    groups_per_step: Annotated[int, Meta(ge=1, le=4096)] = 2
    # An open group that has seen no member's call and no reward for this long closes by itself
    # (close_reason "idle"), so a group trains without X-Group-Size or POST /close; a reward
    # posted later is refused (409). None: groups close only at their size or when told.
    group_idle_close_s: Annotated[float, Meta(gt=0, le=30 * 86400)] | None = 600.0
    # Longer sequences are cut at the end (their last sampled tokens are not trained on).
    max_seq_len: Annotated[int, Meta(ge=16)] = 4096
    # Gradient accumulation: sequences are packed into forward passes of at most this many
    # (padded) tokens, which bounds activation memory whatever the step's size.
    micro_batch_tokens: Annotated[int, Meta(ge=16)] = 8192
    # Clip range of the importance ratio. A higher upper bound (DAPO's "clip-higher")
    # lets rare tokens gain probability faster than they can lose it.
    clip_eps_low: Annotated[float, Meta(ge=0, lt=1)] = 0.2
    clip_eps_high: Annotated[float, Meta(ge=0)] = 0.28
    # Truncated importance sampling (TIS): None keeps the clipped ratio to vLLM's recorded
    # logprobs (PPO/GRPO). A number turns the ratio into a weight, min(p_trainer / p_vLLM,
    # tis_cap), on a plain policy gradient (grpo.py): it corrects for the two engines
    # disagreeing and for stale samples without dropping their tokens' gradient. 2 is the
    # value its authors used.
    tis_cap: Annotated[float, Meta(ge=1)] | None = None
    # What a token sampled under a grammar (a forced tool call, a JSON format: core/protocols/grammar.py)
    # takes its ratio against. "trainer": the trainer's own logprob, so the ratio says how far
    # the policy moved (1 at staleness 0). "recorded": vLLM's, which the grammar renormalised:
    # the ratio starts below 1 and clips away negative advantages (docs/trainer.md).
    held_ratio: Literal["trainer", "recorded"] = "trainer"
    # Calls sampled by a version more than this many steps before the one being trained are
    # skipped and counted (stale_calls in the step's metrics); None: any age is trained.
    # A batch is stale when groups wait while the trainer is busy, or after a rollback.
    max_staleness: Annotated[int, Meta(ge=0)] | None = None
    # Weight of the k3 KL estimate against the base model (adapter off). 0: no KL term and
    # no reference forward pass, which is what recent GRPO practice (DAPO, Dr. GRPO) uses.
    kl_coef: Annotated[float, Meta(ge=0)] = 0.0
    # Divide advantages by the group's standard deviation (GRPO). False: only centre them (Dr. GRPO).
    scale_advantages: bool = True
    advantage_eps: Annotated[float, Meta(gt=0)] = 1e-4
    # Rewards posted for single calls (credit per turn, core/learning/credit.py: turn_credits): a call's
    # tokens get the discounted sum of the call rewards at and after it, this factor per call
    # between. 1: every earlier call shares a later call's credit in full; 0: only its own call.
    turn_discount: Annotated[float, Meta(ge=0, le=1)] = 1.0
    # A lone attempt (a group of one: traffic that answers each request once, core/learning/lone.py)
    # has no group to compare with; its advantage is taken against a baseline of its kind of
    # request (its system prompt and tools). "kept": a running mean and spread of the kind's
    # rewards, kept in the store across steps (the step's own lone attempts of the kind until it
    # has LONE_MIN_KEPT); "step": the step's lone attempts of the kind alone; None: a lone attempt
    # does not train (it waits, as a group that lacks peers). docs/production.md says which runs chose the default.
    lone_baseline: Literal["kept", "step"] | None = "kept"
    # How many lone attempts weigh as one group in groups_per_step: a step of lone traffic trains
    # groups_per_step x lone_per_group of them.
    lone_per_group: Annotated[int, Meta(ge=1, le=4096)] = 8
    # Seeds the LoRA initialisation (and dropout): two runs on the same data start alike.
    seed: int = 0
    # What the step minimises: weights (Objective), or one objective by name (OBJECTIVES).
    objective: Objective | Literal["grpo", "sft", "distill"] = "grpo"
    # SFT from traffic: a group's best-rewarded members train as demonstrations when their
    # reward is at least this.
    sft_min_reward: float = 1.0
    # The teacher of on-policy distillation; needed where the objective distills.
    teacher: Teacher | None = None

    @property
    def weights(self) -> Objective:
        """The objective as weights, whichever way it was set."""
        return OBJECTIVES[self.objective] if isinstance(self.objective, str) else self.objective

    @property
    def hindsight(self) -> bool:
        """Whether a lone attempt's follow-up trains it by distillation (Teacher.hindsight)."""
        return self.weights.distill > 0 and self.teacher is not None and self.teacher.hindsight

    @property
    def readiness(self) -> Objective:
        """The objective that says which groups are ready to train (core/learning/groups.py:
        tolerated). A teacher with a context or a model of its own teaches every call, so a
        distilling policy trains on every closed group; a teacher with hindsight alone has
        something to show only an attempt that was followed (those are ready by their follow-up:
        store/training.py), so the rest of the policy's groups wait for what its other
        objectives need, and grouped traffic trains as it would without it."""
        # Hindsight is the base teacher's alone (Teacher refuses it with a model): only its context matters.
        if self.hindsight and self.teacher is not None and not self.teacher.context:
            return msgspec.structs.replace(self.weights, distill=0.0)
        return self.weights


# A judge's base URL: http or https, a host, an optional path; no query, fragment or space
# (the gateway appends /chat/completions to it).
JUDGE_URL_PATTERN = r"^https?://[^/?#\s]+(/[^?#\s]*)?$"


class RulerSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """RULER for the policy's groups (gateway/groups/ruler.py). A request's own rubric, judge_model
    and combine come first; the judge's endpoint never comes from a request."""

    # Judge every group of the policy when it closes (a group whose members all carry a
    # user reward is left alone under combine "set").
    auto: bool = False
    # None: the default rubric (DEFAULT_RUBRIC in gateway/groups/ruler.py).
    rubric: Annotated[str, Meta(max_length=20_000, pattern=NO_NUL)] | None = None
    # None: BURNISH_JUDGE_MODEL, else the policy's base model.
    judge_model: Annotated[str, Meta(min_length=1, max_length=256, pattern=PRINTABLE)] | None = None
    # None: BURNISH_JUDGE_BASE_URL, else the gateway's upstream. An http(s) base URL with no
    # query or fragment; BURNISH_JUDGE_ALLOWED_URLS, where set, lists the ones allowed.
    judge_base_url: Annotated[str, Meta(min_length=1, max_length=700, pattern=JUDGE_URL_PATTERN)] | None = None
    # "set": the score becomes the reward; "add": it is added to the user's reward.
    combine: Literal["set", "add"] = "set"
    # Judge each lone attempt's answer by what followed it (the user's next turn, a tool's result),
    # when no reward came first: P(yes) to "did the answer serve?" becomes its reward
    # (gateway/groups/followups.py; docs/production.md).
    next_message: bool = False


class ServingSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the gateway serves the policy's calls (core/protocols/translate/)."""

    # What a hosted tool the client offers becomes (core/protocols/translate/common.py: HostedTools).
    hosted_tools: HostedTools = "omit"
    # The budget of a call that asks for none (the Codex CLI never does): None leaves it to the
    # window (vLLM then samples up to what the prompt leaves of it).
    max_tokens: Annotated[int, Meta(ge=1, le=10_000_000)] | None = None


class PromotionSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When a trained version serves (core/learning/promotion.py has the test; docs/promotion.md)."""

    # immediate: every step serves all of the policy's traffic once vLLM answered with it.
    # canary: a step is a candidate, serving `canary_share` of the unpinned trajectories, until
    #   the test on their rewards against the served version's promotes or rejects it.
    # eval: a candidate serves only calls pinned to it (`<policy>@<step>`, as the SDK's
    #   held-out runs are); the test on held-out rewards decides.
    # manual: a candidate serves only pinned calls until an admin promotes or rejects it.
    rule: Literal["immediate", "canary", "eval", "manual"] = "immediate"
    # The share of unpinned trajectories a canary serves, sticky per trajectory.
    canary_share: Annotated[float, Meta(gt=0, lt=1)] = 0.1
    # How much worse (in mean reward) a candidate may be and still serve.
    margin: Annotated[float, Meta(ge=0)] = 0.0
    # Of each one-sided bound of the test (0.95: a wrong decision at most 5% of the time).
    confidence: Annotated[float, Meta(ge=0.5, le=0.99)] = 0.95
    # Rewarded trajectories needed on each side before anything is decided ...
    min_trajectories: Annotated[int, Meta(ge=2, le=1_000_000)] = 30
    # ... and after which a candidate still undecided is rejected.
    max_trajectories: Annotated[int, Meta(ge=2, le=1_000_000)] = 2000
    # What the step after a rejected candidate trains from: the served version, or the
    # rejected candidate (its checkpoint is kept either way).
    train_from: Literal["served", "candidate"] = "served"
    # Roll back by itself when the served version's latest `rollback_window` rewarded
    # trajectories are worse than the version it replaced by more than the margin.
    rollback: bool = True
    rollback_window: Annotated[int, Meta(ge=2, le=1_000_000)] = 100

    # What the rule means, asked here and nowhere else by the rule's name.
    @property
    def trials(self) -> bool:
        """A trained step is a candidate on trial before it serves (every rule but immediate)."""
        return self.rule != "immediate"

    @property
    def tested(self) -> bool:
        """A test on rewards decides the trial (canary, eval); manual waits for an admin."""
        return self.rule in ("canary", "eval")

    @property
    def canary(self) -> bool:
        """The candidate serves a share of the unpinned trajectories."""
        return self.rule == "canary"

    @property
    def watched(self) -> bool:
        """The served version is watched for a regression, and rolled back by itself."""
        return self.rollback and self.trials


# The LoRA ranks vLLM accepts as --max-lora-rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that serves an adapter of ``rank``."""
    return next(r for r in VLLM_LORA_RANKS if r >= rank)


def settings_conflicts(promotion: PromotionSettings, lora: LoraSettings, max_lora_rank: int | None = None, train: TrainSettings | None = None) -> list[str]:
    """Combinations of a policy's settings that can never do what they configure, each with
    the fields in conflict and the smallest value that works. Refused when set (the admin API);
    a policy stored before the check shows them as warnings in its status."""
    out = []
    weights = train.weights if train is not None else Objective()
    if weights.grpo == weights.sft == weights.distill == 0:
        out.append("train.objective weighs every objective 0: nothing would train; give grpo, sft or distill a weight above 0")
    if train is not None and train.teacher is not None and not train.teacher.context and train.teacher.model is None and not train.teacher.hindsight:
        out.append(
            "train.teacher has neither a context, a model nor hindsight: the base model alone would teach what the policy already is; "
            "give it context turns, hindsight (what followed each answer), or a model vLLM serves"
        )
    if weights.distill > 0 and train is not None and train.teacher is None:
        out.append(
            "train.objective distills but train.teacher is not set: set train.teacher.context to the turns the teacher sees first "
            '(e.g. {"context": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]})'
        )
    if promotion.watched and promotion.rollback_window < promotion.min_trajectories:
        out.append(
            f"promotion.rollback_window ({promotion.rollback_window}) is below promotion.min_trajectories ({promotion.min_trajectories}): "
            "the regression test reads at most rollback_window rewarded trajectories a side and decides nothing below min_trajectories, "
            f"so the policy would never roll back; set rollback_window to at least {promotion.min_trajectories} "
            f"(or min_trajectories to at most {promotion.rollback_window}, or rollback to false)"
        )
    if promotion.max_trajectories < promotion.min_trajectories:
        out.append(
            f"promotion.max_trajectories ({promotion.max_trajectories}) is below promotion.min_trajectories ({promotion.min_trajectories}): "
            "a candidate would be rejected the moment it could first be tested; "
            f"set max_trajectories to at least {promotion.min_trajectories} (or min_trajectories to at most {promotion.max_trajectories})"
        )
    if max_lora_rank is not None and lora.rank > max_lora_rank:
        out.append(
            f"lora.rank ({lora.rank}) is above the rank vLLM serves (--max-lora-rank {max_lora_rank}, BURNISH_MAX_LORA_RANK): "
            f"vLLM would refuse every version; set lora.rank to at most {max_lora_rank}, "
            f"or start vLLM with --max-lora-rank {vllm_max_lora_rank(lora.rank)} (burnish up does so for its policy)"
        )
    return out


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """A policy as stored: what it is, how it trains, and where it stands."""

    name: str
    # The name vLLM serves the base model under.
    base_model: str
    # Where the trainer loads the base weights from (a path or hub id); None: base_model.
    model_path: str | None = None
    lora: LoraSettings = LoraSettings()
    train: TrainSettings = TrainSettings()
    ruler: RulerSettings = RulerSettings()
    promotion: PromotionSettings = PromotionSettings()
    serving: ServingSettings = ServingSettings()
    # The project it belongs to, and the others an admin shared it with: only their keys call
    # it and only their groups train it. None: shared by every project.
    project: str | None = None
    shared_with: tuple[str, ...] = ()
    paused: bool = False
    # The version being served (0: the base model).
    step: int = 0
    # The checkpoint the next step trains from, and the version that should be served:
    # the newest step, or the one rolled back to. The trainer publishes it when it differs from `step`.
    head: int = 0
    # The version on trial (promotion other than immediate): served to a share of the
    # trajectories (canary) or to pinned calls only, until it is promoted or rejected.
    candidate: int | None = None
    candidate_since: datetime | None = None
    train_requested_at: datetime | None = None
    load_error: str | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """Where a call to a policy goes."""

    policy: str
    step: int
    upstream_model: str
    # The trainer keeps this version loaded on every replica (the served one, the candidate): a
    # replica without it is being caught up (it restarted), not asked for something gone.
    kept: bool = False

    @property
    def version(self) -> str:
        return adapter_name(self.policy, self.step)


def served_name(policy: Policy, step: int) -> str:
    """The model name to ask vLLM for to get ``step`` of ``policy``."""
    return policy.base_model if step == 0 else adapter_name(policy.name, step)


def route(policy: Policy, step: int | None = None) -> Route:
    step = policy.step if step is None else step
    return Route(policy.name, step, served_name(policy, step), kept=step > 0 and step in (policy.step, policy.candidate))


def open_to(policy: Policy, project: str) -> bool:
    """Whether ``project``'s keys may call the policy, and its groups train it."""
    return policy.project is None or policy.project == project or project in policy.shared_with


def in_canary(policy: Policy, trajectory_id: str) -> bool:
    """Whether a trajectory's unpinned calls go to the policy's canary: a hash of the trajectory
    (and of the candidate, so that each candidate is tried on different trajectories) below
    its share. Every call of a trajectory lands alike, so a trajectory is one version's."""
    if policy.candidate is None or not policy.promotion.canary:
        return False
    # blake2b, not crc32: crc32 is linear, so two candidates' shares overlapped far more than chance.
    digest = blake2b(f"{policy.candidate}:{trajectory_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest) < policy.promotion.canary_share * 2**64


def resolve(policies: dict[str, Policy], model: str | None, trajectory_id: str = "") -> Route | None:
    """The route of a request's ``model``: a policy (its served version, or its canary for the
    trajectories in its share), a pinned ``policy@step``, or None (pass through)."""
    if model is None:
        return None
    if (policy := policies.get(model)) is not None:
        return route(policy, policy.candidate if in_canary(policy, trajectory_id) else None)
    name, at, step = model.rpartition("@")
    # ASCII digits, and few enough for the store's integer ("agent@١" is no pin, nor is a 20-digit step).
    if at and step.isascii() and step.isdigit() and len(step) <= 9 and (policy := policies.get(name)) is not None:
        return route(policy, int(step))
    return None
