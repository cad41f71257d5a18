"""A judge's verdict on one trajectory of a group (RULER): a score in [0, 1] and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Score:
    score: float
    explanation: str
