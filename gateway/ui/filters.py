"""A list page's filters, from its query string (an HTML form's GET: empty fields are "any").

Each field is checked here; a value that does not parse is an ``Invalid`` naming the field,
which the page shows (400), never a 500. The project is the caller's: only the admin token
(or a key with the admin scope) may look at another project's groups and trajectories.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from burnish_server.core.access import Principal, is_project
from burnish_server.core.errors import Invalid
from burnish_server.core.groups import GroupState
from burnish_server.core.ids import ID_REGEX
from burnish_server.store.dashboard import Filters

ALL = "all"  # an admin's view of every project
FIELDS = ("project", "policy", "version", "state", "eval", "reward_min", "reward_max", "after", "before")
_ID = re.compile(ID_REGEX)


@dataclass(frozen=True)
class Query:
    """The filters as the form shows them (strings), and as the store applies them."""

    form: dict[str, str]
    filters: Filters
    before: int | None  # the page: rows older than this key

    def link(self, **changes: str | int | None) -> str:
        """This query string with ``changes`` (None removes a field): for the next page, a chip's removal."""
        values = {**self.form, **{k: ("" if v is None else str(v)) for k, v in changes.items()}}
        return urlencode({k: v for k, v in values.items() if v})


def _when(name: str, value: str) -> datetime:
    try:
        out = datetime.fromisoformat(value)
    except ValueError:
        raise Invalid(f"{name}: not a date and time ({value!r}); use YYYY-MM-DDTHH:MM", "invalid_filter", name) from None
    return out if out.tzinfo else out.replace(tzinfo=UTC)  # a form's local time is read as UTC, as the pages show times


def _number(name: str, value: str) -> float:
    try:
        out = float(value)
    except ValueError:
        out = math.nan
    if not math.isfinite(out):
        raise Invalid(f"{name}: not a number ({value!r})", "invalid_filter", name)
    return out


def parse(params: Mapping[str, str], caller: Principal) -> Query:
    form = {k: params.get(k, "").strip()[:200] for k in FIELDS}
    # A key reads its own project; an admin every project ("all", the default) or the one named.
    project: str | None = caller.project
    if caller.can("admin"):
        project = None if form["project"] in ("", ALL) else form["project"]
        if project is not None and not is_project(project):
            raise Invalid(f"project: not a project name ({project!r})", "invalid_filter", "project")
    elif form["project"] and form["project"] != caller.project:
        raise Invalid("project: a key reads its own project only", "invalid_filter", "project")
    policy = form["policy"] or None
    if policy is not None and not _ID.match(policy):
        raise Invalid(f"policy: not a policy name ({policy!r})", "invalid_filter", "policy")
    version = None
    if form["version"]:
        if not form["version"].isdigit() or len(form["version"]) > 9:
            raise Invalid(f"version: not a step number ({form['version']!r})", "invalid_filter", "version")
        if policy is None:
            raise Invalid("version: name the policy too", "invalid_filter", "version")
        version = int(form["version"])
    state = None
    if form["state"]:
        try:
            state = GroupState(form["state"])
        except ValueError:
            raise Invalid(f"state: one of {', '.join(s.value for s in GroupState)}", "invalid_filter", "state") from None
    if form["eval"] not in ("", "true", "false"):
        raise Invalid("eval: true (held out) or false (trained on)", "invalid_filter", "eval")
    before = None
    if page := params.get("page", ""):
        if not page.isdigit() or len(page) > 18:
            raise Invalid(f"page: not a page key ({page!r})", "invalid_filter", "page")
        before = int(page)
    filters = Filters(
        project=project,
        policy=policy,
        version=version,
        state=state,
        eval=None if not form["eval"] else form["eval"] == "true",
        reward_min=_number("reward_min", form["reward_min"]) if form["reward_min"] else None,
        reward_max=_number("reward_max", form["reward_max"]) if form["reward_max"] else None,
        created_after=_when("after", form["after"]) if form["after"] else None,
        created_before=_when("before", form["before"]) if form["before"] else None,
    )
    return Query(form, filters, before)
