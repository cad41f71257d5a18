"""A list's query string, parsed once for both doors: the JSON API (``GET /v1/trajectories``,
its export) and the dashboard's lists (``/ui/trajectories``, ``/ui/groups``).

Two Litestar dependencies, ``filters`` (what the list is narrowed to: ``core/api/listing.py:
Filters``) and ``keyset`` (which page: ``Keyset``), in ``LIST_DEPENDENCIES``, which each list's
route registers: its handler names ``filters: NamedDependency[Filters]`` and gets it checked, and the API's OpenAPI schema shows
every parameter. A value that does not parse is an ``Invalid`` (400 ``invalid_request``, its
``param`` the field), which the API answers in its error format and the dashboard as a page.

One vocabulary on both doors. An empty filter means "any" (an HTML form sends its empty
fields). Times are Unix seconds or ISO 8601 (a form's ``YYYY-MM-DDTHH:MM``; without a zone,
UTC, as the pages show times). ``after`` is the last id of the page before. The project is
the caller's; only the admin token (or a key with the admin scope) may name another, and on
the dashboard an admin's list is every project's (``all``) unless one is named, its rows and
its ``after`` by stored id. A route's ``opt["listing"]`` (a ``Door``) says which door it is.

The schema states what each parameter accepts (a ``pattern`` or an ``enum`` on a string),
through ``schema_extra``, which Litestar writes into the schema and does not validate; the
parser below checks the same patterns and sets itself, so that its errors name the field on
both doors (Litestar's would be "Validation failed" on a dashboard page) and the dashboard
may name stored ids (``project/id``) where the API takes its own project's. What the schema
accepts, the API accepts, but for what no schema can say: ``version`` without ``policy``,
a date that fits the pattern but not the calendar (February 30; a year 1 or 9999 time whose
zone takes it out of range once in UTC), and a key (not an admin) naming another project.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Request
from litestar.di import NamedDependency, Provide
from litestar.openapi.spec import OpenAPIType
from litestar.params import QueryParameter

from burnish_server.core.api.listing import MAX_LIMIT, Filters, Keyset
from burnish_server.core.learning.groups import GroupState
from burnish_server.core.platform.access import PROJECT_REGEX, PROJECT_RULE, Principal, is_project, local, project_of, qualify
from burnish_server.core.platform.errors import Invalid
from burnish_server.core.platform.ids import ID_PATTERN, ID_REGEX, ID_RULE

ALL = "all"  # the dashboard's every-project list, an admin's
OPT = "listing"  # the route's opt key holding its Door


class Door(msgspec.Struct, frozen=True, kw_only=True):
    """How a route lists: its page's size unless asked, and whether an admin's list is every project's by default."""

    limit: int = 100
    every_project: bool = False  # the dashboard; the API's answers carry ids local to one project


API = Door()
DASHBOARD = Door(limit=50, every_project=True)


# What each parameter accepts, as the schema says it and the parser checks it. Patterns are
# anchored, with Python's `$` kept from matching before a final newline (core/platform/ids.py).
_END = "$(?!\\n)"


def _or_empty(regex: str) -> str:
    """An anchored pattern (``^...$(?!\\n)``) that also takes the empty string: an empty filter means any."""
    return f"^(?:{regex.removeprefix('^').removesuffix(_END)})?{_END}"


ID_OR_EMPTY = _or_empty(ID_REGEX)
# A project on the API (one at a time: `all` is the dashboard's every project).
PROJECT_ON_API = f"^(?!{ALL}$)" + _or_empty(PROJECT_REGEX).removeprefix("^")
# 1 to MAX_LIMIT (1000), without leading zeros: spelled out, and checked against MAX_LIMIT in the parser too.
LIMIT = f"^(?:[1-9][0-9]{{0,2}}|{MAX_LIMIT}){_END}"
STEP = f"^[0-9]{{0,9}}{_END}"
# A plain decimal, no exponent: at most 308 digits before the point keeps it below float's
# largest, so no value is infinite or not a number.
DECIMAL = f"^(?:-?(?:[0-9]{{1,308}}(?:[.][0-9]*)?|[.][0-9]+))?{_END}"
_SECONDS = "[0-9]{1,11}(?:[.][0-9]*)?"  # Unix seconds, below 1e11 (the year 5138)
_ISO = (
    "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    "(?:[T ](?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:[.][0-9]{1,6})?)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?)?"
)
TIME = f"^(?:{_SECONDS}|{_ISO})?{_END}"
FLAGS = ("", "true", "false", "True", "False", "1", "0")  # "True": Python's str(True), as `requests` sends it
STATES = ("", *(s.value for s in GroupState))
ORDERS = ("asc", "desc")

_ID_OR_EMPTY, _PROJECT_ON_API, _LIMIT, _STEP, _DECIMAL, _TIME = map(re.compile, (ID_OR_EMPTY, PROJECT_ON_API, LIMIT, STEP, DECIMAL, TIME))


def _text(description: str, *, pattern: str | None = None, enum: tuple[str, ...] | None = None, name: str | None = None) -> QueryParameter:
    """A parameter read as text, its schema a string that matches ``pattern`` or is one of
    ``enum``. ``schema_extra`` only writes the schema (``pattern=`` would have Litestar
    validate it too): the parser checks. The string replaces Litestar's ``oneOf`` string or
    null: a parameter left out has no value, it is never JSON's null."""
    extra: dict[str, Any] = {"type": OpenAPIType.STRING, "one_of": None}
    if pattern is not None:
        extra["pattern"] = pattern
    if enum is not None:
        extra["enum"] = list(enum)
    return QueryParameter(name=name, description=description, schema_extra=extra)


