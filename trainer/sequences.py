"""From recorded calls to training sequences: the token ids vLLM sampled, and nothing else.

    recorded call ──(its prompt and completion ids, as vLLM returned them)──▶ SampledCall
    a trajectory's SampledCalls ──(merged where each prompt extends the last)──▶ Sequences
    a group's rewards ──(group-relative advantages, trainer/grpo.py)──▶ (Sequence, advantage) pairs
    a lone attempt's reward ──(against its kind's baseline, core/learning/lone.py)──▶ its advantage, given
    rewards posted for single calls ──(turn_credits, core/learning/credit.py)──▶ each token's credit, in its Sequence

A call trains only on the ids the policy actually saw and sampled. A call recorded without
prompt or completion ids is skipped and counted (``untokenized_calls`` in the step's
metrics), never rebuilt from its text: a conversation rendered again through the chat
template need not be the prompt the policy saw, and training on it would be a guess.

A trajectory's calls become as few sequences as possible: a call whose prompt token ids
start with everything so far (the previous prompt and completion) extends that sequence,
so a multi-turn episode trains as one. A call whose prompt does not (a chat template that
drops earlier reasoning, an agent that rewrote its history, a reply re-tokenised
differently) starts a new sequence: a split, counted (``sequence_splits``) and shown per
call in the trajectory view (``extends_previous``). The rule is ``core/learning/continuity.py:
Continuity``, the same for both. Only sampled tokens are trained on (mask 1); prompt
tokens, tool results and user turns are context (mask 0).

A call's staleness is how many steps the policy took between the version that sampled it
(the call's recorded ``policy_step``) and the one being trained; the step reports its mean
and maximum, and with ``max_staleness`` set, older calls are skipped and counted
(``stale_calls``), like untokenized ones.

A call with several choices (n > 1) gives one sequence per choice: each is its own
sample of the same prompt, and is not merged with other calls (nor counted as a split).

A call sampled under a grammar (``core/protocols/grammar.py``: a forced tool call, a JSON format) keeps
its recorded logprobs only to find the tokens the grammar forced; the ratio of its other
tokens is taken against the trainer's own logprob (``Sequence.compared`` 0), since vLLM's are
renormalised over what the grammar allowed (docs/trainer.md, "The ratio under a grammar").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from burnish_server.core.learning.continuity import Continuity
from burnish_server.core.learning.credit import trained_mask, turn_credits
from burnish_server.core.learning.drift import split_reason
from burnish_server.core.learning.lone import Attempt, kind_of
from burnish_server.core.learning.policies import TrainSettings
from burnish_server.core.protocols.grammar import held
from burnish_server.core.protocols.records import DEMONSTRATION, CallRecord
from burnish_server.store.training import TrainingCall
from burnish_server.trainer.grpo import group_advantages

# A call's prompt as the teacher sees it (trainer/teacher.py), from the recorded call, the
# prompt ids vLLM saw and what followed its answer (a teacher with hindsight); None where it
# cannot be rendered faithfully, or the teacher has nothing to show (the call is not distilled).
TeacherPrompt = Callable[[CallRecord, list[int], list[dict[str, Any]] | None], list[int] | None]


@dataclass
class SampledCall:
    """What the trainer needs from one recorded call."""

    prompt: list[int]
    completions: list[list[int]]  # one per choice
    logprobs: list[list[float]] | None  # the behaviour policy's, aligned with completions
    credit: float = 0.0  # its credit per turn (core/learning/credit.py: turn_credits), for every choice
    teacher_prompt: list[int] | None = None  # where the policy distills: its prompt with the teacher's context
    # Sampled free of any grammar: its recorded logprobs are of the distribution the trainer computes.
    free: bool = True


@dataclass(frozen=True, slots=True)
class Span:
    """One call's sampled tokens in a sequence (``tokens[start : start + length]``), and the
    teacher's prompt for them: the teacher scores each call on its own."""

    start: int
    length: int
    teacher_prompt: list[int] | None


