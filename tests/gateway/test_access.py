"""Access control: API keys, projects, scopes, limits, and the open mode's rule.

The matrix: every route of the app against no key, a wrong key, another project's key, a
key without the scope, a revoked key and an expired one; each gets its documented status in
its surface's error format, and team A's data is neither read nor changed. Every route the
app serves must appear here (``test_every_route_is_in_the_matrix``), so a new route cannot
ship without a decision on who may call it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from burnish_server.core.platform.access import hash_secret
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.access.admission import required_scope
from burnish_server.gateway.app import create_app
from tests.conftest import Gateway
from tests.servers import free_port
from tests.upstream import Upstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def make_key(gw: Gateway, **fields: Any) -> str:
    with gw.admin() as c:
        r = c.post("/admin/keys", json={"name": fields.pop("name", "k"), **fields})
        assert r.status_code == 201, r.text
        return str(r.json()["secret"])


def bearer(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key is not None else {}


@pytest.fixture
def keyed(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> dict[str, Any]:
    """A gateway with keys: team A's agent, reader and an old key (revoked, expired); team B's agent."""
    gw = make_gateway(database_url)
    keys = {
        "a": make_key(gw, project="team-a", scopes=["call"]),
        "a_read": make_key(gw, project="team-a", scopes=["read"]),
        "a_metrics": make_key(gw, project="team-a", scopes=["metrics"]),
        "b": make_key(gw, project="team-b", scopes=["call", "read", "metrics"]),
        "revoked": make_key(gw, project="team-a", scopes=["call", "read", "metrics", "admin"]),
        "expired": make_key(gw, project="team-a", scopes=["call", "read", "metrics", "admin"], expires_in=0.3),
    }
    with gw.admin() as c:
        revoked = next(k for k in c.get("/admin/keys").json()["data"] if keys["revoked"].startswith(k["prefix"]))
        assert c.delete(f"/admin/keys/{revoked['id']}").json()["status"] == "revoked"
    # The same ids in both projects: they never meet.
    for team in ("a", "b"):
        with gw.client(headers=bearer(keys[team])) as c:
            r = c.post(
                "/g/g1/t/t1/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": f"team {team}"}]}, headers={"x-group-size": "2"}
            )
            assert r.status_code == 200, r.text
            assert r.headers["x-trajectory-id"] == "t1"
    time.sleep(0.35)  # the expired key is past its time
    return {"gw": gw, "keys": keys}


def team_a_state(gw: Gateway, key: str) -> dict[str, Any]:
    with gw.client(headers=bearer(key)) as c:
        t = c.get("/v1/trajectories/t1")
        g = c.get("/v1/groups/g1")
    assert t.status_code == 200 and g.status_code == 200, (t.text, g.text)
    return {"trajectory": t.json(), "group": g.json()}


# Every route, with a request that would succeed for the right key (team A, scope as listed).
ROUTES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("call", "POST", "/v1/chat/completions", CHAT),
    ("call", "POST", "/g/g1/t/t1/v1/chat/completions", CHAT),
    ("call", "POST", "/v1/completions", {"model": "m", "prompt": "hi"}),
    ("call", "POST", "/v1/responses", {"model": "m", "input": "hi"}),
    ("call", "POST", "/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("call", "GET", "/v1/models", None),
    ("call", "POST", "/v1/trajectories/t1/calls/0/reward", {"reward": 0.5}),
    ("call", "POST", "/v1/trajectories/t1/reward", {"reward": 1.0}),
    ("call", "POST", "/v1/groups/g1/close", None),
    ("call", "POST", "/v1/groups/g1/ruler", {}),
    (
        "call",
        "POST",
        "/v1/demonstrations",
        {"policy": "agent", "data": [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}]}]},
    ),
    ("call|read", "GET", "/v1/trajectories/t1", None),
    ("call|read", "GET", "/v1/groups/g1", None),
    ("read", "GET", "/v1/trajectories", None),
    ("read", "GET", "/v1/trajectories/export", None),
    ("metrics", "GET", "/metrics", None),
    ("admin", "GET", "/admin/policies", None),
    ("admin", "POST", "/admin/policies", {"name": "p", "base_model": "m"}),
    ("admin", "GET", "/admin/policies/agent", None),
    ("admin", "PATCH", "/admin/policies/agent", {"paused": True}),
    ("admin", "POST", "/admin/policies/agent/pause", None),
    ("admin", "POST", "/admin/policies/agent/resume", None),
    ("admin", "POST", "/admin/policies/agent/train", None),
    ("admin", "GET", "/admin/policies/agent/checkpoints", None),
    ("admin", "GET", "/admin/policies/agent/checkpoints/1/adapter", None),
    ("admin", "POST", "/admin/policies/agent/rollback", {"step": 0}),
    ("admin", "POST", "/admin/policies/agent/promote", None),
    ("admin", "POST", "/admin/policies/agent/reject", None),
    ("admin", "GET", "/admin/policies/agent/metrics", None),
    ("admin", "GET", "/admin/policies/agent/evals", None),
    ("admin", "POST", "/admin/policies/agent/teacher-answers", {"model": "tiny", "limit": 1}),
    ("admin", "POST", "/admin/keys", {"name": "x"}),
    ("admin", "GET", "/admin/keys", None),
    ("admin", "GET", "/admin/keys/key_0123456789abcdef", None),
    ("admin", "DELETE", "/admin/keys/key_0123456789abcdef", None),
    ("admin", "GET", "/admin/sessions", None),
    ("admin", "DELETE", "/admin/sessions/ses_0123456789abcdef", None),
    ("admin", "GET", "/admin/projects/team-a/retention", None),
    ("admin", "PUT", "/admin/projects/team-a/retention", {"days": 30}),
]


# The dashboard's routes and their scopes (tried in tests/gateway/test_dashboard_access.py, tests/gateway/test_dashboard.py and
# tests/gateway/test_ui_sessions.py).
UI_ROUTES = {
    ("GET", "/ui/login"): "public",
    ("POST", "/ui/login"): "public",
    ("POST", "/ui/logout"): "public",
    ("GET", "/ui/static/{file_path:path}"): "public",
    ("HEAD", "/ui/static/{file_path:path}"): "public",
    ("GET", "/ui"): "read",
    ("GET", "/ui/policies/{name:str}"): "read",
    ("GET", "/ui/policies/{name:str}/compare"): "read",
    ("GET", "/ui/groups"): "read",
    ("GET", "/ui/groups/{group_id:str}"): "read",
    ("GET", "/ui/trajectories"): "read",
    ("GET", "/ui/trajectories/{trajectory_id:str}"): "read",
    ("GET", "/ui/trajectories/{trajectory_id:str}/calls/{index:int}/tokens"): "read",
    ("POST", "/ui/policies/{name:str}/rollback"): "admin",
    ("GET", "/ui/policies/{name:str}/versions/{step:int}/adapter"): "admin",
    ("POST", "/ui/policies/{name:str}/{action:str}"): "admin",  # pause, resume, train, promote, reject
    ("GET", "/ui/sessions"): "admin",
    ("POST", "/ui/sessions/{session_id:str}/end"): "admin",
}


def test_every_route_is_in_the_matrix(gateway: Gateway) -> None:
    """Each route the app serves declares a scope, and each is tried below."""
    app = create_app(gateway.settings)
    served = set()
    ui = {}
    for route in app.litestar.routes:
        for handler in getattr(route, "route_handlers", []):
            if handler.http_methods == {"OPTIONS"}:  # Litestar's own, public (gateway/access/admission.py)
                continue
            scope = required_scope(handler)
            path = route.path
            if path.startswith("/docs") or path in ("/health", "/favicon.ico"):
                assert scope == "public", path
                continue
            if path == "/ui" or path.startswith("/ui/"):
                ui |= {(method, path): scope for method in handler.http_methods}
                continue
            for method in handler.http_methods:
                served.add((method, path.replace("{trajectory_id:str}", "{t}").replace("{group_id:str}", "{g}"), scope))
    tried = set()
    for scope, method, path, _ in ROUTES:
        tried.add((method, path, scope))
    # Routes of the proxy exist under every prefix; the matrix tries /v1 and one prefix.
    normalised = {(m, p.replace("/g/{g}/t/{t}", "").replace("/t/{t}", "").removeprefix("/eval"), s) for m, p, s in served}
    names = {
        (
            m,
            p.replace("/v1/trajectories/t1", "/v1/trajectories/{t}")
            .replace("/v1/groups/g1", "/v1/groups/{g}")
            .replace("/calls/0/", "/calls/{index:int}/")
            .replace("/checkpoints/1/", "/checkpoints/{step:int}/"),
            s,
        )
        for m, p, s in {(m, p.replace("/g/g1/t/t1", ""), s) for m, p, s in tried}
    }
    names = {
        (
            m,
            p.replace("/admin/policies/agent", "/admin/policies/{name:str}")
            .replace("/admin/keys/key_0123456789abcdef", "/admin/keys/{key_id:str}")
            .replace("/admin/sessions/ses_0123456789abcdef", "/admin/sessions/{session_id:str}")
            .replace("/admin/projects/team-a", "/admin/projects/{project:str}"),
            s,
        )
        for m, p, s in names
    }
    assert normalised == names
    assert ui == UI_ROUTES


def _refused(r: httpx.Response, status: int, code: str | None, path: str) -> None:
    assert r.status_code == status, (path, r.status_code, r.text)
    body = r.json()
    assert "Traceback" not in r.text
    if path.endswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"], body
    elif code is not None:
        assert body["error"]["code"] == code, (path, body)


def test_the_matrix(keyed: dict[str, Any]) -> None:
    gw, keys = keyed["gw"], keyed["keys"]
    before = team_a_state(gw, keys["a"])
    # A key for each scope, all in team A, to find the one lacking it.
    lacking = {"call": keys["a_read"], "read": keys["a"], "call|read": keys["a_metrics"], "metrics": keys["a"], "admin": keys["a"]}
    for scope, method, path, body in ROUTES:
        kwargs: dict[str, Any] = {"json": body} if body is not None else {}
        with gw.client() as c:
            for key, status, code in [
                (None, 401, "missing_api_key"),
                ("bsk-wrong", 401, "invalid_api_key"),
                (keys["revoked"], 401, "key_revoked"),
                (keys["expired"], 401, "key_expired"),
                (lacking[scope], 403, "insufficient_scope"),
            ]:
                _refused(c.request(method, path, headers=bearer(key), **kwargs), status, code, path)
            # Anthropic's clients send x-api-key: refused alike.
            _refused(c.request(method, path, headers={"x-api-key": "bsk-wrong"}, **kwargs), 401, "invalid_api_key", path)
            # Another project's key with every scope but admin: team B has its own t1 and g1 (the
            # same ids), so it reads and scores those, never team A's.
            other = c.request(method, path, headers=bearer(keys["b"]), **kwargs)
            assert "team a" not in other.text, path
            if scope == "admin":
                _refused(other, 403, "insufficient_scope", path)
    after = team_a_state(gw, keys["a"])
    assert after == before, "refused requests changed team A's data"
    # Team B's list and export hold only its own trajectory.
    with gw.client(headers=bearer(keys["b"])) as c:
        listed = c.get("/v1/trajectories").json()["data"]
        exported = c.get("/v1/trajectories/export").text
    # (its calls in the matrix above made one-call trajectories of its own)
    assert "t1" in [t["id"] for t in listed] and "team b" in exported and "team a" not in exported


def test_projects_keep_the_same_ids_apart(keyed: dict[str, Any]) -> None:
    gw, keys = keyed["gw"], keyed["keys"]
    with gw.client(headers=bearer(keys["b"])) as b:
        assert b.post("/v1/trajectories/t1/reward", json={"reward": 0.25}).status_code == 200
        assert b.post("/v1/groups/g1/close").status_code == 200
        mine = b.get("/v1/trajectories/t1").json()
    assert mine["reward"] == 0.25 and "team b" in str(mine["calls"][0]["request"])
    a = team_a_state(gw, keys["a"])
    assert a["trajectory"]["reward"] is None and a["group"]["state"] == "open"
    assert "team a" in str(a["trajectory"]["calls"][0]["request"])
    # Team A's own reward still lands (its group was not closed by B's close).
    with gw.client(headers=bearer(keys["a"])) as c:
        r = c.post("/v1/trajectories/t1/reward", json={"reward": 1.0})
        assert r.status_code == 200 and r.json()["id"] == "t1" and r.json()["group_id"] == "g1"
        missing = c.get("/v1/trajectories/nobody")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "no trajectory 'nobody'"


def test_keys_are_shown_once_and_never_their_hash(make_gateway: Callable[..., Gateway], upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    gw = make_gateway(log_bodies=True)
    with gw.admin() as c:
        made = c.post("/admin/keys", json={"name": "agent", "project": "p1", "scopes": ["call", "read"], "rpm_limit": 100}).json()
        secret, digest = made["secret"], hash_secret(made["secret"])
        assert made["status"] == "active" and made["project"] == "p1" and made["scopes"] == ["call", "read"] and made["rpm_limit"] == 100
        seen = [c.get("/admin/keys").text, c.get(f"/admin/keys/{made['id']}").text, c.delete(f"/admin/keys/{made['id']}").text]
    with gw.client(headers=bearer(secret)) as c:
        seen.append(c.post("/v1/chat/completions", json=CHAT).text)
    for text in seen:
        assert secret not in text and digest not in text and "secret_hash" not in text
    assert '"prefix"' in seen[0] and secret.startswith(made["prefix"])
    assert digest not in caplog.text and secret not in caplog.text
    # A key's secret never goes upstream either (the gateway's own key would, if configured).
    with gw.admin() as c:
        other = c.post("/admin/keys", json={"name": "agent2"}).json()["secret"]
    with gw.client(headers={**bearer(other), "x-api-key": other}) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
    sent = upstream.requests[-1]["headers"]
    assert "authorization" not in sent and "x-api-key" not in sent


def test_open_until_the_first_key_then_closed_for_good(gateway: Gateway, upstream: Upstream) -> None:
    with gateway.client() as c:
        assert c.post("/v1/chat/completions", json=CHAT, headers=bearer("anything")).status_code == 200
        # Open: the client's own key goes upstream, as with no gateway (a pass-through to a hosted API).
        assert upstream.requests[-1]["headers"]["authorization"] == "Bearer anything"
        assert c.get("/metrics").status_code == 200 and c.get("/v1/trajectories").status_code == 200
        assert c.get("/admin/policies").status_code == 401
    key = make_key(gateway, project="default", scopes=["call", "read"])
    with gateway.admin() as c:
        key_id = c.get("/admin/keys").json()["data"][0]["id"]
    with gateway.client() as c:
        _refused(c.post("/v1/chat/completions", json=CHAT), 401, "missing_api_key", "/v1/chat/completions")
        _refused(c.get("/metrics"), 401, "missing_api_key", "/metrics")
        assert c.get("/health").status_code == 200 and c.get("/docs/openapi.json").status_code == 200
        # The default project's key sees what was recorded while the gateway was open.
        assert len(c.get("/v1/trajectories", headers=bearer(key)).json()["data"]) == 1
    with gateway.admin() as c:
        c.delete(f"/admin/keys/{key_id}")
    with gateway.client() as c:
        _refused(c.post("/v1/chat/completions", json=CHAT, headers=bearer(key)), 401, "key_revoked", "/v1/chat/completions")
        _refused(c.post("/v1/chat/completions", json=CHAT), 401, "missing_api_key", "/v1/chat/completions")
    # The admin token works on every route, in the default project.
    with gateway.admin() as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_a_key_made_elsewhere_works_at_once_and_a_revoked_one_stops(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    """Two gateways on one store: a key made through one works through the other at once; revoked, within a second."""
    one, two = make_gateway(database_url), make_gateway(database_url)
    key = make_key(one, project="p", scopes=["call"])
    with two.client(headers=bearer(key)) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
    with one.admin() as c:
        key_id = c.get("/admin/keys").json()["data"][0]["id"]
        c.delete(f"/admin/keys/{key_id}")
    time.sleep(1.5)
    with two.client(headers=bearer(key)) as c:
        _refused(c.post("/v1/chat/completions", json=CHAT), 401, "key_revoked", "/v1/chat/completions")


def test_anthropic_clients_get_anthropic_errors(keyed: dict[str, Any]) -> None:
    import anthropic

    gw, keys = keyed["gw"], keyed["keys"]
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.url, api_key="bsk-wrong", max_retries=0).messages.create(**body)
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic.Anthropic(base_url=gw.url, api_key=keys["a_read"], max_retries=0).messages.create(**body)


def test_openai_clients_change_only_base_url_and_key(keyed: dict[str, Any]) -> None:
    import openai

    gw, keys = keyed["gw"], keyed["keys"]
    client = openai.OpenAI(base_url=f"{gw.url}/t/mine/v1", api_key=keys["a"], max_retries=0)
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="bsk-wrong", max_retries=0).models.list()
    with gw.client(headers=bearer(keys["a_read"])) as c:
        assert c.get("/v1/trajectories/mine").json()["call_count"] == 1


def test_rate_limit_answers_429_with_retry_after(gateway: Gateway, upstream: Upstream) -> None:
    key = make_key(gateway, scopes=["call"], rpm_limit=3)
    with gateway.client(headers=bearer(key)) as c:
        statuses = [c.post("/v1/chat/completions", json=CHAT).status_code for _ in range(3)]
        limited = c.post("/v1/chat/completions", json=CHAT)
    assert statuses == [200, 200, 200]
    _refused(limited, 429, "rate_limit_exceeded", "/v1/chat/completions")
    assert 1 <= int(limited.headers["retry-after"]) <= 20
    # Another key is not limited by this one.
    other = make_key(gateway, scopes=["call"])
    with gateway.client(headers=bearer(other)) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def _slow_call(gateway: Gateway, key: str, results: list[int]) -> threading.Thread:
    """A call that the upstream holds for a second, started and in flight when this returns."""

    def slow() -> None:
        with gateway.client(headers={**bearer(key), "x-fault": "stall:1.0"}) as c:
            results.append(c.post("/v1/chat/completions", json=CHAT).status_code)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.4)
    return thread


def test_concurrency_limit(gateway: Gateway, upstream: Upstream) -> None:
    key = make_key(gateway, scopes=["call"], max_parallel_requests=1)
    results: list[int] = []
    thread = _slow_call(gateway, key, results)
    with gateway.client(headers=bearer(key)) as c:
        second = c.post("/v1/chat/completions", json=CHAT)
    thread.join()
    _refused(second, 429, "concurrency_limit_exceeded", "/v1/chat/completions")
    assert second.headers["retry-after"] == "1" and results == [200]
    with gateway.client(headers=bearer(key)) as c:  # the slot is free again
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_a_call_refused_for_concurrency_spends_none_of_the_rate(gateway: Gateway, upstream: Upstream) -> None:
    key = make_key(gateway, scopes=["call"], rpm_limit=2, max_parallel_requests=1)
    results: list[int] = []
    thread = _slow_call(gateway, key, results)
    with gateway.client(headers=bearer(key)) as c:
        refused = [c.post("/v1/chat/completions", json=CHAT) for _ in range(3)]
    thread.join()
    for r in refused:
        _refused(r, 429, "concurrency_limit_exceeded", "/v1/chat/completions")
    with gateway.client(headers=bearer(key)) as c:  # the second of the two a minute is still there
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        _refused(c.post("/v1/chat/completions", json=CHAT), 429, "rate_limit_exceeded", "/v1/chat/completions")
    assert results == [200]


def test_an_unknown_secret_is_not_looked_up_again_within_its_time(tmp_path: Path) -> None:
    """A wrong key is looked up in the store once, then answered from memory for
    UNKNOWN_KEY_TTL_S: with the keys' table gone, the store would fail any lookup."""
    from burnish_server.core.platform.access import ApiKey, Limits
    from burnish_server.core.platform.errors import Unauthorized
    from burnish_server.gateway.access.admission import UNKNOWN_KEY_TTL_S, Access, KeyRing
    from burnish_server.store.database import Database

    async def run() -> None:
        settings = Settings.load({}, data_dir=str(tmp_path), host="0.0.0.0", insecure=False)
        db = Database(settings.resolved_database_url)
        await db.migrate()
        known = ApiKey(
            id="k1", name="k", project="p", scopes=frozenset({"call"}), secret_hash=hash_secret("bsk-known"), prefix="bsk-known",
            limits=Limits(), created_at=datetime.now(UTC),
        )  # fmt: skip
        access = Access(settings, db, KeyRing([known]))
        try:
            with pytest.raises(Unauthorized) as first:
                await access.principal([(b"authorization", b"Bearer bsk-wrong")])
            assert first.value.code == "invalid_api_key"
            await db.transaction(lambda conn: conn.exec_driver_sql("DROP TABLE api_keys"))
            for _ in range(3):  # answered from memory: the store is not asked
                with pytest.raises(Unauthorized):
                    await access.principal([(b"authorization", b"Bearer bsk-wrong")])
            assert (await access.principal([(b"authorization", b"Bearer bsk-known")])).project == "p"
            await asyncio.sleep(UNKNOWN_KEY_TTL_S + 0.1)
            with pytest.raises(Exception) as asked:  # past its time, the store is asked again (and fails)
                await access.principal([(b"authorization", b"Bearer bsk-wrong")])
            assert not isinstance(asked.value, Unauthorized)
        finally:
            await db.dispose()

    asyncio.run(run())


