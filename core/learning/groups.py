"""A group's state, defined once.

A group is a set of trajectories answering one task. It moves forward only:

    open ──(all expected members rewarded, POST /close, a RULER verdict, or idle)──▶ closed
    closed ──(a trainer claims it)──▶ training ──(its step is recorded)──▶ trained
                                       └──(the step fails, or its lease ends)──▶ closed

A closed group is *ready* for training when every member has a reward and the rewards are
not all equal (equal rewards give zero advantages: nothing to learn), for a policy that
trains on GRPO alone; with supervised steps, every member rewarded is enough, and with
distillation a closed group is ready as it is (core/learning/policies.py: Objective). What a closed
group lacks (``Lack``) is settled once when it closes, since its rewards can no longer change,
and kept on its row, so that the training queue reads a ready group as one index entry
(``store/training.py``). A group idle for its policy's ``group_idle_close_s`` (no member's call,
no reward) closes by itself, so an agent that never says how many attempts a task gets, or
whose last attempt died, still trains. A closed group that can never train says why
(``cannot_train``).

A group of one member is a *lone attempt*: traffic that answers each request once (the gateway
files a policy's call that names no group so: a group of its own, named after its trajectory,
of size 1). With its reward it trains against a baseline instead of its group's mean
(core/learning/lone.py); without one, it *expires* when idle for ``group_idle_close_s``
(close_reason "expired"), and a reward that comes after is kept but never trained on.
"""

from __future__ import annotations

import enum
from datetime import datetime

from burnish_server.core.learning.policies import Objective


class Lack(enum.IntEnum):
    """What a closed group lacks to train, worst last: a policy's objective tolerates up to some
    level (``tolerated``). Rewards of a closed group can no longer change (only a RULER verdict
    rewrites them), so this is settled when it closes and stays true; a call that arrives after
    (a member joining late, a mark for evaluation) makes the store settle it again."""

    NOTHING = 0  # every member rewarded, and rewards that differ or a call's own reward
    PEERS = 1  # one member, rewarded: a lone attempt, which trains against a baseline where the policy's lone_baseline is set
    SPREAD = 2  # every member rewarded alike, and no call's own reward: a tie
    REWARDS = 3  # some member has no reward (or a lone attempt expired unrewarded)
    HELD_OUT = 4  # a member is held out for evaluation: never trained on


# The close reason of a lone attempt that saw no reward (and no call) for its policy's
# group_idle_close_s: it never trains on a reward, whatever reward comes after.
EXPIRED = "expired"
# The close reason of a lone attempt whose follow-up came (core/learning/followups.py) with no
# reward, for a policy whose teacher learns from it (Teacher.hindsight): it distills, and a
# reward that comes after is kept, never trained on, as an expired one's.
FOLLOWED = "followed"
# Closed without a reward, for good.
UNREWARDED = (EXPIRED, FOLLOWED)


def tolerated(objective: Objective, lone: bool = True) -> Lack:
    """The worst ``Lack`` a group may have and still train the objective: GRPO alone needs
    rewards that differ (or, ``lone``, a lone attempt's reward), supervised steps every member
    rewarded, distillation alone nothing."""
    if not objective.needs_rewards:
        return Lack.REWARDS
    if objective.needs_spread:
        return Lack.PEERS if lone else Lack.NOTHING
    return Lack.SPREAD


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


def cannot_train(
    *,
    size: int,
    rewarded: int,
    low: float | None,
    high: float | None,
    credited: bool,
    held_out: bool,
    objective: Objective = Objective(),
    demonstration: bool = False,
    lone: bool = True,
    expired: bool = False,
    followed: bool = False,
) -> str | None:
    """Why a closed group will never be trained, in words a user can act on; None where it
    can be. The same rule as readiness in ``store/training.py``: every member rewarded, and
    rewards that differ or a call's own reward to learn from; less where the policy's
    objective asks less (core/learning/policies.py: Objective). ``followed``: a lone attempt
    completed by its follow-up, for a policy whose teacher learns from it: it distills."""
    if held_out:
        return "held out for evaluation: scored, never trained on"
    if followed:
        return None
    if demonstration:
        return None if objective.sft > 0 else "a demonstration: it trains a policy whose train.objective gives sft a weight"
    if not objective.needs_rewards:
        return None
    if expired:
        return "a lone attempt whose reward did not come within its policy's group_idle_close_s: expired, never trained on (a reward posted later is kept)"
    if rewarded < size:
        return f"{size - rewarded} of its {size} members have no reward: every member needs one (post it, or let RULER score the group)"
    if credited or not objective.needs_spread:
        return None
    if size == 1:
        if lone:
            return None
        return "one member, and the policy's train.lone_baseline is off: a lone attempt trains only against a baseline (set train.lone_baseline, or give a task several attempts in one group)"
    if low == high:
        return f"every member has the same reward ({low:g}): equal rewards give zero advantages, so there is nothing to learn from the group"
    return None
