"""Lone attempts: what a trajectory answered once (no group of attempts to compare it with) learns from.

Traffic in production answers each request once. The gateway files such a call in a group of
its own (core/learning/groups.py: a group of one, which lacks ``PEERS``), and GRPO's group mean,
the baseline a reward is compared with, is then the reward itself: nothing to learn. A lone
attempt's advantage is instead taken against a baseline of its *kind* of request, the requests
that share a system prompt and a tool set (one agent, one task), as REINFORCE does:

    advantage = (reward - baseline_kind) / (spread_kind + eps)      (spread: with scale_advantages),
                cut at +-LONE_ADVANTAGE_LIMIT

where the baseline is, by the policy's ``train.lone_baseline``:

    kept    a running mean and spread of the kind's rewards (``Baseline``), kept in the store
            (``store/baselines.py``) and moved by each step's lone rewards after it trained, so
            that several trainers agree and a restart loses nothing. Until the kind has
            ``LONE_MIN_KEPT`` rewards, the step's own lone attempts of the kind stand in.
    step    the step's lone attempts of the kind: their mean and spread (a group made of the
            kind's attempts at different tasks).

The baseline is read before the step's rewards move it, so no reward is compared with itself.
The running statistics follow the policy as it improves: each reward weighs at least
1 / ``LONE_WINDOW`` (an exponential moving average once the kind has that many).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import msgspec

from burnish_server.core.protocols.records import CallRecord
from burnish_server.core.protocols.transcript import UnreadableCall, exchange

# Rewards a kind's kept baseline needs before it is used (the step's own lone attempts stand in before).
LONE_MIN_KEPT = 8
# The running statistics' memory, in rewards: older ones fade at 1 - 1/LONE_WINDOW a reward.
LONE_WINDOW = 64
# The largest advantage a lone attempt takes, either way: a kind whose kept rewards barely
# varied has a spread near 0, and one reward off its mean would otherwise weigh thousands.
LONE_ADVANTAGE_LIMIT = 4.0


class Baseline(msgspec.Struct, frozen=True, kw_only=True):
    """A kind's rewards so far: how many, their running mean and variance."""

    count: int = 0
    mean: float = 0.0
    variance: float = 0.0

    def moved(self, rewards: Sequence[float]) -> Baseline:
        """The statistics with ``rewards`` seen, one at a time (Welford's update, weighted
        at least 1 / LONE_WINDOW)."""
        count, mean, variance = self.count, self.mean, self.variance
        for reward in rewards:
            count += 1
            weight = max(1.0 / count, 1.0 / LONE_WINDOW)
            delta = reward - mean
            mean += weight * delta
            variance = (1 - weight) * (variance + weight * delta * delta)
        return Baseline(count=count, mean=mean, variance=variance)

    @property
    def usable(self) -> bool:
        return self.count >= LONE_MIN_KEPT


def kind_of(call: CallRecord) -> str:
    """A lone attempt's kind: a digest of its first call's system messages and the names of the
    tools it offered, so that one agent's requests share a baseline and another agent's (another
    system prompt, other tools) keep their own. A call that cannot be read is of the kind ""."""
    try:
        turn = exchange(call)
    except UnreadableCall:
        return ""
    system = [m.content for m in turn.prompt if m.role in ("system", "developer")]
    tools = sorted(str(t.get("function", {}).get("name", "")) for t in turn.tools or [] if isinstance(t, dict))
    digest = hashlib.blake2b(msgspec.json.encode([system, tools]), digest_size=8).hexdigest()
    return digest


class Attempt(NamedTuple):
    """A lone attempt of a step: its kind of request and its reward."""

    kind: str
    reward: float


def lone_advantages(attempts: Mapping[str, Attempt], kept: Mapping[str, Baseline] | None, *, scale: bool = True, eps: float = 1e-4) -> dict[str, float]:
    """The advantage of each of a step's lone attempts (by trajectory), against its kind's
    baseline: the kept one (``kept`` given, and usable for the kind), else the step's attempts
    of the kind. A kind with one attempt in the step and no usable kept baseline gets 0:
    nothing to compare it with."""
    by_kind: dict[str, list[float]] = {}
    for attempt in attempts.values():
        by_kind.setdefault(attempt.kind, []).append(attempt.reward)
    stats: dict[str, tuple[float, float] | None] = {}
    for kind, own in by_kind.items():
        baseline = (kept or {}).get(kind)
        if baseline is not None and baseline.usable:
            stats[kind] = (baseline.mean, math.sqrt(max(baseline.variance, 0.0)))
        elif len(own) >= 2:
            mean = math.fsum(own) / len(own)
            stats[kind] = (mean, math.sqrt(math.fsum((r - mean) ** 2 for r in own) / (len(own) - 1)))
        else:
            stats[kind] = None
    out = {}
    for trajectory, (kind, reward) in attempts.items():
        found = stats[kind]
        if found is None:
            out[trajectory] = 0.0
            continue
        mean, spread = found
        advantage = (reward - mean) / (spread + eps) if scale else reward - mean
        out[trajectory] = max(-LONE_ADVANTAGE_LIMIT, min(LONE_ADVANTAGE_LIMIT, advantage))
    return out


def moved_baselines(kept: Mapping[str, Baseline], attempts: Mapping[str, Attempt]) -> dict[str, Baseline]:
    """The kinds' baselines once a step trained ``attempts``: what the store keeps after it."""
    by_kind: dict[str, list[float]] = {}
    for attempt in attempts.values():
        by_kind.setdefault(attempt.kind, []).append(attempt.reward)
    return {kind: kept.get(kind, Baseline()).moved(rewards) for kind, rewards in by_kind.items()}
