"""The dashboard's sessions (core/platform/sessions.py, gateway/access/sessions.py): a sign-in keeps a random
secret in the cookie and its hash in the store, never the credential; sign-out, an admin, a
revoked key and a changed admin token end it on every gateway sharing the store; idle and
absolute expiry; the cookie is no credential outside /ui. Over real sockets, on a real SQLite
file and PostgreSQL; the last test drives Debian's Chromium.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from burnish_server.core.platform.access import hash_secret
from burnish_server.core.platform.clock import utcnow
from burnish_server.store.database import Database
from burnish_server.store.models import ApiKeyRow, UiSessionRow
from tests.conftest import ADMIN_TOKEN, PG_REQUIRED, Gateway
from tests.gateway.test_access import bearer, make_key
from tests.upstream import Upstream

HTTPS = {"x-forwarded-proto": "https"}  # uvicorn believes it from loopback: the request's scheme is https
SECRET = re.compile(r"^[A-Za-z0-9_-]{43}$")


def sign_in(gw: Gateway, token: str, *, https: bool = False, cookie: str | None = None) -> tuple[str, str, str]:
    """Sign in through the form; the cookie's name, value and the whole Set-Cookie header."""
    headers = {**(HTTPS if https else {}), **({"cookie": cookie} if cookie else {})}
    with gw.client(follow_redirects=False) as c:
        r = c.post("/ui/login", data={"token": token, "next": "/ui/groups"}, headers=headers)
    assert r.status_code == 303 and r.headers["location"] == "/ui/groups", (r.status_code, r.headers)
    header = r.headers["set-cookie"]
    name, _, rest = header.partition("=")
    return name, rest.split(";", 1)[0], header


def page(gw: Gateway, name: str, value: str, path: str = "/ui/groups", *, https: bool = False, method: str = "GET", **headers: str) -> httpx.Response:
    with gw.client(follow_redirects=False) as c:
        return c.request(method, path, headers={"cookie": f"{name}={value}", **(HTTPS if https else {}), **headers})


def refused_with(r: httpx.Response, words: str) -> None:
    """A dashboard page refused for want of a live session: to the sign-in form, saying why."""
    assert r.status_code in (302, 303), (r.status_code, r.text)
    location = r.headers["location"]
    assert location.startswith("/ui/login?"), location
    assert words in httpx.QueryParams(location.split("?", 1)[1])["error"], location


def closed(gw: Gateway) -> Gateway:
    """The gateway, closed by its first key (an open one lets anyone read without a session)."""
    make_key(gw, name="someone", scopes=["call"])
    return gw


def in_store(gw: Gateway, fn: Callable[[Connection], Any]) -> Any:
    async def run() -> Any:
        db = Database(gw.settings.resolved_database_url)
        try:
            return await db.transaction(fn)
        finally:
            await db.dispose()

    return asyncio.run(run())


def session_rows(gw: Gateway) -> list[Any]:
    return in_store(gw, lambda conn: list(conn.execute(select(UiSessionRow).order_by(UiSessionRow.pk))))


def set_session(gw: Gateway, value: str, **values: Any) -> None:
    in_store(gw, lambda conn: conn.execute(update(UiSessionRow).where(UiSessionRow.secret_hash == hash_secret(value)).values(**values)))


