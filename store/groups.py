"""Group states in SQL: the rule of ``core.groups.group_state`` as expressions over the ``groups`` table.

Every query that asks what state a group is in (metrics, the training queue, RULER, policy
status) uses these, so the rule lives in two places only: here in SQL, there in Python.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from sqlalchemy import ColumnElement, and_, case, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import InstrumentedAttribute

from burnish_server.core.groups import GroupState, Lack
from burnish_server.store.models import Group

STATE = case(
    (Group.trained_at.is_not(None), GroupState.TRAINED.value),
    (Group.claimed_by.is_not(None), GroupState.TRAINING.value),
    (Group.closed_at.is_not(None), GroupState.CLOSED.value),
    else_=GroupState.OPEN.value,
)


def is_closed() -> ColumnElement[bool]:
    """Closed and not yet taken by a trainer (claimed or trained)."""
    return and_(Group.closed_at.is_not(None), Group.claimed_by.is_(None), Group.trained_at.is_(None))


def is_training() -> ColumnElement[bool]:
    return and_(Group.claimed_by.is_not(None), Group.trained_at.is_(None))


class Counts(NamedTuple):
    """A policy's groups by state, as its status shows them."""

    open: int  # not held out
    closed: int  # not held out, closed and not taken by a trainer
    eval: int  # held out and not trained (a mark that came after a step took the group leaves it trained)


def counts(conn: Connection, policy: str) -> Counts:
    """Each state counted from its own index, so that the cost follows the groups that are open
    or wait, not the policy's history: the open ones (``ix_groups_open``); those closed and
    waiting, by what they lack, from ``ix_groups_waiting`` alone (a held-out group lacks
    ``HELD_OUT``; the few a late call unsettled are read from their rows); less those a trainer
    holds (``ix_groups_claimed``). The trained ones are counted by the steps that trained them
    (store/policies.py)."""
    mine, waiting = Group.policy == policy, (Group.closed_at.is_not(None), Group.trained_at.is_(None))
    held_out = Group.lacks == int(Lack.HELD_OUT)

    def by_held_out(key: ColumnElement[bool] | InstrumentedAttribute[bool], *where: ColumnElement[bool]) -> Counter[bool]:
        return Counter({bool(k): n for k, n in conn.execute(select(key, func.count()).where(mine, *where).group_by(key))})

    opened = by_held_out(Group.eval, Group.closed_at.is_(None))
    waits = by_held_out(held_out, *waiting, Group.lacks.is_not(None)) + by_held_out(Group.eval, *waiting, Group.lacks.is_(None))
    taken = by_held_out(Group.eval, is_training())
    return Counts(open=opened[False], closed=waits[False] - taken[False], eval=opened[True] + waits[True])