def test_limits_are_shared_by_the_gateways_that_are_up(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    """Two gateways on one store each allow half a key's rate: together never more than the limit."""
    one, two = make_gateway(database_url), make_gateway(database_url)
    key = make_key(one, scopes=["call"], rpm_limit=4)
    time.sleep(4.5)  # both have read the key, beaten their heart and counted each other
    ok = 0
    for gw in (one, two):
        with gw.client(headers=bearer(key)) as c:
            ok += sum(c.post("/v1/chat/completions", json=CHAT).status_code == 200 for _ in range(4))
    assert ok == 4


def test_refuses_to_serve_open_beyond_loopback(tmp_path: Path) -> None:
    """Bound beyond loopback with no key and no admin token, `burnish gateway` exits before it listens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURNISH_")}
    command = [sys.executable, "-m", "burnish_server.cli", "gateway", "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(tmp_path)]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "refusing to serve on 0.0.0.0 without API keys" in refused.stderr
    # Several workers: refused before any starts, with a failing exit status too.
    refused = subprocess.run([*command, "--workers", "2"], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "refusing to serve on 0.0.0.0 without API keys" in refused.stderr

    async def start(**overrides: Any) -> None:  # the same app, told otherwise, starts (it is not served here)
        app = create_app(Settings.load({}, data_dir=str(tmp_path), host="0.0.0.0", **overrides))
        async with app.lifespan():
            pass

    asyncio.run(start(insecure=True))
    asyncio.run(start(admin_token="t"))  # closed: only the admin, and the keys it makes, get in


def test_the_admin_api_takes_admin_keys(gateway: Gateway) -> None:
    admin_key = make_key(gateway, scopes=["admin"])
    with gateway.client(headers=bearer(admin_key)) as c:
        assert c.get("/admin/keys").status_code == 200
        r = c.post("/admin/keys", json={"name": "bad", "scopes": ["everything"]})
        _refused(r, 400, "invalid_key", "/admin/keys")
        _refused(c.post("/admin/keys", json={"name": "bad", "project": "a/b"}), 400, None, "/admin/keys")
        _refused(c.get("/admin/keys/key_ffffffffffffffff"), 404, "key_not_found", "/admin/keys")
        # Control characters: PostgreSQL refuses NUL in text, a newline would forge log lines.
        _refused(c.post("/admin/keys", json={"name": "a\u0000b"}), 400, "invalid_key", "/admin/keys")
        _refused(c.post("/admin/policies", json={"name": "p", "base_model": "m\u0000"}), 400, "invalid_policy", "/admin/policies")
        # The admin scope is for the admin API: a key's data access is its scopes.
        _refused(c.get("/v1/trajectories"), 403, "insufficient_scope", "/v1/trajectories")


def test_ids_of_another_project_never_leak_in_headers(keyed: dict[str, Any], upstream: Upstream) -> None:
    gw, keys = keyed["gw"], keyed["keys"]
    with gw.client(headers=bearer(keys["b"])) as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"x-trajectory-id": "mine", "x-fault": "status:500"})
    assert r.headers["x-trajectory-id"] == "mine"
    assert "team-b" not in r.text and "x-trajectory-id" not in upstream.requests[-1]["headers"]


def test_a_cli_session_is_its_projects_trajectory(keyed: dict[str, Any]) -> None:
    """The Codex CLI's session-id and Claude Code's X-Claude-Code-Session-Id file a session's
    calls under one trajectory of the key's project: the same session id in two projects is two
    trajectories, each read by its own project alone."""
    gw, keys = keyed["gw"], keyed["keys"]
    for team, header in (("a", "session-id"), ("b", "x-claude-code-session-id")):
        with gw.client(headers={**bearer(keys[team]), header: "4b8bbced-d0f2"}) as c:
            for turn in range(2):
                r = c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": f"team {team} turn {turn}"}]})
                assert r.status_code == 200 and r.headers["x-trajectory-id"] == "4b8bbced-d0f2", r.text
    with gw.client(headers=bearer(keys["b"])) as b:
        calls = b.get("/v1/trajectories/4b8bbced-d0f2").json()["calls"]
    assert [c["request"]["messages"][0]["content"] for c in calls] == ["team b turn 0", "team b turn 1"]
    with gw.client(headers=bearer(keys["a_read"])) as a:
        assert [c["request"]["messages"][0]["content"] for c in a.get("/v1/trajectories/4b8bbced-d0f2").json()["calls"]] == ["team a turn 0", "team a turn 1"]
