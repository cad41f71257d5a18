"""Group states in SQL: the rule of ``core.groups.group_state`` as expressions over the ``groups`` table.

Every query that asks what state a group is in (metrics, the training queue, RULER, policy
status) uses these, so the rule lives in two places only: here in SQL, there in Python.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, case

from burnish_server.core.groups import GroupState
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
