"""The dashboard's sessions at the edge (``core/platform/sessions.py``): made at sign-in, a request let in
by its cookie, ended at sign-out or by an admin.

The cookie holds the session's random secret, never a credential:

- over HTTPS it is ``__Host-burnish_ui``, ``Secure`` with ``Path=/`` and no ``Domain``, which
  is what that prefix demands: a browser then keeps it only as this host set it, so another
  host (a sibling subdomain, a plain-HTTP page) can neither set nor overwrite it;
- over plain HTTP, ``burnish_ui`` with ``Path=/ui``;
- ``HttpOnly`` and ``SameSite=Strict`` either way (``ui/auth.py`` says why).

Only the dashboard's routes read it (``opt["session"]``, ``gateway/access/admission.py``): it is no
credential on ``/v1`` or ``/admin``, even where the browser sends it there (``Path=/``).

Each dashboard request reads its session, and the session's key, from the store: a
sign-out, an admin's end, or a key revoked through any gateway ends the session on every
gateway at its next request. That is one indexed read per page view, off the proxy's path.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable
from datetime import timedelta

from burnish_server.core.api.views import SessionView
from burnish_server.core.platform.access import ANONYMOUS, ROOT, Principal, hash_secret
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import Unauthorized
from burnish_server.core.platform.sessions import admin_fingerprint, is_secret, new_secret, refusal
from burnish_server.core.platform.settings import Settings
from burnish_server.store import sessions as store
from burnish_server.store.database import Database

COOKIE = "burnish_ui"
SECURE_COOKIE = "__Host-burnish_ui"
# A page view writes the session's last_seen only when the stored one is older than this (or
# than a quarter of the idle timeout, where that is shorter, so a short timeout still sees the
# use): a write per page view would put a store write (on SQLite, the one write lock) in every
# dashboard request, whose live parts are fetched again every few seconds. The cost: a session
# may end up to this much sooner than its idle timeout after its last use.
TOUCH_EVERY_S = 60.0

_ENDED = "this sign-in has ended (signed out, or ended by an admin): sign in again"
_WHY = {
    "expired": "this sign-in is past its lifetime (BURNISH_UI_SESSION_LIFETIME): sign in again",
    "idle": "this sign-in was unused past its idle timeout (BURNISH_UI_SESSION_IDLE): sign in again",
    "key_revoked": "the API key this sign-in used is revoked",
    "key_expired": "the API key this sign-in used has expired",
    "key_missing": "the API key this sign-in used is gone",
    "admin_token_changed": "the gateway's admin token changed since this sign-in: sign in again",
}


def cookie_name(scheme: str) -> str:
    """The session cookie's name for a request that came over ``scheme``."""
    return SECURE_COOKIE if scheme in ("https", "wss") else COOKIE


def cookie_secret(headers: Iterable[tuple[bytes, bytes]], scheme: str) -> str | None:
    """The value of the request's session cookie, as sent (of any shape), or None."""
    prefix = cookie_name(scheme).encode() + b"="
    for name, value in headers:
        if name == b"cookie":
            for part in value.split(b";"):
                part = part.strip()
                if part.startswith(prefix):
                    return part[len(prefix) :].decode("latin-1")
    return None


class Sessions:
    """Sessions of this gateway's dashboard, kept in its store."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.db = db
        self.idle_s = settings.ui_session_idle
        self.lifetime_s = settings.ui_session_lifetime
        self._admin_token = settings.admin_token or None
        self._fingerprint: str | None = None

    async def admin_fingerprint(self) -> str | None:
        """The fingerprint of this gateway's admin token (None without one), computed once, off the loop (it is slow on purpose)."""
        if self._admin_token is not None and self._fingerprint is None:
            self._fingerprint = await asyncio.to_thread(admin_fingerprint, self._admin_token)
        return self._fingerprint

    async def start(self, caller: Principal) -> str:
        """A new session for ``caller`` (a key, or the admin token); the secret for the cookie."""
        assert caller is not ANONYMOUS, "anyone at all needs no session"
        secret = new_secret()
        fingerprint = await self.admin_fingerprint() if caller.key_id is None else None
        make = functools.partial(
            store.create_session,
            secret_hash=hash_secret(secret),
            key_id=caller.key_id,
            project=caller.project,
            admin_fingerprint=fingerprint,
            idle_s=self.idle_s,
            lifetime_s=self.lifetime_s,
        )
        await self.db.transaction(make)
        return secret

    async def principal(self, secret: str) -> Principal:
        """Who holds the session whose secret is ``secret``; ``Unauthorized`` if none is live."""
        if not is_secret(secret):  # not one this gateway made (an old cookie, a forged one): no read
            raise Unauthorized(_ENDED, "session_ended")
        found = await self.db.read(store.find_session, hash_secret(secret))
        if found is None:
            raise Unauthorized(_ENDED, "session_ended")
        session, key = found
        now = utcnow()
        if why := refusal(session, key, now, await self.admin_fingerprint() if session.key_id is None else None):
            raise Unauthorized(_WHY[why], f"session_{why}")
        every = timedelta(seconds=min(TOUCH_EVERY_S, session.idle_s / 4))
        if now - session.last_seen_at >= every:
            await self.db.transaction(store.touch_session, session.id, now, now - every)
        if key is None:
            return ROOT
        return Principal(key.project, key.scopes, key.id, key.limits)

    async def end(self, secret: str) -> bool:
        """Sign-out: end the session whose secret is ``secret``, if there is one."""
        return is_secret(secret) and await self.db.transaction(store.end_session, hash_secret(secret))

    async def end_by_id(self, session_id: str) -> SessionView:
        """An admin ends a session by its public id (``NotFound`` if there is none)."""
        ended = await self.db.transaction(store.end_session_by_id, session_id)
        return store.session_view(ended, "ended")

    async def listing(self) -> list[SessionView]:
        """Every session not past its lifetime, oldest first, each with whether it lets anyone in now."""
        now, fingerprint = utcnow(), await self.admin_fingerprint()
        return [store.session_view(s, refusal(s, key, now, fingerprint) or "active") for s, key in await self.db.read(store.live_sessions, now)]

    async def id_of(self, secret: str | None) -> str | None:
        """The public id of the session whose secret is ``secret`` (to mark "this browser" in a list)."""
        if secret is None or not is_secret(secret):
            return None
        found = await self.db.read(store.find_session, hash_secret(secret))
        return found[0].id if found is not None else None
