"""A group's state, defined once.

A group is a set of trajectories answering one task. It moves forward only:

    open ──(all expected members rewarded, POST /close, or a RULER verdict)──▶ closed
    closed ──(a trainer claims it)──▶ training ──(its step is recorded)──▶ trained
                                       └──(the step fails, or its lease ends)──▶ closed

A closed group is *ready* for training when every member has a reward and the rewards are
not all equal (equal rewards give zero advantages: nothing to learn). Readiness depends on
the members, so the store computes it in SQL (``store/groups.py``, beside the same states
as SQL expressions).
"""

from __future__ import annotations

import enum
from datetime import datetime


class GroupState(enum.StrEnum):
    OPEN = "open"
    CLOSED = "closed"
    TRAINING = "training"
    TRAINED = "trained"


def group_state(closed_at: datetime | None, claimed_by: str | None, trained_at: datetime | None) -> GroupState:
    """The state of a group from its row's columns (the same rule as ``store.groups.STATE``)."""
    if trained_at is not None:
        return GroupState.TRAINED
    if claimed_by is not None:
        return GroupState.TRAINING
    if closed_at is not None:
        return GroupState.CLOSED
    return GroupState.OPEN


def rewards_final(state: GroupState) -> bool:
    """A group being trained or trained has its rewards in a step: they can no longer change."""
    return state in (GroupState.TRAINING, GroupState.TRAINED)