def test_the_cookie_holds_a_random_secret_never_the_credential(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    gw = make_gateway()
    reader = make_key(gw, name="reader", scopes=["read"])
    values = []
    for token in (reader, reader, ADMIN_TOKEN, ADMIN_TOKEN):
        name, value, header = sign_in(gw, token)
        assert name == "burnish_ui" and "Path=/ui" in header and "HttpOnly" in header and "samesite=strict" in header.lower()
        assert "Secure" not in header  # plain HTTP: a browser would drop a Secure cookie
        assert SECRET.match(value) and token not in value and value not in token
        # Not made from the credential: each sign-in with the same one gets its own.
        assert value not in (hash_secret(token), hashlib.sha256(token.encode()).hexdigest()[:43])
        values.append(value)
        assert page(gw, name, value).status_code == 200
    assert len(set(values)) == 4
    # The store keeps the secret's hash, and nothing of the credential.
    rows = session_rows(gw)
    assert sorted(r.secret_hash for r in rows) == sorted(hash_secret(v) for v in values)
    stored = " ".join(str(list(r)) for r in rows)
    for credential in (reader, ADMIN_TOKEN):
        assert credential not in stored and hash_secret(credential) not in stored
    assert not any(value in stored for value in values)
    assert [r.key_id is None for r in rows] == [False, False, True, True]
    assert all(r.id.startswith("ses_") and r.id not in values for r in rows)


def test_over_https_the_cookie_is_a_host_cookie(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    gw = closed(make_gateway())
    name, value, header = sign_in(gw, ADMIN_TOKEN, https=True)
    # __Host-: Secure, Path=/ and no Domain, or a browser refuses it.
    assert name == "__Host-burnish_ui" and "Secure" in header and "Path=/;" in header + ";" and "domain" not in header.lower()
    assert "HttpOnly" in header and "samesite=strict" in header.lower()
    assert page(gw, name, value, https=True).status_code == 200
    # Each name only over its own scheme: a plain cookie is not read over HTTPS, nor the other way.
    refused_with(page(gw, "burnish_ui", value, https=True), "missing")
    refused_with(page(gw, name, value), "missing")
    # Sign-out over HTTPS ends it and clears the cookie as the browser will accept (Secure, Path=/).
    with gw.client(follow_redirects=False) as c:
        out = c.post("/ui/logout", headers={"cookie": f"{name}={value}", **HTTPS})
    cleared = out.headers["set-cookie"]
    assert out.status_code == 303 and cleared.startswith(f"{name}=") and "Secure" in cleared and "Max-Age=0" in cleared and "Path=/;" in cleared + ";"
    refused_with(page(gw, name, value, https=True), "ended")


def test_a_cookie_copied_before_sign_out_is_refused_after_it(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    gw = closed(make_gateway())
    gw.create_policy("agent", "m")
    name, copied, _ = sign_in(gw, ADMIN_TOKEN)
    with gw.client(follow_redirects=False, cookies={name: copied}) as browser:
        assert browser.get("/ui/groups").status_code == 200
        out = browser.post("/ui/logout")
        assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    assert session_rows(gw) == []
    refused_with(page(gw, name, copied), "ended")
    refused_with(page(gw, name, copied, "/ui/sessions"), "ended")
    control = page(gw, name, copied, "/ui/policies/agent/pause", method="POST")
    assert control.status_code == 401 and control.headers["content-type"].startswith("text/html")
    assert gw.policy()["paused"] is False
    # Signing in again ends the session the browser held before.
    name, first, _ = sign_in(gw, ADMIN_TOKEN)
    _, second, _ = sign_in(gw, ADMIN_TOKEN, cookie=f"{name}={first}")
    refused_with(page(gw, name, first), "ended")
    assert page(gw, name, second).status_code == 200 and len(session_rows(gw)) == 1


def test_the_cookie_is_no_credential_outside_the_dashboard(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    gw = closed(make_gateway())
    for https in (False, True):
        name, value, _ = sign_in(gw, ADMIN_TOKEN, https=https)
        assert page(gw, name, value, "/ui", https=https).status_code == 200
        for method, path in (
            ("GET", "/admin/policies"),
            ("GET", "/admin/sessions"),
            ("GET", "/v1/trajectories"),
            ("GET", "/metrics"),
            ("POST", "/v1/chat/completions"),
        ):
            r = page(gw, name, value, path, https=https, method=method)
            assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key", (path, r.text)


def test_idle_and_lifetime_end_a_session_in_real_time(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    """Small settings: use keeps a session past its idle timeout (its last page view is written
    once a quarter of it has passed), never past its lifetime; unused, it ends."""
    gw = closed(make_gateway(ui_session_idle=2.0, ui_session_lifetime=4.0))
    name, value, header = sign_in(gw, ADMIN_TOKEN)
    assert "Max-Age=4" in header
    started = time.monotonic()
    while time.monotonic() - started < 3.0:  # past the idle timeout, used all along
        assert page(gw, name, value).status_code == 200
        time.sleep(0.3)
    time.sleep(max(0.0, 4.2 - (time.monotonic() - started)))
    refused_with(page(gw, name, value), "lifetime")
    # Unused past its idle timeout: ended. Its own gateway, with a lifetime no stall on a busy
    # machine reaches first (both ends would refuse it, and lifetime is checked first).
    gw = closed(make_gateway(ui_session_idle=1.0, ui_session_lifetime=60.0))
    name, value, _ = sign_in(gw, ADMIN_TOKEN)
    time.sleep(1.3)
    refused_with(page(gw, name, value), "idle")


def test_idle_and_lifetime_as_the_store_keeps_them(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    """The default terms (8 hours idle, 7 days in all), held to times set in the store; the last
    page view is written at most once a minute."""
    gw = closed(make_gateway(database_url))
    name, value, _ = sign_in(gw, ADMIN_TOKEN)
    [row] = session_rows(gw)
    assert row.idle_s == 8 * 3600 and timedelta(days=7) - (row.expires_at - row.created_at) < timedelta(seconds=1)
    now = utcnow()
    # Seen 30 s ago: a page view writes nothing.
    set_session(gw, value, last_seen_at=now - timedelta(seconds=30))
    assert page(gw, name, value).status_code == 200
    assert abs((session_rows(gw)[0].last_seen_at.replace(tzinfo=None) - (now - timedelta(seconds=30)).replace(tzinfo=None)).total_seconds()) < 0.01
    # Seen 2 minutes ago: the page view is written.
    set_session(gw, value, last_seen_at=now - timedelta(minutes=2))
    assert page(gw, name, value).status_code == 200
    assert (session_rows(gw)[0].last_seen_at.replace(tzinfo=None) - now.replace(tzinfo=None)).total_seconds() > -1
    # Unused for 8 hours: ended; used a minute ago but signed in 7 days ago: ended.
    set_session(gw, value, last_seen_at=now - timedelta(hours=8, seconds=1))
    refused_with(page(gw, name, value), "idle")
    set_session(gw, value, last_seen_at=now - timedelta(minutes=1), created_at=now - timedelta(days=7), expires_at=now - timedelta(seconds=1))
    refused_with(page(gw, name, value), "lifetime")
    # The next sign-in sweeps the sessions past their lifetime away.
    sign_in(gw, ADMIN_TOKEN)
    assert len(session_rows(gw)) == 1


def test_a_session_holds_across_gateways_sharing_a_store(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    one = make_gateway(database_url)
    reader = make_key(one, name="reader", project="team-a", scopes=["read"])
    two = make_gateway(database_url)  # started closed: it has read the key (else open for up to a second)
    name, value, _ = sign_in(one, reader)
    assert page(two, name, value).status_code == 200
    # Signed out through the other gateway: refused by both at their next request.
    with two.client(follow_redirects=False) as c:
        assert c.post("/ui/logout", headers={"cookie": f"{name}={value}"}).status_code == 303
    refused_with(page(one, name, value), "ended")
    refused_with(page(two, name, value), "ended")


def test_a_revoked_or_expired_keys_session_is_refused_at_once(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    one = make_gateway(database_url)
    reader = make_key(one, name="reader", scopes=["read"])
    two = make_gateway(database_url)
    name, value, _ = sign_in(one, reader)
    assert page(one, name, value).status_code == 200  # the key is now in gateway one's memory
    with two.admin() as c:
        key_id = c.get("/admin/keys").json()["data"][0]["id"]
        assert c.delete(f"/admin/keys/{key_id}").status_code == 200
    # At once, on the gateway that did not revoke it (its key ring is a second behind).
    refused_with(page(one, name, value), "ended")
    assert session_rows(one) == []
    # A key that expires: its session stops with it.
    brief = make_key(one, name="brief", scopes=["read"], expires_in=1.0)
    name, value, _ = sign_in(one, brief)
    assert page(two, name, value).status_code == 200
    time.sleep(1.1)
    refused_with(page(two, name, value), "expired")
    # A key revoked by writing the store alone (burnish keys revoke does the same through the store).
    other = make_key(one, name="other", scopes=["read"])
    name, value, _ = sign_in(one, other)
    in_store(one, lambda conn: conn.execute(update(ApiKeyRow).where(ApiKeyRow.secret_hash == hash_secret(other)).values(revoked_at=utcnow())))
    refused_with(page(one, name, value), "revoked")


def test_a_changed_admin_token_ends_the_admin_sessions(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    before = make_gateway(database_url)
    reader = make_key(before, name="reader", scopes=["read"])
    name, admin, _ = sign_in(before, ADMIN_TOKEN)
    _, keyed, _ = sign_in(before, reader)
    # The same store behind a gateway with another admin token (restarted with it, or beside it).
    after = make_gateway(database_url, admin_token="another-admin-token")
    refused_with(page(after, name, admin), "admin token changed")
    assert page(after, name, keyed).status_code == 200  # a key's session does not depend on it
    with after.client(headers=bearer("another-admin-token")) as c:
        statuses = {s["key_id"]: s["status"] for s in c.get("/admin/sessions").json()["data"]}
    assert statuses == {None: "admin_token_changed", session_rows(after)[1].key_id: "active"}
    assert page(before, name, admin).status_code == 200  # the old token's gateway still knows it
    without = make_gateway(database_url, admin_token="")
    refused_with(page(without, name, admin), "admin token changed")


def test_an_admin_lists_and_ends_sessions(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    gw = make_gateway(database_url)
    reader = make_key(gw, name="reader", project="team-a", scopes=["read"])
    name, mine, _ = sign_in(gw, ADMIN_TOKEN)
    _, theirs, _ = sign_in(gw, reader)
    with gw.admin() as c:
        listed = c.get("/admin/sessions")
        assert listed.status_code == 200
        data = listed.json()["data"]
        assert [(s["object"], s["project"], s["status"]) for s in data] == [("ui_session", "default", "active"), ("ui_session", "team-a", "active")]
        assert data[0]["key_id"] is None and data[1]["key_id"].startswith("key_")
        assert all(re.fullmatch(r"ses_[0-9a-f]{16}", s["id"]) and s["idle_until"] and s["expires_at"] and s["last_seen_at"] for s in data)
        for secret in (mine, theirs):
            assert secret not in listed.text and hash_secret(secret) not in listed.text
        ended = c.delete(f"/admin/sessions/{data[1]['id']}")
        assert ended.status_code == 200 and ended.json()["status"] == "ended" and ended.json()["id"] == data[1]["id"]
        again = c.delete(f"/admin/sessions/{data[1]['id']}")
        assert again.status_code == 404 and again.json()["error"]["code"] == "session_not_found"
        for bad in ("nope", "ses_XYZ", "ses_0123456789abcdef0", "key_0123456789abcdef"):
            r = c.delete(f"/admin/sessions/{bad}")
            assert r.status_code == 400 and r.json()["error"]["message"], (bad, r.text)
        assert [s["id"] for s in c.get("/admin/sessions").json()["data"]] == [data[0]["id"]]
    refused_with(page(gw, name, theirs), "ended")
    assert page(gw, name, mine).status_code == 200
    with gw.client(headers=bearer(reader)) as c:
        r = c.get("/admin/sessions")
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"


def test_the_dashboard_lists_and_ends_sessions_for_the_admin(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    gw = make_gateway()
    reader = make_key(gw, name="reader", scopes=["read"])
    name, mine, _ = sign_in(gw, ADMIN_TOKEN)
    _, theirs, _ = sign_in(gw, reader)
    listed = page(gw, name, mine, "/ui/sessions")
    assert listed.status_code == 200 and 'id="sessions"' in listed.text and "this browser" in listed.text
    assert 'href="/ui/sessions"' in page(gw, name, mine, "/ui").text
    assert mine not in listed.text and theirs not in listed.text and hash_secret(theirs) not in listed.text
    [their_id] = [r.id for r in session_rows(gw) if r.key_id is not None]
    # A read key's session neither sees the list nor ends anything.
    assert page(gw, name, theirs, "/ui/sessions").status_code == 403
    assert 'href="/ui/sessions"' not in page(gw, name, theirs, "/ui").text
    assert page(gw, name, theirs, f"/ui/sessions/{their_id}/end", method="POST").status_code == 403
    # Posted from another site's page: refused, whoever's cookie it carries.
    assert page(gw, name, mine, f"/ui/sessions/{their_id}/end", method="POST", origin="https://evil.example").status_code == 403
    assert page(gw, name, theirs).status_code == 200
    r = page(gw, name, mine, f"/ui/sessions/{their_id}/end", method="POST", origin=gw.url)
    assert (r.status_code, r.headers["location"]) == (303, f"/ui/sessions?done={their_id}")
    refused_with(page(gw, name, theirs), "ended")
    after = page(gw, name, mine, f"/ui/sessions?done={their_id}")
    assert f"session {their_id} ended" in after.text and their_id not in after.text.split('id="sessions"', 1)[1]
    # Bad input: a page that says so, never a 500.
    for bad in ("nope", "ses_0123456789ABCDEF"):
        r = page(gw, name, mine, f"/ui/sessions/{bad}/end", method="POST", origin=gw.url)
        assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    r = page(gw, name, mine, "/ui/sessions/ses_0123456789abcdef/end", method="POST", origin=gw.url)
    assert r.status_code == 404 and "no dashboard session" in r.text
    assert page(gw, name, mine, "/ui/sessions?done=<script>").status_code == 200


@pytest.mark.parametrize(
    "value", ["", "x", "A" * 43, "A" * 44, "a" * 5000, "%00%ff", "bsk-" + "a" * 43, ADMIN_TOKEN, '"quoted"', "ü", "a b", "=", "ses_0123456789abcdef"]
)
def test_hostile_cookies_are_a_sign_in_never_a_500(make_gateway: Callable[..., Gateway], upstream: Upstream, value: str) -> None:
    gw = closed(make_gateway())
    with gw.client(follow_redirects=False) as c:
        cookie = f"burnish_ui={value}; burnish_ui=other; __Host-burnish_ui={value}".encode()
        r = c.get("/ui/groups", headers={"cookie": cookie})
        assert r.status_code in (302, 303) and r.headers["location"].startswith("/ui/login"), r.text
        r = c.post("/ui/policies/agent/pause", headers={"cookie": cookie})
        assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
        assert c.post("/ui/logout", headers={"cookie": cookie}).status_code == 303


def test_an_ended_session_on_an_open_gateway_reads_as_anyone(gateway: Gateway) -> None:
    name, value, _ = sign_in(gateway, ADMIN_TOKEN)
    assert 'id="sessions"' in page(gateway, name, value, "/ui/sessions").text
    with gateway.client(follow_redirects=False) as c:
        c.post("/ui/logout", headers={"cookie": f"{name}={value}"})
    # Anyone reads an open gateway; the controls and the sessions need the admin token.
    assert page(gateway, name, value).status_code == 200
    refused_with(page(gateway, name, value, "/ui/sessions"), "admin token")


# ---- in Debian's Chromium ------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_in_chromium_sign_out_and_an_admins_end_close_every_copy(make_gateway: Callable[..., Gateway], upstream: Upstream) -> None:
    if not Path(CHROMIUM).exists():
        if PG_REQUIRED:
            pytest.fail("Debian's chromium is not installed; `make test` installs it")
        pytest.skip("chromium is not installed (make test installs it)")
    from playwright.sync_api import expect, sync_playwright

    gw = make_gateway()
    reader = make_key(gw, name="reader", scopes=["read"])

    def signed_in(browser: Any, token: str) -> Any:
        context = browser.new_context()
        tab = context.new_page()
        tab.goto(gw.url + "/ui")
        tab.fill("input[name=token]", token)
        tab.click("button[type=submit]")
        expect(tab).to_have_url(re.compile(r"/ui$"))
        return tab

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            admin = signed_in(browser, ADMIN_TOKEN)
            [cookie] = admin.context.cookies()
            assert cookie["name"] == "burnish_ui" and cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != ADMIN_TOKEN
            # The same cookie, copied into another browser, works until the first signs out.
            thief = browser.new_context()
            thief.add_cookies([cookie])
            stolen = thief.new_page()
            stolen.goto(gw.url + "/ui/groups")
            expect(stolen).to_have_url(re.compile(r"/ui/groups$"))

            reading = signed_in(browser, reader)
            admin.click("text=Sessions")
            rows = admin.locator("#sessions tbody tr")
            expect(rows).to_have_count(2)
            expect(rows.first).to_contain_text("this browser")
            admin.locator("#sessions tbody tr", has_text="key").locator("button").click()
            expect(admin.locator("p.notice")).to_contain_text("ended")
            expect(admin.locator("#sessions tbody tr")).to_have_count(1)
            reading.goto(gw.url + "/ui/groups")
            expect(reading).to_have_url(re.compile(r"/ui/login"))
            expect(reading.locator("p.error")).to_contain_text("ended")

            admin.click("text=sign out")
            expect(admin).to_have_url(re.compile(r"/ui/login"))
            assert admin.context.cookies() == []
            stolen.goto(gw.url + "/ui/groups")
            expect(stolen).to_have_url(re.compile(r"/ui/login"))
        finally:
            browser.close()
