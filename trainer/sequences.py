"""From recorded calls to training sequences, using the token ids vLLM sampled.

    recorded call ──(its token ids; else its conversation through the chat template)──▶ SampledCall
    a trajectory's SampledCalls ──(merged where each prompt extends the last)──▶ Sequences
    a group's rewards ──(group-relative advantages, trainer/grpo.py)──▶ (Sequence, advantage) pairs

A trajectory's calls become as few sequences as possible: a call whose prompt token
ids start with everything so far (the previous prompt and completion) extends that
sequence, so a multi-turn episode trains as one. A call whose prompt does not (the
agent rewrote its history, or the chat template re-tokenised a reply differently)
starts a new sequence. Only sampled tokens are trained on (mask 1); prompt tokens,
tool results and user turns are context (mask 0).

A call with several choices (n > 1) gives one sequence per choice: each is its own
sample of the same prompt, and is not merged with other calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from burnish_server.core.policies import TrainSettings
from burnish_server.core.records import CallRecord
from burnish_server.core.transcript import UnreadableCall, exchange
from burnish_server.store.training import TrainingCall
from burnish_server.trainer.grpo import group_advantages


@dataclass
class SampledCall:
    """What the trainer needs from one recorded call."""

    prompt: list[int]
    completions: list[list[int]]  # one per choice
    logprobs: list[list[float]] | None  # the behaviour policy's, aligned with completions
    from_template: bool = False  # no recorded ids: rebuilt with the tokenizer's chat template


@dataclass
class Sequence:
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 where the token was sampled
    behaviour_logprobs: list[float] = field(default_factory=list)  # 0.0 where mask is 0
    has_behaviour_logprobs: bool = True
    calls: int = 0
    from_template: bool = False

    def add(self, context: list[int], sampled: list[int], logprobs: list[float] | None) -> None:
        self.tokens += context + sampled
        self.mask += [0] * len(context) + [1] * len(sampled)
        self.behaviour_logprobs += [0.0] * len(context) + (list(logprobs) if logprobs is not None else [0.0] * len(sampled))
        self.has_behaviour_logprobs &= logprobs is not None
        self.calls += 1

    @property
    def sampled(self) -> int:
        return sum(self.mask)


def build_sequences(calls: Iterable[SampledCall]) -> list[Sequence]:
    """One trajectory's calls, in order, into training sequences."""
    done: list[Sequence] = []
    current: Sequence | None = None
    for call in calls:
        if len(call.completions) != 1:
            for i, completion in enumerate(call.completions):
                seq = Sequence(from_template=call.from_template)
                seq.add(call.prompt, completion, call.logprobs[i] if call.logprobs else None)
                done.append(seq)
            continue
        completion = call.completions[0]
        logprobs = call.logprobs[0] if call.logprobs else None
        if current is not None and call.prompt[: len(current.tokens)] == current.tokens:
            current.add(call.prompt[len(current.tokens) :], completion, logprobs)
            current.from_template |= call.from_template
            continue
        if current is not None:
            done.append(current)
        current = Sequence(from_template=call.from_template)
        current.add(call.prompt, completion, logprobs)
    if current is not None:
        done.append(current)
    return [s for s in done if s.sampled > 0]


def sampled_call(call: CallRecord, tokenizer: Any) -> SampledCall | None:
    """A recorded call's tokens: the ids vLLM returned, else its conversation rendered with the
    chat template (a non-vLLM upstream, an endpoint without ids). None if neither can be had."""
    tokens = call.tokens()
    if tokens is not None and tokens.prompt is not None and tokens.completions is not None:
        return SampledCall(tokens.prompt, tokens.completions, tokens.logprobs)
    try:
        turn = exchange(call)
    except UnreadableCall:
        return None
    if not turn.answers:
        return None
    messages = [m.chat() for m in turn.prompt]
    prompt = tokenizer.apply_chat_template(messages, tools=turn.tools, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    completions = []
    for answer in turn.answers:
        # The answer as the template writes it after the prompt (tool calls included); its
        # own text if the template does not extend the prompt.
        whole = tokenizer.apply_chat_template([*messages, answer.chat()], tools=turn.tools, tokenize=False)
        text = whole[len(prompt) :] if whole.startswith(prompt) else answer.content
        completions.append(tokenizer.encode(text, add_special_tokens=False))
    return SampledCall(prompt_ids, completions, None, from_template=True)


@dataclass
class Batch:
    """A step's training data: (sequence, advantage) pairs, and what went into them."""

    items: list[tuple[Sequence, float]]
    rewards: list[float]  # one per trajectory
    template_fallbacks: int  # calls rebuilt with the chat template
    unreadable: int  # calls skipped: neither token ids nor a readable conversation


def training_batch(rows: list[TrainingCall], tokenizer: Any, settings: TrainSettings) -> Batch:
    """The claimed groups' calls -> (sequence, advantage) pairs, advantages relative within each group."""
    trajectories: dict[str, dict[str, list[SampledCall]]] = {}
    rewards: dict[str, float] = {}
    fallbacks = unreadable = 0
    for row in rows:
        call = sampled_call(row.call, tokenizer)
        members = trajectories.setdefault(row.group_id, {}).setdefault(row.trajectory_id, [])
        rewards[row.trajectory_id] = row.reward
        if call is None:
            unreadable += 1
            continue
        fallbacks += call.from_template
        members.append(call)
    items: list[tuple[Sequence, float]] = []
    for group in trajectories.values():
        names = list(group)
        advantages = group_advantages(torch.tensor([rewards[t] for t in names]), scale=settings.scale_advantages, eps=settings.advantage_eps)
        for name, advantage in zip(names, advantages.tolist()):
            items += [(seq, advantage) for seq in build_sequences(group[name])]
    return Batch(items, [rewards[t] for m in trajectories.values() for t in m], fallbacks, unreadable)
