"""A list's query string, parsed once for both doors: the JSON API (``GET /v1/trajectories``,
its export) and the dashboard's lists (``/ui/trajectories``, ``/ui/groups``).

Two Litestar dependencies, ``filters`` (what the list is narrowed to: ``core/listing.py:
Filters``) and ``keyset`` (which page: ``Keyset``), registered on the app: a handler names
``filters: NamedDependency[Filters]`` and gets it checked, and the API's OpenAPI schema shows
every parameter. A value that does not parse is an ``Invalid`` (400 ``invalid_request``, its
``param`` the field), which the API answers in its error format and the dashboard as a page.

One vocabulary on both doors. An empty filter means "any" (an HTML form sends its empty
fields). Times are Unix seconds or ISO 8601 (a form's ``YYYY-MM-DDTHH:MM``; without a zone,
UTC, as the pages show times). ``after`` is the last id of the page before. The project is
the caller's; only the admin token (or a key with the admin scope) may name another, and on
the dashboard an admin's list is every project's (``all``) unless one is named, its rows and
its ``after`` by stored id. A route's ``opt["listing"]`` (a ``Door``) says which door it is.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated

import msgspec
from litestar import Request
from litestar.di import NamedDependency, Provide
from litestar.params import QueryParameter

from burnish_server.core.access import Principal, is_project, local, project_of, qualify
from burnish_server.core.errors import Invalid
from burnish_server.core.groups import GroupState
from burnish_server.core.ids import ID_PATTERN, ID_RULE
from burnish_server.core.listing import MAX_LIMIT, Filters, Keyset

ALL = "all"  # the dashboard's every-project list, an admin's
OPT = "listing"  # the route's opt key holding its Door
UNIX_MAX = 1e11  # seconds: past any date a trajectory has


class Door(msgspec.Struct, frozen=True, kw_only=True):
    """How a route lists: its page's size unless asked, and whether an admin's list is every project's by default."""

    limit: int = 100
    every_project: bool = False  # the dashboard; the API's answers carry ids local to one project


API = Door()
DASHBOARD = Door(limit=50, every_project=True)


def _door(request: Request) -> Door:
    door: Door = request.route_handler.opt.get(OPT, API)
    return door


def _invalid(name: str, message: str) -> Invalid:
    return Invalid(f"{name}: {message}", "invalid_request", name)


def _flag(name: str, value: str, meaning: str = "") -> bool:
    match value.lower():
        case "true" | "1":
            return True
        case "false" | "0":
            return False
    raise _invalid(name, f"true or false{meaning} ({value!r})")


def _number(name: str, value: str) -> float:
    try:
        out = float(value)
    except ValueError:
        out = math.nan
    if not math.isfinite(out):
        raise _invalid(name, f"not a number ({value!r})")
    return out


def _when(name: str, value: str) -> datetime:
    try:
        seconds = float(value)
    except ValueError:
        try:
            out = datetime.fromisoformat(value)
        except ValueError:
            raise _invalid(name, f"not a date and time ({value!r}); use YYYY-MM-DDTHH:MM or Unix seconds") from None
        return out if out.tzinfo else out.replace(tzinfo=UTC)
    if not 0 <= seconds < UNIX_MAX:
        raise _invalid(name, f"Unix seconds from 0 to {UNIX_MAX:.0e} ({value!r})")
    return datetime.fromtimestamp(seconds, UTC)


def _id(name: str, value: str, what: str) -> str:
    if not ID_PATTERN.fullmatch(value):
        raise _invalid(name, f"not a {what} ({value[:140]!r}): use {ID_RULE}")
    return value


def _named(name: str, value: str, project: str | None) -> str:
    """A trajectory's or group's id as stored: in one project's list, an id of that project; in
    every project's, a stored id (its project, "/", its id)."""
    if project is not None:
        return qualify(project, _id(name, value, "trajectory or group id"))
    _id(name, local(value), "trajectory or group id")
    if "/" in value and not is_project(project_of(value)):
        raise _invalid(name, f"not a stored id ({value[:140]!r})")
    return value


def _project(caller: Principal, value: str, door: Door) -> str | None:
    """The project listed; None: every project. A key reads its own; an admin any, or all where the door lists every project."""
    if not caller.can("admin"):
        if value and value != caller.project:
            raise _invalid("project", "a key reads its own project only")
        return caller.project
    if value == ALL or (not value and door.every_project):
        if not door.every_project:
            raise _invalid("project", "name one project")
        return None
    if value and not is_project(value):
        raise _invalid("project", f"not a project name ({value[:140]!r})")
    return value or caller.project


