"""Who watches training beyond the store: Langfuse and the trackers (W&B, MLflow, TensorBoard),
behind one interface, so that the trainer tells each step and each decision once.

A watcher must not hold the trainer up: both queue what they are given and send it from their
own thread, dropping (and counting) what a full queue cannot take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from burnish_server.core.learning.promotion import DecisionRecord
from burnish_server.core.learning.steps import StepMetrics


@dataclass(frozen=True, slots=True)
class Step:
    """A training step the trainer recorded."""

    policy: str
    step: int
    parent: int
    groups: list[str]
    metrics: StepMetrics
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class Decision:
    """A candidate promoted or rejected, or a served version rolled back (core/learning/promotion.py)."""

    policy: str
    step: int
    record: DecisionRecord  # what was decided, by whom, why, and the test's figures


class Watcher(Protocol):
    def step(self, step: Step) -> None: ...

    def decision(self, decision: Decision) -> None: ...

    def close(self) -> None: ...


class Watchers:
    """Every configured watcher, told each step and decision in turn."""

    def __init__(self, watchers: Sequence[Watcher | None]) -> None:
        self.watchers = [w for w in watchers if w is not None]

    def step(self, step: Step) -> None:
        for watcher in self.watchers:
            watcher.step(step)

    def decision(self, decision: Decision) -> None:
        for watcher in self.watchers:
            watcher.decision(decision)

    def close(self) -> None:
        for watcher in self.watchers:
            watcher.close()
