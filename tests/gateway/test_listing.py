"""The list parameters (gateway/edge/listing.py): the OpenAPI schema states what each one accepts,
and the parser accepts exactly that, but for what no schema can say (``version`` without
``policy``, a date that fits the pattern but not the calendar)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.exceptions import LitestarWarning

from burnish_server.core.api.listing import MAX_LIMIT, Filters, Keyset
from burnish_server.core.platform.access import Principal
from burnish_server.core.platform.errors import Invalid
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.app import create_app
from burnish_server.gateway.edge import listing
from tests.conftest import Gateway
from tests.gateway.test_trajectories import assert_openai_error, call

# Each parameter's pattern or enum, as the schema must state it.
PATTERNS = {
    "project": listing.PROJECT_ON_API,
    "group_id": listing.ID_OR_EMPTY,
    "policy": listing.ID_OR_EMPTY,
    "version": listing.STEP,
    "reward_min": listing.DECIMAL,
    "reward_max": listing.DECIMAL,
    "created_after": listing.TIME,
    "created_before": listing.TIME,
    "limit": listing.LIMIT,
    "after": listing.ID_REGEX,
}
ENUMS = {"rewarded": listing.FLAGS, "eval": listing.FLAGS, "state": listing.STATES, "order": listing.ORDERS}
PAGE = {"limit", "after", "order"}  # the export takes no page
ADMIN = Principal("default", frozenset({"read", "admin"}))
ON_THE_API = SimpleNamespace(route_handler=SimpleNamespace(opt={}))  # a request on a route without a Door: the API's


def parse(query: dict[str, str]) -> tuple[Filters, Keyset]:
    """The query as the API's parser reads it (``state`` is the argument ``group_state``)."""
    named = {("group_state" if k == "state" else k): v for k, v in query.items() if k not in PAGE}
    found = listing.filters(ON_THE_API, ADMIN, **named)  # type: ignore[arg-type]
    return found, listing.keyset(ON_THE_API, found, **{k: v for k, v in query.items() if k in PAGE})  # type: ignore[arg-type]


def off_the_calendar(error: Invalid) -> bool:
    """The one refusal of a schema-valid time: fits the pattern, not the calendar (or not UTC's range)."""
    return error.param in ("created_after", "created_before") and ("calendar" in error.message or "out of range" in error.message)


def test_the_schema_states_each_parameter_and_no_deprecated_declaration_is_left(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = create_app(Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'b.db'}", admin_token="x"))
        schema = app.litestar.openapi_schema.to_schema()
    # The `state` parameter was declared with Parameter(query=...): Litestar warned at every app.
    assert not [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, LitestarWarning))]
    for path, names in (("/v1/trajectories", {*PATTERNS, *ENUMS}), ("/v1/trajectories/export", {*PATTERNS, *ENUMS} - PAGE)):
        params = {p["name"]: p for p in schema["paths"][path]["get"]["parameters"]}
        assert set(params) == names, path
        for name, param in params.items():
            assert param["in"] == "query" and not param["required"], (path, name)
            stated = {k: v for k, v in param["schema"].items() if k != "description"}
            rule = {"pattern": PATTERNS[name]} if name in PATTERNS else {"enum": list(ENUMS[name])}
            assert stated == {"type": "string", **rule}, (path, name)


def test_the_limit_pattern_is_one_to_max_limit() -> None:
    pattern = re.compile(listing.LIMIT)
    assert [n for n in range(10 * MAX_LIMIT) if pattern.fullmatch(str(n))] == list(range(1, MAX_LIMIT + 1))
    assert not pattern.fullmatch(f"{MAX_LIMIT}\n") and not pattern.fullmatch("010")


def valid(name: str) -> st.SearchStrategy[str]:
    return st.from_regex(PATTERNS[name], fullmatch=True) if name in PATTERNS else st.sampled_from(ENUMS[name])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), names=st.sets(st.sampled_from(sorted({*PATTERNS, *ENUMS})), min_size=1))
