"""How rewards become each sampled token's advantage, defined once for the trainer and the dashboard.

    a group's trajectory rewards ──(group_advantages)──▶ one advantage per trajectory
    a trajectory's call rewards ──(turn_credits)──▶ one credit per call, added on its tokens
    a call's recorded logprobs ──(trained_mask)──▶ which of its sampled tokens the loss sees

The trainer (``trainer/sequences.py``) builds its batch with these; the dashboard shows a
call's tokens with the same figures, so what it shows is what a step trained on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# A sampled token whose recorded logprob is 0 had no alternative: a grammar allowed no other
# (structured outputs; the fixed parts of a forced tool call, such as "<tool_call>" and the
# tool's name). vLLM records logprobs after the grammar's mask, so such a token's recorded
# logprob is no behaviour probability to take a ratio against (the trainer's own, unmasked, is
# often -3 or lower), and under the grammar it is certain whatever the weights: its gradient is
# 0. It stays in the sequence as context, and is not trained on (``forced_tokens`` counts them).
FORCED_LOGPROB = -1e-6


def group_advantages(rewards: Sequence[float], *, scale: bool = True, eps: float = 1e-4) -> list[float]:
    """One group's rewards -> advantages: centred on the group mean, scaled by its std.

    The std is the sample std (n - 1), as TRL computes it, so the two can be compared.
    A group whose rewards are all equal has advantages of 0: it teaches nothing.
    """
    mean = math.fsum(rewards) / len(rewards) if rewards else 0.0
    centred = [r - mean for r in rewards]
    if not scale or len(rewards) < 2:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (len(rewards) - 1))
    return [c / (std + eps) for c in centred]


def turn_credits(call_rewards: Sequence[float | None], discount: float) -> list[float]:
    """One trajectory's calls, in order, each with the reward posted for it alone (None if
    none) -> each call's credit: the discounted sum of the call rewards at and after it.

    Credit per turn is added to the trajectory's group-relative advantage, not normalised
    with it: a call's reward moves its own call's advantage and, discounted, its
    trajectory's earlier calls', and nothing else (tests/trainer/test_grpo.py). So call rewards are
    in the advantage's units (the group's standard deviations of reward, where advantages
    are scaled): +0.5 for a call that did its part, -0.5 for one that did not."""
    credits, ahead = [0.0] * len(call_rewards), 0.0
    for t in range(len(call_rewards) - 1, -1, -1):
        ahead = (call_rewards[t] or 0.0) + discount * ahead
        credits[t] = ahead
    return credits


def trained_mask(sampled: int, logprobs: Sequence[float] | None) -> list[int]:
    """Which of a completion's ``sampled`` tokens the loss sees: all, except those a grammar
    forced (FORCED_LOGPROB). Without recorded logprobs, every sampled token."""
    if logprobs is None:
        return [1] * sampled
    return [int(lp < FORCED_LOGPROB) for lp in logprobs]