@dataclass
class Sequence:
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 where the token was sampled
    behaviour_logprobs: list[float] = field(default_factory=list)  # 0.0 where mask is 0
    # Added to the sequence's advantage per token: the credit of the call that sampled it (0 elsewhere).
    credit: list[float] = field(default_factory=list)
    has_behaviour_logprobs: bool = True
    # 1 on sampled tokens whose recorded logprob the ratio is taken against: recorded, and
    # sampled free of a grammar. Elsewhere the trainer's own logprob stands in (a ratio of 1).
    compared: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # 1 on sampled tokens of calls held to a grammar
    calls: int = 0
    spans: list[Span] = field(default_factory=list)
    # Which objectives train on it (core/learning/policies.py: Objective): GRPO where its group's rewards
    # say something; SFT where it is one of its group's best; distillation where the teacher
    # scored its tokens (``taught`` 1, ``teacher_logprobs`` theirs).
    grpo: bool = True
    imitate: bool = False
    teacher_logprobs: list[float] | None = None
    taught: list[int] | None = None
    # With the teacher's top k (Teacher.top_k): per token, its k likeliest tokens there and their
    # logprobs (empty where not taught).
    teacher_top: list[tuple[list[int], list[float]]] | None = None
    # trained()'s answer, kept until the next add(): a step asks for it several times a sequence.
    _trained: list[int] | None = field(default=None, init=False, repr=False, compare=False)

    def add(
        self,
        context: list[int],
        sampled: list[int],
        logprobs: list[float] | None,
        credit: float = 0.0,
        teacher_prompt: list[int] | None = None,
        free: bool = True,
    ) -> None:
        self.spans.append(Span(len(self.tokens) + len(context), len(sampled), teacher_prompt))
        self.tokens += context + sampled
        self.mask += [0] * len(context) + [1] * len(sampled)
        self.credit += [0.0] * len(context) + [credit] * len(sampled)
        self.behaviour_logprobs += [0.0] * len(context) + (list(logprobs) if logprobs is not None else [0.0] * len(sampled))
        self.has_behaviour_logprobs &= logprobs is not None
        self.compared += [0] * len(context) + [int(logprobs is not None and free)] * len(sampled)
        self.held += [0] * len(context) + [int(logprobs is not None and not free)] * len(sampled)
        self.calls += 1
        self._trained = None

    @property
    def sampled(self) -> int:
        return sum(self.mask)

    def trained(self) -> list[int]:
        """The mask the loss uses: 1 on sampled tokens, except those a grammar forced (FORCED_LOGPROB)."""
        if not self.has_behaviour_logprobs:
            return self.mask
        if self._trained is None:
            self._trained = [m * t for m, t in zip(self.mask, trained_mask(len(self.mask), self.behaviour_logprobs))]
        return self._trained


@dataclass
class Merged:
    """One trajectory's sequences, and where it split."""

    sequences: list[Sequence]  # those with at least one sampled token
    splits: int  # single-choice calls whose prompt did not extend the trajectory so far
    # (the call that split, the single-choice call before it whose history it left), by index
    split_at: list[tuple[int, int]] = field(default_factory=list)


def build_sequences(calls: Iterable[SampledCall]) -> Merged:
    """One trajectory's calls, in order, into training sequences."""
    done: list[Sequence] = []
    current: Sequence | None = None
    continuity = Continuity()
    split_at: list[tuple[int, int]] = []
    last = -1  # the last single-choice call: its prompt and completion are the history
    for index, call in enumerate(calls):
        extends = continuity.extends(call.prompt, call.completions)
        if extends is False and last >= 0:
            split_at.append((index, last))
        if extends is not None:
            last = index
        if extends is None:  # several choices (or none): each its own sequence
            for i, completion in enumerate(call.completions):
                seq = Sequence()
                seq.add(call.prompt, completion, call.logprobs[i] if call.logprobs else None, call.credit, call.teacher_prompt, call.free)
                done.append(seq)
            continue
        completion = call.completions[0]
        logprobs = call.logprobs[0] if call.logprobs else None
        if extends and current is not None:  # current.tokens is the history the prompt extends
            current.add(call.prompt[len(current.tokens) :], completion, logprobs, call.credit, call.teacher_prompt, call.free)
            continue
        if current is not None:
            done.append(current)
        current = Sequence()
        current.add(call.prompt, completion, logprobs, call.credit, call.teacher_prompt, call.free)
    if current is not None:
        done.append(current)
    return Merged([s for s in done if s.sampled > 0], continuity.splits, split_at)