Text = str | None  # each parameter as sent: parsed here, so that both doors read it alike
_TIME = "Unix seconds, or ISO 8601 (without a zone: UTC)"


def filters(
    request: Request,
    caller: NamedDependency[Principal],
    project: Annotated[Text, QueryParameter(description=f"another project (admin only); on the dashboard `{ALL}`")] = None,
    group_id: Annotated[Text, QueryParameter(description=f"only this group's members: {ID_RULE}")] = None,
    rewarded: Annotated[Text, QueryParameter(description="true: only rewarded; false: only not yet rewarded")] = None,
    eval: Annotated[Text, QueryParameter(description="true: only held out; false: only trained on")] = None,
    policy: Annotated[Text, QueryParameter(description="only trajectories with a call this policy answered")] = None,
    version: Annotated[Text, QueryParameter(description="with policy: only those it answered at this step")] = None,
    group_state: Annotated[Text, QueryParameter(query="state", description=f"only those whose group is {', '.join(s.value for s in GroupState)}")] = None,
    reward_min: Annotated[Text, QueryParameter(description="only a reward at least this (a group: its mean)")] = None,
    reward_max: Annotated[Text, QueryParameter(description="only a reward at most this (a group: its mean)")] = None,
    created_after: Annotated[Text, QueryParameter(description=f"only created after this time: {_TIME}")] = None,
    created_before: Annotated[Text, QueryParameter(description=f"only created before this time: {_TIME}")] = None,
) -> Filters:
    """What a list is narrowed to, from its query string."""

    def given(value: str | None) -> str:
        return (value or "").strip()[:200]

    listed = _project(caller, given(project), _door(request))
    group = given(group_id)
    chosen = given(policy)
    step = given(version)
    if step and not (step.isascii() and step.isdigit() and len(step) <= 9):
        raise _invalid("version", f"not a step number ({step!r})")
    if step and not chosen:
        raise _invalid("version", "name the policy too")
    phase = given(group_state)  # `state` is a name Litestar keeps for the app's state
    if phase and phase not in {s.value for s in GroupState}:
        raise _invalid("state", f"one of {', '.join(s.value for s in GroupState)}")
    use = given(eval)
    return Filters(
        project=listed,
        group_id=_named("group_id", group, listed) if group else None,
        rewarded=_flag("rewarded", given(rewarded)) if given(rewarded) else None,
        eval=_flag("eval", use, " (held out or trained on)") if use else None,
        policy=_id("policy", chosen, "policy name") if chosen else None,
        version=int(step) if step else None,
        state=GroupState(phase) if phase else None,
        reward_min=_number("reward_min", given(reward_min)) if given(reward_min) else None,
        reward_max=_number("reward_max", given(reward_max)) if given(reward_max) else None,
        created_after=_when("created_after", given(created_after)) if given(created_after) else None,
        created_before=_when("created_before", given(created_before)) if given(created_before) else None,
    )


_LIMIT = re.compile(r"[0-9]{1,4}")


def keyset(
    request: Request,
    filters: NamedDependency[Filters],
    limit: Annotated[Text, QueryParameter(description=f"rows a page shows, 1 to {MAX_LIMIT} (100 on the API)")] = None,
    after: Annotated[Text, QueryParameter(description="the last id of the page before (its `last_id`): the page after it")] = None,
    order: Annotated[Text, QueryParameter(description="`desc` (newest first, the default) or `asc`")] = None,
) -> Keyset:
    """Which page of the list ``filters`` narrows, from its query string."""
    size = _door(request).limit
    if limit is not None:
        if not _LIMIT.fullmatch(limit) or not 1 <= int(limit) <= MAX_LIMIT:
            raise _invalid("limit", f"a whole number from 1 to {MAX_LIMIT} ({limit[:40]!r})")
        size = int(limit)
    if order is not None and order not in ("asc", "desc"):
        raise _invalid("order", f"asc or desc ({order[:40]!r})")
    cursor = _named("after", after, filters.project) if after is not None else None
    return Keyset(limit=size, after=cursor, descending=order != "asc")


# Registered on the app, beside ``svc`` and ``caller`` (routes/common.py).
DEPENDENCIES = {"filters": Provide(filters, sync_to_thread=False), "keyset": Provide(keyset, sync_to_thread=False)}
