"""Group states in SQL: the rule of ``core.learning.groups.group_state`` as expressions over the ``groups`` table.

Every query that asks what state a group is in (metrics, the training queue, RULER, policy
status) uses these, so the rule lives in two places only: here in SQL, there in Python.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from sqlalchemy import ColumnElement, and_, case, func, literal, select, union_all
from sqlalchemy.engine import Connection

from burnish_server.core.learning.groups import GroupState, Lack
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
    holds (``ix_groups_claimed``). One statement, so one snapshot. The trained ones are counted
    by the steps that trained them (store/policies.py)."""
    mine, waiting = Group.policy == policy, (Group.closed_at.is_not(None), Group.trained_at.is_(None))
    # Held out: a settled group by its lack (so the same group is held out, or not, in every
    # part), an unsettled one by its row's mark.
    held_out = case((Group.lacks.is_(None), Group.eval), else_=Group.lacks == int(Lack.HELD_OUT))
    parts = [
        select(literal("open"), held_out, func.count()).where(mine, Group.closed_at.is_(None)).group_by(held_out),
        select(literal("waiting"), Group.lacks == int(Lack.HELD_OUT), func.count()).where(mine, *waiting, Group.lacks.is_not(None)).group_by(Group.lacks),
        select(literal("waiting"), Group.eval, func.count()).where(mine, *waiting, Group.lacks.is_(None)).group_by(Group.eval),
        select(literal("taken"), held_out, func.count()).where(mine, is_training()).group_by(held_out),
    ]
    found: Counter[tuple[str, bool]] = Counter()
    for kind, held, n in conn.execute(union_all(*parts)):
        found[(kind, bool(held))] += n
    return Counts(
        open=found[("open", False)],
        closed=found[("waiting", False)] - found[("taken", False)],
        eval=found[("open", True)] + found[("waiting", True)],
    )
