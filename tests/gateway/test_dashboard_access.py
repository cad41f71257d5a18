"""The dashboard's access rules, paging and input, over HTTP (the browser tests are in
tests/gateway/test_dashboard.py): the API's rules on /ui, a project's data only, keyset pages in the
store on SQLite and PostgreSQL, and hostile query strings answered with a page, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burnish_server.core.api.listing import Filters, Keyset
from burnish_server.core.learning.groups import GroupState
from burnish_server.store import listing
from tests.conftest import ADMIN_TOKEN, Gateway
from tests.gateway.test_access import bearer, make_key
from tests.upstream import Upstream


def _call(gw: Gateway, key: str | None, trajectory: str, group: str | None = None, model: str = "agent", size: int = 2) -> None:
    prefix = f"/g/{group}/t/{trajectory}" if group else f"/t/{trajectory}"
    with gw.client(headers={**bearer(key), **({"x-group-size": str(size)} if group else {})}) as c:
        r = c.post(f"{prefix}/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": f"hello {trajectory}"}]})
        assert r.status_code == 200, r.text


def _reward(gw: Gateway, key: str | None, trajectory: str, reward: float) -> None:
    with gw.client(headers=bearer(key)) as c:
        assert c.post(f"/v1/trajectories/{trajectory}/reward", json={"reward": reward}).status_code == 200


def test_an_open_gateway_shows_the_dashboard_to_anyone_and_its_controls_to_the_admin_token(gateway: Gateway, upstream: Upstream) -> None:
    gateway.create_policy("agent", "m")
    _call(gateway, None, "t1")
    with gateway.client() as c:
        assert c.get("/ui").status_code == 200
        page = c.get("/ui/policies/agent")
        assert page.status_code == 200 and 'id="controls"' not in page.text
        assert c.get("/ui/trajectories/t1").status_code == 200
        # Anyone reads an open gateway; only the admin token acts on it.
        assert c.post("/ui/policies/agent/pause").status_code == 401
    with gateway.admin() as c:
        assert 'id="controls"' in c.get("/ui/policies/agent").text
        r = c.post("/ui/policies/agent/pause")
        assert (r.status_code, r.headers["location"]) == (303, "/ui/policies/agent?done=paused")
    assert gateway.policy()["paused"] is True


def test_a_closed_gateway_asks_for_a_sign_in_and_keeps_the_cookie_to_its_pages(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    gw = make_gateway()
    gw.create_policy("agent", "m")
    reader = make_key(gw, name="reader", scopes=["read"])
    caller = make_key(gw, name="caller", scopes=["call"])
    with gw.client(follow_redirects=False) as c:
        r = c.get("/ui/trajectories?eval=true")
        assert r.status_code in (302, 303) and r.headers["location"].startswith("/ui/login?next=/ui/trajectories%3Feval%3Dtrue")
        # A wrong token, and a key without the read scope, are refused at the form.
        for token, why in (("nope", "invalid API key"), (caller, "lacks the read scope")):
            r = c.post("/ui/login", data={"token": token, "next": "/ui/groups"})
            assert r.status_code == 303 and "/ui/login" in r.headers["location"]
            assert why in httpx.QueryParams(r.headers["location"].split("?", 1)[1])["error"]
        # Another site is never a place to go after signing in.
        r = c.post("/ui/login", data={"token": reader, "next": "//evil.example/x"})
        assert (r.status_code, r.headers["location"]) == (303, "/ui")
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/ui" in cookie
        assert reader not in cookie  # a session's random id, never the key (tests/gateway/test_ui_sessions.py)
        assert c.get("/ui/groups").status_code == 200
        # The cookie opens the dashboard's pages, not the API.
        assert c.get("/v1/trajectories").status_code == 401
        # A read key reads; the controls need the admin scope.
        assert c.post("/ui/policies/agent/pause").status_code == 403
        assert c.post("/ui/logout").status_code == 303
        assert c.get("/ui/groups").status_code in (302, 303)
    with gw.client(headers=bearer(ADMIN_TOKEN), follow_redirects=False) as c:
        # A control posted from another site's page is refused, whoever's cookie it carries.
        assert c.post("/ui/policies/agent/pause", headers={"origin": "https://evil.example"}).status_code == 403
        assert c.post("/ui/policies/agent/pause", headers={"origin": gw.url}).status_code == 303


def test_a_key_sees_its_projects_data_and_policies_only(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    gw = make_gateway()
    gw.create_policy("agent", "m", project="team-a")
    keys = {team: make_key(gw, name=team, project=f"team-{team}", scopes=["call", "read"]) for team in "ab"}
    _call(gw, keys["a"], "mine", "ga")
    _call(gw, keys["b"], "theirs", "gb", model="m")
    with gw.client(headers=bearer(keys["b"])) as c:
        assert "mine" not in c.get("/ui/trajectories").text and "theirs" in c.get("/ui/trajectories").text
        assert c.get("/ui/trajectories/mine").status_code == 404
        assert c.get("/ui/policies/agent").status_code == 404
        assert "agent" not in c.get("/ui").text
        r = c.get("/ui/trajectories?project=team-a")
        assert r.status_code == 400 and "its own project" in r.text
    with gw.client(headers=bearer(keys["a"])) as c:
        assert "mine" in c.get("/ui/trajectories").text and "theirs" not in c.get("/ui/trajectories").text
        assert c.get("/ui/policies/agent").status_code == 200
    with gw.admin() as c:  # the admin token reads any project, by name
        assert "mine" in c.get("/ui/trajectories?project=team-a").text
        assert c.get("/ui/trajectories/mine?project=team-a").status_code == 200


def test_the_admin_finds_every_project_without_typing_its_name(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    """The admin's lists show every project by default, with a picker of the projects there
    are (and their counts); each row's link carries its project; a link that names none finds
    the project that holds the id. A key still sees its own project only, without naming it."""
    gw = make_gateway()
    gw.create_policy("agent", "m")
    keys = {team: make_key(gw, name=team, project=f"team-{team}", scopes=["call", "read"]) for team in "ab"}
    _call(gw, keys["a"], "mine", "ga", model="m")
    _call(gw, keys["b"], "theirs", "gb", model="m")
    _call(gw, make_key(gw, name="home", project="default", scopes=["call"]), "home", "gh", model="m")
    with gw.admin() as c:
        listed = c.get("/ui/trajectories").text
        assert all(t in listed for t in ("mine", "theirs", "home"))
        assert 'href="/ui/trajectories/mine?project=team-a"' in listed and 'href="/ui/groups/gb?project=team-b"' in listed
        assert 'href="/ui/trajectories/home"' in listed  # the admin token's own project needs no name
        assert "team-a (1 groups, 1 trajectories)" in c.get("/ui/groups").text
        only_b = c.get("/ui/groups?project=team-b").text
        assert "gb" in only_b and "ga" not in only_b
        front = c.get("/ui").text
        assert 'id="projects"' in front and 'href="/ui/groups?project=team-b"' in front
        # A link without the project: the page finds it.
        assert "hello mine" in c.get("/ui/trajectories/mine").text
        assert c.get("/ui/groups/ga").status_code == 200
        assert c.get("/ui/trajectories/nobody").status_code == 404
    with gw.client(headers=bearer(keys["a"])) as c:
        own = c.get("/ui/trajectories").text
        assert "mine" in own and "theirs" not in own and 'id="projects"' not in c.get("/ui").text
        assert c.get("/ui/trajectories/theirs").status_code == 404
    with gw.client() as c:  # the icon a browser asks for by itself
        icon = c.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")


QUERY_FIELDS = ["project", "policy", "version", "state", "eval", "reward_min", "reward_max", "created_after", "created_before", "after", "limit", "order"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.dictionaries(
        st.sampled_from(QUERY_FIELDS), st.text(max_size=40) | st.sampled_from(["", "1", "-1", "1e999", "nan", "trained", "true", "2026-01-01T00:00"])
    )
)
def test_hostile_query_strings_get_a_page_never_a_500(gateway: Gateway, query: dict[str, str]) -> None:
    with gateway.admin() as c:
        for path in ("/ui/groups", "/ui/trajectories"):
            r = c.get(path, params=query)
            # 404: an id to page after that names no row
            assert r.status_code in (200, 400) or (r.status_code == 404 and "after" in query), (path, query, r.status_code)
            assert r.headers["content-type"].startswith("text/html")


async def test_pages_are_keyset_pages_in_the_store_and_filters_are_where_clauses(store: Any) -> None:
    from tests.store.test_eval import _group

    db, writer = store
    for g in range(5):
        await _group(writer, f"g{g}", [float(g), float(g) + 1], [False, False], close=g % 2 == 0)
    everything = Filters(project="default")

    async def walk(filters: Filters, read: Any) -> list[str]:
        seen: list[str] = []
        after = None
        while True:
            page = await db.read(read, filters, Keyset(limit=2, after=after))
            seen += [row.id for row in page.rows]
            if not page.has_more:
                return seen
            after = page.rows[-1].id

    groups = await walk(everything, listing.group_list)
    assert groups == [f"g{g}" for g in reversed(range(5))]  # newest first, each once, pages of 2
    trajectories = await walk(everything, listing.trajectories)
    assert len(trajectories) == len(set(trajectories)) == 10
    closed = await walk(Filters(project="default", state=GroupState.CLOSED), listing.group_list)
    assert closed == ["g4", "g2", "g0"]
    high = await walk(Filters(project="default", reward_min=4.0), listing.trajectories)
    assert sorted(high) == ["g3-1", "g4-0", "g4-1"]  # group g's rewards are g and g + 1
    assert await walk(Filters(project="elsewhere"), listing.trajectories) == []
    assert await walk(Filters(project="default", rewarded=True, reward_max=1.0), listing.group_list) == ["g0"]  # means g + 0.5
    assert await db.read(listing.trajectories, everything, Keyset(limit=2, after="gone")) is None


@pytest.mark.parametrize("path", ["/ui/trajectories/x/calls/0/tokens", "/ui/groups/nope", "/ui/policies/nope/compare"])
def test_what_is_not_there_is_a_404_page(gateway: Gateway, path: str) -> None:
    with gateway.admin() as c:
        r = c.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
