"""A list of trajectories or groups, as asked: what it is narrowed to, and which page.

One definition for both doors that list them, the JSON API (``GET /v1/trajectories``, the
export) and the dashboard's lists: the gateway parses a query string into these once
(``gateway/edge/listing.py``), the store turns them into WHERE clauses and a keyset page
(``store/listing.py``).
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from burnish_server.core.learning.groups import GroupState

MAX_LIMIT = 1000  # rows a page may ask for


class Filters(msgspec.Struct, frozen=True, kw_only=True):
    """What a list is narrowed to; None: any. Ids are stored ids (``core/platform/access.py: qualify``).

    On a list of groups, the reward filters apply to the group's mean reward (``rewarded``:
    some member has one), ``eval`` to the group or any member, ``version`` to its members' calls.
    """

    project: str | None  # None: every project (an admin's dashboard)
    group_id: str | None = None
    rewarded: bool | None = None
    eval: bool | None = None  # held out, or trained on
    policy: str | None = None  # on trajectories: one of its calls was answered by it
    version: int | None = None  # a step of ``policy`` that answered one of the calls
    state: GroupState | None = None  # the group's; a trajectory outside any group has none
    reward_min: float | None = None
    reward_max: float | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


class Keyset(msgspec.Struct, frozen=True, kw_only=True):
    """Which page: ``limit`` rows, newest first unless ``descending`` is false, after the row
    whose stored id is ``after`` (the last of the page before). Keyset, not offset: a page costs
    the same at row one million as at row one."""

    limit: int
    after: str | None = None
    descending: bool = True