def sampled_call(call: CallRecord, held_ratio: str = "trainer") -> SampledCall | None:
    """A recorded call's tokens as vLLM returned them; None if its prompt or completion ids
    were not recorded (``CallTokens.trainable``): such a call is not trained. ``held_ratio``:
    TrainSettings' (where a call sampled under a grammar takes its ratio)."""
    tokens = call.tokens()
    if tokens is None or tokens.prompt is None or tokens.completions is None:
        return None
    free = held_ratio == "recorded" or not held(call.request)
    return SampledCall(tokens.prompt, tokens.completions, tokens.logprobs, free=free)


@dataclass(kw_only=True)
class Batch:
    """A step's training data: (sequence, advantage) pairs, and what went into them."""

    items: list[tuple[Sequence, float]]
    rewards: list[float]  # one per rewarded trajectory
    untokenized: int  # calls skipped: recorded without prompt or completion ids
    splits: int  # calls that started a new sequence of their trajectory (Merged.splits, summed)
    stale: int = 0  # calls skipped: sampled more than max_staleness steps before the trained one
    staleness: list[int] = field(default_factory=list)  # of each call trained: head - its sampling step
    call_rewards: int = 0  # calls that carried a reward of their own (credit per turn)
    split_reasons: dict[str, int] = field(default_factory=dict)  # core/learning/drift.py: why each split happened
    unrendered: int = 0  # calls the teacher could not be shown faithfully: not distilled
    lone: int = 0  # lone attempts trained, each against its kind's baseline


def lone_attempts(rows: list[TrainingCall]) -> dict[str, Attempt]:
    """The lone attempts among the claimed groups' calls (a group of one trajectory, rewarded;
    posted demonstrations apart), by trajectory: each one's kind of request (its first call's,
    core/learning/lone.py: kind_of) and its reward."""
    members: dict[str, set[str]] = {}
    first: dict[str, TrainingCall] = {}
    for row in rows:
        members.setdefault(row.group_id, set()).add(row.trajectory_id)
        first.setdefault(row.trajectory_id, row)
    out = {}
    for ids in members.values():
        if len(ids) != 1:
            continue
        row = first[next(iter(ids))]
        if row.reward is not None and row.call.status != DEMONSTRATION:
            out[row.trajectory_id] = Attempt(kind_of(row.call), row.reward)
    return out