def test_what_the_schema_accepts_the_parser_accepts(data: st.DataObject, names: set[str]) -> None:
    query = {name: data.draw(valid(name), label=name) for name in names}
    query.pop("after", None)  # paging after an id is read against the store: tested through the API below
    if query.get("version") and not query.get("policy"):
        query["policy"] = "agent"  # version needs its policy: a relation between two parameters
    try:
        found, page = parse(query)
    except Invalid as error:
        assert off_the_calendar(error), (query, error.message)
        return
    assert found.project == (query.get("project") or "default")
    assert page.limit == int(query.get("limit") or 100)
    for when in (found.created_after, found.created_before):
        assert when is None or when.utcoffset() == timedelta(0)


HOSTILE = ["", " ", "1e3", "1E3", "inf", "-inf", "nan", "NaN", "TRUE", " true", "true ", "0x1", "1_000", "+1", "١", "1\n", "..", "a/b", "all", "-", "."]


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted({*PATTERNS, *ENUMS} - {"after"})), value=st.text(max_size=40) | st.sampled_from(HOSTILE))
def test_what_the_schema_refuses_the_parser_refuses_naming_the_field(name: str, value: str) -> None:
    allowed = bool(re.fullmatch(PATTERNS[name], value)) if name in PATTERNS else value in ENUMS[name]
    query = {name: value, **({"policy": "agent"} if name == "version" else {})}
    try:
        parse(query)
    except Invalid as error:
        assert error.status == 400 and error.code == "invalid_request" and error.param == name, (query, error.message)
        assert not allowed or off_the_calendar(error), (query, error.message)
        return
    assert allowed, f"{query} is off the schema and was accepted"


@pytest.mark.parametrize(
    ("value", "utc"),
    [
        ("2026-03-01T10:00+05:30", datetime(2026, 3, 1, 4, 30, tzinfo=UTC)),
        ("2026-03-01T10:00Z", datetime(2026, 3, 1, 10, 0, tzinfo=UTC)),
        ("2026-03-01 10:00:05.25", datetime(2026, 3, 1, 10, 0, 5, 250000, tzinfo=UTC)),
        ("2026-03-01", datetime(2026, 3, 1, tzinfo=UTC)),
        ("1772359200.5", datetime(2026, 3, 1, 10, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_times_are_read_in_utc(value: str, utc: datetime) -> None:
    found, _ = parse({"created_after": value})
    assert found.created_after == utc and found.created_after.tzinfo is UTC


def test_parameters_on_both_stores(make_gateway: Callable[..., Gateway], database_url: str) -> None:
    """Zones are compared in UTC on each store; off the calendar is a 400 naming the field, never a 500."""
    with make_gateway(database_url).client() as c:
        call(c, "tz-1")
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        ist = (hour_ago + timedelta(hours=5, minutes=30)).strftime("%Y-%m-%dT%H:%M") + "+05:30"
        assert [t["id"] for t in c.get("/v1/trajectories", params={"created_after": ist}).json()["data"]] == ["tz-1"]
        assert c.get("/v1/trajectories", params={"created_before": ist}).json()["data"] == []
        empty: dict[str, Any] = dict.fromkeys({*PATTERNS, *ENUMS} - PAGE, "")  # a form's empty fields: no filter
        assert [t["id"] for t in c.get("/v1/trajectories", params=empty).json()["data"]] == ["tz-1"]
        for path in ("/v1/trajectories", "/v1/trajectories/export"):
            for name, value in [("created_after", "0001-01-01T00:30+01:00"), ("created_before", "9999-12-31T23:59-01:00"), ("created_after", "2026-02-30")]:
                assert assert_openai_error(c.get(path, params={name: value}), 400, "invalid_request")["param"] == name
            assert assert_openai_error(c.get(path, params={"version": "3"}), 400, "invalid_request")["param"] == "version"
            assert assert_openai_error(c.get(path, params={"reward_min": "1e3"}), 400, "invalid_request")["param"] == "reward_min"
            assert assert_openai_error(c.get(path, params={"rewarded": "TRUE"}), 400, "invalid_request")["param"] == "rewarded"
