"""How long a project's recorded trajectories are kept: its retention setting.

A project's setting (``Retention``) is kept in the store and set over the admin API
(``PUT /admin/projects/{project}/retention``); a project without one takes the server's
default, ``BURNISH_RETENTION_DAYS`` (0, the default: keep everything). Nothing is ever
removed by a setting alone: ``burnish db prune`` applies them, archiving first
(``core/platform/archive.py``), when an operator (or their scheduler) runs it.

What prune never removes, whatever the setting (``store/retention.py``):

- a trajectory active since the cutoff (a call, a reward), nor any member of a group with
  one: a group goes whole or not at all, so a group never trains on part of its members;
- a group still open, being trained, or ready and waiting to train;
- unless ``prune_trained`` (or ``burnish db prune --include-trained``), a group that a kept
  version of its policy trained on: the version it serves, its head, its candidate, any
  version promoted, and every version these were trained from (their parents, back to the
  base).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Literal

import msgspec

# Days are a positive number (a fraction is hours); at most a century.
MAX_DAYS = 36_500.0
Days = Annotated[float, msgspec.Meta(gt=0, le=MAX_DAYS, description="days to keep a trajectory after its last call or reward: more than 0, at most 36500")]


class Retention(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A project's retention: the body of ``PUT /admin/projects/{project}/retention``."""

    # Keep a trajectory this many days after its last call or reward; null: the server's
    # default (BURNISH_RETENTION_DAYS), which 0 turns off (keep everything).
    days: Days | None = None
    # Also remove what a kept version trained on, once it is that old (off: kept for as long
    # as the version is).
    prune_trained: bool = False


class RetentionView(msgspec.Struct, kw_only=True):
    """A project's retention as it applies: its own setting, or the server's default."""

    project: str
    # The project's own setting (null: none, the default applies).
    days: float | None
    prune_trained: bool
    # What `burnish db prune` applies to it: the project's days, else the server's default;
    # null: nothing is removed.
    effective_days: float | None
    source: Literal["project", "default", "none"]
    updated_at: datetime | None = None


def effective(setting: Retention | None, default_days: float) -> tuple[float | None, Literal["project", "default", "none"]]:
    """The days that apply to a project with ``setting`` (None: it has none) on a server whose
    default is ``default_days`` (0: keep everything), and where they come from."""
    if setting is not None and setting.days is not None:
        return setting.days, "project"
    if default_days > 0:
        return default_days, "default"
    return None, "none"


def check_days(days: float) -> float:
    """``days`` if it is a number of days prune accepts, else ValueError saying why."""
    if not days == days or days in (float("inf"), float("-inf")):  # NaN, infinity
        raise ValueError(f"days must be a number, not {days}")
    if not 0 < days <= MAX_DAYS:
        raise ValueError(f"days must be more than 0 and at most {MAX_DAYS:g}, not {days:g}")
    return days


def cutoff(now: datetime, days: float) -> datetime:
    """The moment before which a trajectory's last activity makes it old enough to remove."""
    return now - timedelta(days=check_days(days))