def training_batch(
    rows: list[TrainingCall],
    settings: TrainSettings,
    head: int = 0,
    teacher_prompt: TeacherPrompt | None = None,
    demonstration: Callable[[CallRecord], Sequence | None] | None = None,
    lone: Mapping[str, float] | None = None,
) -> Batch:
    """The claimed groups' calls -> (sequence, advantage) pairs, advantages relative within each
    group, plus each call's credit per turn on its tokens. ``head``: the step the batch trains
    from (staleness is measured against it). Each sequence says which objectives train on it
    (``Sequence.grpo``, ``imitate``); with ``teacher_prompt``, each call gets its teacher's prompt;
    a posted demonstration becomes the sequence ``demonstration`` renders (trainer/demonstrations.py).
    ``lone``: the advantage of each lone attempt, by trajectory (core/learning/lone.py), taken
    in place of its group's (a group of one has none)."""
    weights = settings.weights
    by_trajectory: dict[str, dict[str, list[TrainingCall]]] = {}
    rewards: dict[str, float | None] = {}
    for row in rows:
        by_trajectory.setdefault(row.group_id, {}).setdefault(row.trajectory_id, []).append(row)
        rewards[row.trajectory_id] = row.reward
    trajectories: dict[str, dict[str, list[SampledCall]]] = {}
    records: dict[str, list[CallRecord]] = {}  # per trajectory, the records of its calls in ``trajectories``
    credited: set[str] = set()  # groups with a call's own reward that is not 0
    untokenized = splits = stale = unrendered = lone_trained = 0
    staleness: list[int] = []
    items: list[tuple[Sequence, float]] = []
    for group_id, group_rows in by_trajectory.items():
        for trajectory_id, calls in group_rows.items():
            # A call's credit counts the rewards of every later call, trained or not.
            credits = turn_credits([row.call_reward for row in calls], settings.turn_discount)
            members = trajectories.setdefault(group_id, {}).setdefault(trajectory_id, [])
            for row, credit in zip(calls, credits):
                if row.call.status == DEMONSTRATION:  # posted, not sampled: SFT alone trains it
                    shown = demonstration(row.call) if demonstration is not None else None
                    if shown is None:
                        untokenized += 1
                    else:
                        items.append((shown, 0.0))
                    continue
                call = sampled_call(row.call, settings.held_ratio)
                if call is None:
                    untokenized += 1
                    continue
                age = max(head - (row.call.policy_step or 0), 0)  # a rollback can leave samples "from the future"
                if settings.max_staleness is not None and age > settings.max_staleness:
                    stale += 1
                    continue
                staleness.append(age)
                call.credit = credit
                if credit:
                    credited.add(group_id)
                if teacher_prompt is not None:
                    call.teacher_prompt = teacher_prompt(row.call, call.prompt, row.followed)
                    unrendered += call.teacher_prompt is None
                members.append(call)
                records.setdefault(trajectory_id, []).append(row.call)
    reasons: Counter[str] = Counter()
    for group_id, group in trajectories.items():
        names = list(group)
        scores = [rewards[t] for t in names]
        rewarded = [r for r in scores if r is not None]
        complete = len(rewarded) == len(scores)  # a group that only distills may have no rewards
        alone = lone is not None and len(names) == 1 and names[0] in lone
        if alone:
            advantages = [lone[names[0]]]  # type: ignore[index]  # alone: lone is given
        elif complete:
            advantages = group_advantages(torch.tensor(rewarded), scale=settings.scale_advantages, eps=settings.advantage_eps).tolist()
        else:
            advantages = [0.0] * len(names)
        # GRPO learns from a group whose rewards differ, or a call's own reward; a tie is left
        # out of its term (it would only dilute it), as it is left out of readiness. A lone
        # attempt learns from how its reward differs from its kind's baseline.
        differ = advantages[0] != 0 if alone else complete and max(rewarded) > min(rewarded)
        grpo = weights.grpo > 0 and complete and (differ or group_id in credited)
        lone_trained += alone and grpo
        best = max(rewarded) if complete else None
        for name, advantage, reward in zip(names, advantages, scores):
            merged = build_sequences(group[name])
            splits += merged.splits
            reasons.update(split_reason(records[name][before], records[name][index]) for index, before in merged.split_at)
            for seq in merged.sequences:
                seq.grpo = grpo
                seq.imitate = weights.sft > 0 and reward is not None and reward == best and reward >= settings.sft_min_reward
                items.append((seq, advantage))
    posted = sum(row.call_reward is not None for row in rows)
    kept = [r for m in trajectories.values() for t in m if (r := rewards[t]) is not None]
    return Batch(
        items=items,
        rewards=kept,
        untokenized=untokenized,
        splits=splits,
        stale=stale,
        staleness=staleness,
        call_rewards=posted,
        split_reasons=dict(reasons),
        unrendered=unrendered,
        lone=lone_trained,
    )
