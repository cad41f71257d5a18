"""From recorded calls to training sequences, using the token ids vLLM sampled.

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


@dataclass
class CallTokens:
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


def build_sequences(calls: Iterable[CallTokens]) -> list[Sequence]:
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