def _door(request: Request) -> Door:
    door: Door = request.route_handler.opt.get(OPT, API)
    return door


def _invalid(name: str, message: str) -> Invalid:
    return Invalid(f"{name}: {message}", "invalid_request", name)


def _checked(name: str, value: str, pattern: re.Pattern[str], rule: str) -> str:
    if not pattern.fullmatch(value):
        raise _invalid(name, f"{rule} ({value[:140]!r})")
    return value


def _flag(name: str, value: str, meaning: str = "") -> bool:
    match value:
        case "true" | "True" | "1":
            return True
        case "false" | "False" | "0":
            return False
    raise _invalid(name, f"true or false{meaning} ({value[:40]!r})")


def _number(name: str, value: str) -> float:
    return float(_checked(name, value, _DECIMAL, "not a plain decimal number (such as -0.5; no exponent)"))


def _when(name: str, value: str) -> datetime:
    """A time in UTC (a zone other than UTC is converted, so that every store compares it alike)."""
    _checked(name, value, _TIME, "not a date and time; use YYYY-MM-DDTHH:MM (ISO 8601) or Unix seconds")
    if "-" not in value:  # Unix seconds: the pattern keeps them below the year 5138
        return datetime.fromtimestamp(float(value), UTC)
    try:
        out = datetime.fromisoformat(value)
        return out.astimezone(UTC) if out.tzinfo else out.replace(tzinfo=UTC)
    except ValueError as exc:  # February 30, the year 0
        raise _invalid(name, f"not a date on the calendar ({value!r}): {exc}") from None
    except OverflowError:  # the year 1 or 9999 in a zone that takes it out of range in UTC
        raise _invalid(name, f"out of range once in UTC ({value!r})") from None


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
        raise _invalid("project", f"not a project name ({value[:140]!r}): use {PROJECT_RULE}")
    return value or caller.project


Text = str | None  # each parameter as sent: parsed here, so that both doors read it alike
_WHEN = "Unix seconds (below 1e11), or ISO 8601 `YYYY-MM-DD[THH:MM[:SS[.ffffff]]][Z|±HH:MM]` (without a zone: UTC)"


def filters(
    request: Request,
    caller: NamedDependency[Principal],
    project: Annotated[Text, _text(f"another project (admin only): {PROJECT_RULE}; on the dashboard also `{ALL}`", pattern=PROJECT_ON_API)] = None,
    group_id: Annotated[Text, _text(f"only this group's members: {ID_RULE}", pattern=ID_OR_EMPTY)] = None,
    rewarded: Annotated[Text, _text("true: only rewarded; false: only not yet rewarded", enum=FLAGS)] = None,
    eval: Annotated[Text, _text("true: only held out; false: only trained on", enum=FLAGS)] = None,
    policy: Annotated[Text, _text(f"only trajectories with a call this policy answered: {ID_RULE}", pattern=ID_OR_EMPTY)] = None,
    version: Annotated[Text, _text("with policy: only those it answered at this step (up to 9 digits)", pattern=STEP)] = None,
    # `state` is a name Litestar keeps for the app's state: the parameter's, not the argument's.
    group_state: Annotated[Text, _text(f"only those whose group is {', '.join(STATES[1:])}", enum=STATES, name="state")] = None,
    reward_min: Annotated[Text, _text("only a reward at least this, a plain decimal (a group: its mean)", pattern=DECIMAL)] = None,
    reward_max: Annotated[Text, _text("only a reward at most this, a plain decimal (a group: its mean)", pattern=DECIMAL)] = None,
    created_after: Annotated[Text, _text(f"only created after this time: {_WHEN}", pattern=TIME)] = None,
    created_before: Annotated[Text, _text(f"only created before this time: {_WHEN}", pattern=TIME)] = None,
) -> Filters:
    """What a list is narrowed to, from its query string; an empty value is no filter."""

    def given(value: str | None) -> str:
        return value or ""

    listed = _project(caller, given(project), _door(request))
    group = given(group_id)
    chosen = given(policy)
    step = _checked("version", given(version), _STEP, "not a step number")
    if step and not chosen:
        raise _invalid("version", "name the policy too")
    phase = given(group_state)
    if phase not in STATES:
        raise _invalid("state", f"one of {', '.join(STATES[1:])} ({phase[:40]!r})")
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


def keyset(
    request: Request,
    filters: NamedDependency[Filters],
    limit: Annotated[Text, _text(f"rows a page shows, 1 to {MAX_LIMIT} (100 on the API)", pattern=LIMIT)] = None,
    after: Annotated[Text, _text(f"the last id of the page before (its `last_id`): the page after it; {ID_RULE}", pattern=ID_REGEX)] = None,
    order: Annotated[Text, _text("`desc` (newest first, the default) or `asc`", enum=ORDERS)] = None,
) -> Keyset:
    """Which page of the list ``filters`` narrows, from its query string. Not filters: an empty value is refused."""
    size = _door(request).limit
    if limit is not None:
        if not _LIMIT.fullmatch(limit) or not 1 <= int(limit) <= MAX_LIMIT:
            raise _invalid("limit", f"a whole number from 1 to {MAX_LIMIT} ({limit[:40]!r})")
        size = int(limit)
    if order is not None and order not in ORDERS:
        raise _invalid("order", f"asc or desc ({order[:40]!r})")
    cursor = _named("after", after, filters.project) if after is not None else None
    return Keyset(limit=size, after=cursor, descending=order != "asc")


# Registered on the app, beside ``svc`` and ``caller`` (routes/common.py).
LIST_DEPENDENCIES = {"filters": Provide(filters, sync_to_thread=False), "keyset": Provide(keyset, sync_to_thread=False)}
