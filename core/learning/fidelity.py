"""Is the version vLLM serves the one the trainer made? A checkpoint carries a probe: a few of
its step's own sequences and the trainer's log-probability of each of their tokens under the
adapter it saved. Before a version is served (or put on trial, or caught up on a replica, or
rolled back to), vLLM's log-probabilities of the same tokens under the loaded adapter must
agree with them within a noise floor: two engines computing one model differ by rounding
(measured in docs/trainer.md), another step's weights by far more.
"""

from __future__ import annotations

import msgspec

# Sequences and tokens a probe holds: enough tokens that one wrong layer shows, few enough
# that vLLM scores them in one short request (a few ms on a CPU).
PROBE_SEQUENCES = 2
PROBE_TOKENS = 96
# The mean |logprob gap| past which vLLM serves other weights than the trainer made, by the
# trainer's dtype. In float32 the two engines computing one adapter differ by rounding alone:
# 5e-7 on the tiny model, 7e-6 to 9e-6 on SmolLM2 (docs/trainer.md), so 1e-3 leaves a hundred
# times that; another step's weights were 0.19-0.27 away on the tiny model. In 16 bits the
# engines' kernels round differently, up to ~0.05 between two bf16 engines (docs/trainer.md).
NOISE_FLOORS = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}


class Probe(msgspec.Struct, frozen=True, kw_only=True):
    """Token ids, and the trainer's log p(ids[t] | ids[:t]) for t >= 1, one list per sequence."""

    sequences: list[list[int]]
    logprobs: list[list[float]]
    dtype: str  # the trainer's compute dtype: float32 on a CPU, bfloat16 on most GPUs

    @property
    def tokens(self) -> int:
        return sum(len(lp) for lp in self.logprobs)


def noise_floor(probe: Probe) -> float:
    return NOISE_FLOORS.get(probe.dtype, max(NOISE_FLOORS.values()))


class Fidelity(msgspec.Struct, frozen=True, kw_only=True):
    """How far vLLM's log-probabilities were from the trainer's, over ``tokens`` tokens."""

    mean_abs: float
    max_abs: float
    tokens: int

    def within(self, tolerance: float) -> bool:
        return self.mean_abs <= tolerance

    def __str__(self) -> str:
        return f"mean |logprob - trainer's| {self.mean_abs:.2e} (max {self.max_abs:.2e}) over {self.tokens} tokens"


def compare(probe: Probe, served: list[list[float]]) -> Fidelity:
    """vLLM's log-probabilities (``served``, as the probe's) against the probe's."""
    gaps = [abs(a - b) for mine, theirs in zip(probe.logprobs, served, strict=True) for a, b in zip(mine, theirs, strict=True)]
    return Fidelity(mean_abs=sum(gaps) / len(gaps) if gaps else 0.0, max_abs=max(gaps, default=0.0), tokens=len(gaps))
