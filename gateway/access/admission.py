"""Access at the edge: who is calling, whether the route allows it, and per-key limits.

Every route says what it needs in its ``opt["scope"]`` (``core/platform/access.py``: call, read,
metrics, admin; ``"call|read"`` for either) or ``"public"``; a route that says nothing
needs ``admin``. ``Access.admit`` checks a request, in one raw ASGI middleware
(``access_middleware``) that runs after Litestar's routing, before the handler, and on the
proxy's calls, which the gateway's entry point serves itself (``gateway/edge/entry.py``):

1. the credential: ``Authorization: Bearer <key>`` (what OpenAI clients send as their
   ``api_key``) or ``x-api-key: <key>`` (what Anthropic clients send); on the dashboard's
   routes only (``opt["session"]``), without either, the sign-in's session cookie
   (``gateway/access/sessions.py``);
2. who it is: the admin token (every scope, the default project), a key (its project and
   scopes; revoked and expired keys are refused), the key or admin token a live session was
   signed in with, or, while the gateway is open, anyone;
3. the key's limits: requests a minute and requests in flight, else 429 with
   ``Retry-After``;
4. the principal goes into the scope, where handlers read it (``principal``).

The gateway is open (no credential needed, everything in the default project) only while it
has never had an API key and is bound to loopback or started with ``--insecure``; the first
key made closes it for good (``store/keys.py``). Keys are kept in memory (``KeyRing``),
re-read every ``KEYS_REFRESH_EVERY_S``, and a secret not in memory is looked up once in the
store, so a key made through another gateway works at once and a revoked one stops within
that refresh. A secret the store does not know is remembered as unknown for
``UNKNOWN_KEY_TTL_S``: a client sending wrong keys costs no store read per request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import time
from collections.abc import Iterable
from typing import Any

from litestar.openapi.spec import SecurityScheme
from litestar.types import ASGIApp, Receive, Scope, Send

from burnish_server.core.platform.access import ANONYMOUS, ROOT, ApiKey, Limits, Principal, hash_secret, is_loopback
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import BurnishError, Forbidden, TooManyRequests, Unauthorized
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.access.sessions import Sessions, cookie_secret
from burnish_server.store import keys as store
from burnish_server.store.database import Database

log = logging.getLogger("burnish.gateway")

# How often the key ring is re-read: a key revoked elsewhere stops working within it. A
# constant: docs/security.md promises 'within a second', and nothing is gained by waiting longer.
KEYS_REFRESH_EVERY_S = 1.0
# A secret that is no key is remembered as unknown this long, so a client that keeps sending
# a wrong key (or random ones) costs the store no read per request. As long as the refresh:
# a key made through another gateway works here within the same second either way.
UNKNOWN_KEY_TTL_S = KEYS_REFRESH_EVERY_S
# At most this many unknown secrets remembered; beyond, the oldest are forgotten.
UNKNOWN_KEYS_MAX = 4096
# Gateways say they are up this often; one silent for ALIVE_S no longer shares the limits
# (constants: the figures docs/security.md states for the fleet's shares).
HEARTBEAT_EVERY_S = 2.0
ALIVE_S = 10.0
PUBLIC = "public"
_AUTHORIZATION = b"authorization"
_X_API_KEY = b"x-api-key"
_NO_LIMITS = Limits()

# For the OpenAPI schema: routes that need a key say ``security=BEARER``.
SECURITY_SCHEMES: dict[str, Any] = {
    "apiKey": SecurityScheme(type="http", scheme="bearer", description="An API key (or the admin token), sent as the client's api_key"),
    "anthropicKey": SecurityScheme(type="apiKey", name="x-api-key", security_scheme_in="header", description="The same key, as Anthropic's clients send it"),
}
# Either one: a route needs one of them.
BEARER: list[dict[str, list[str]]] = [{"apiKey": []}, {"anthropicKey": []}]
# The statuses access itself can answer on a route that needs a key: 503 while the store it
# reads keys from (and the route its data from) is away (core/platform/errors.py: StoreUnavailable).
ACCESS_ERRORS = (401, 403, 429, 503)


class KeyRing:
    """The gateway's snapshot of the API keys, by the hash of their secret."""

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self.replace(keys)

    def replace(self, keys: Iterable[ApiKey]) -> None:
        self.by_hash = {k.secret_hash: k for k in keys}
        # Whether some key has limits (gateways then share them: follow_keys), kept, not scanned per call.
        self.limited = any(k.limits != _NO_LIMITS for k in self.by_hash.values())

    def add(self, key: ApiKey) -> None:
        self.by_hash[key.secret_hash] = key
        self.limited = self.limited or key.limits != _NO_LIMITS

    @property
    def configured(self) -> bool:
        """Whether the store has ever had a key (revoked ones keep their rows)."""
        return bool(self.by_hash)


class _Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``size`` saved up."""

    __slots__ = ("rate", "size", "tokens", "at")

    def __init__(self, rate: float, size: float) -> None:
        self.rate, self.size, self.tokens, self.at = rate, size, size, time.monotonic()

    def take(self) -> float:
        """0 if a token was taken, else the seconds until one will be there."""
        now = time.monotonic()
        self.tokens = min(self.size, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Limiter:
    """Per-key request rate and concurrency, this gateway's share of them.

    With N gateways up (heartbeats in the store), each allows 1/N of a key's limits, so the
    fleet together never allows more than the limit, without a round trip to the store per
    call. A client whose calls all land on one gateway gets 1/N of its limit; a balanced
    load gets all of it."""

    def __init__(self) -> None:
        self.gateways = 1
        self.buckets: dict[str, tuple[int, int, _Bucket]] = {}
        self.in_flight: dict[str, int] = {}

    def admit(self, key_id: str, limits: Limits) -> None:
        """Count a request in, or raise 429 with Retry-After. Concurrency is checked first: a
        request refused for it spends none of the key's rate."""
        allowed = None
        if limits.max_parallel_requests is not None:
            allowed = max(1, limits.max_parallel_requests // self.gateways)
            if self.in_flight.get(key_id, 0) >= allowed:
                raise _too_many(f"too many requests in flight: at most {limits.max_parallel_requests} for this key", "concurrency_limit_exceeded", 1.0)
        if limits.rpm_limit is not None:
            entry = self.buckets.get(key_id)
            if entry is None or entry[:2] != (limits.rpm_limit, self.gateways):
                share = limits.rpm_limit / self.gateways
                entry = (limits.rpm_limit, self.gateways, _Bucket(share / 60.0, max(1.0, share)))
                self.buckets[key_id] = entry
            wait = entry[2].take()
            if wait > 0:
                raise _too_many(f"rate limit reached: {limits.rpm_limit} requests a minute for this key", "rate_limit_exceeded", wait)
        if allowed is not None:
            self.in_flight[key_id] = self.in_flight.get(key_id, 0) + 1

    def release(self, key_id: str, limits: Limits) -> None:
        if limits.max_parallel_requests is not None:
            left = self.in_flight.get(key_id, 1) - 1
            if left > 0:
                self.in_flight[key_id] = left
            else:
                self.in_flight.pop(key_id, None)


def _too_many(message: str, code: str, wait_s: float) -> TooManyRequests:
    return TooManyRequests(message, code, retry_after_s=max(1, math.ceil(wait_s)))


def credential(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The key a client sent: ``Authorization: Bearer <key>``, else ``x-api-key``."""
    api_key = None
    for name, value in headers:
        if name == _AUTHORIZATION:
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip().decode("latin-1")
        elif name == _X_API_KEY and value.strip():
            api_key = value.strip().decode("latin-1")
    return api_key


class Access:
    """The gateway's access rule: its keys, its admin token, whether it may run open, its limits."""

    def __init__(self, settings: Settings, db: Database, ring: KeyRing) -> None:
        self.db = db
        self.ring = ring
        self.admin_token = settings.admin_token.encode() if settings.admin_token else None
        # Open is allowed on loopback, or anywhere when the operator said --insecure.
        self.may_be_open = is_loopback(settings.host) or settings.insecure
        self.limiter = Limiter()
        self.sessions = Sessions(settings, db)
        # Hashes of secrets the store did not know, with when to ask it again (UNKNOWN_KEY_TTL_S).
        self.unknown: dict[str, float] = {}
        self.gateway_id = f"{os.uname().nodename[:40]}-{os.getpid()}-{os.urandom(3).hex()}"

    @property
    def open(self) -> bool:
        return self.may_be_open and not self.ring.configured

    async def principal(self, headers: Iterable[tuple[bytes, bytes]]) -> Principal:
        """Who is calling; raises 401 for a missing, unknown, revoked or expired key (when keys are needed)."""
        token = credential(headers)
        if token is not None and self.admin_token is not None and hmac.compare_digest(token.encode("latin-1"), self.admin_token):
            return ROOT
        if self.open:
            return ANONYMOUS  # whatever key a client sends (OpenAI's clients insist on one) is ignored
        if token is None:
            raise Unauthorized("missing API key: send it as the client's api_key (Authorization: Bearer <key>)", "missing_api_key")
        secret_hash = hash_secret(token)
        key = self.ring.by_hash.get(secret_hash) or await self._look_up(secret_hash)
        if key is None:
            raise Unauthorized("invalid API key", "invalid_api_key")
        if why := key.usable(utcnow()):
            raise Unauthorized(f"this API key is {why}", f"key_{why}")
        return Principal(key.project, key.scopes, key.id, key.limits)

    async def _look_up(self, secret_hash: str) -> ApiKey | None:
        """A key not in memory, from the store (made through another gateway since the last
        refresh); a secret found unknown is not looked up again for UNKNOWN_KEY_TTL_S."""
        now = time.monotonic()
        if self.unknown.get(secret_hash, 0.0) > now:
            return None
        key = await self.db.read(store.find_key, secret_hash)
        if key is not None:
            self.ring.add(key)
            return key
        if len(self.unknown) >= UNKNOWN_KEYS_MAX:  # dicts keep insertion order: drop the oldest half
            for stale in list(self.unknown)[: UNKNOWN_KEYS_MAX // 2]:
                del self.unknown[stale]
        self.unknown[secret_hash] = now + UNKNOWN_KEY_TTL_S
        return None

    async def admit(self, headers: Iterable[tuple[bytes, bytes]], need: str) -> Principal:
        """The caller, if it may use a route that needs ``need`` (``"call|read"``: either), counted
        in against its key's limits (``release`` counts it out); else ``Unauthorized``, ``Forbidden`` or ``TooManyRequests``."""
        caller = await self.principal(headers)
        if not any(caller.can(s) for s in need.split("|")):
            raise self._refusal(caller, need)
        if caller.key_id is not None and caller.limits is not None:
            self.limiter.admit(caller.key_id, caller.limits)
        return caller

    async def admit_session(self, secret: str, need: str) -> Principal:
        """``admit`` for a dashboard request that carries a session cookie and no credential of its own."""
        try:
            caller = await self.sessions.principal(secret)
        except Unauthorized:
            if not self.open:
                raise
            caller = ANONYMOUS  # an ended session on an open gateway: anyone, as without the cookie
        # As in admit (kept apart from it: admit is on every proxied call's path).
        if not any(caller.can(s) for s in need.split("|")):
            raise self._refusal(caller, need)
        if caller.key_id is not None and caller.limits is not None:
            self.limiter.admit(caller.key_id, caller.limits)
        return caller

    def release(self, caller: Principal) -> None:
        """The end of a request ``admit`` let in."""
        if caller.key_id is not None and caller.limits is not None:
            self.limiter.release(caller.key_id, caller.limits)

    def _refusal(self, caller: Principal, need: str) -> BurnishError:
        """Why ``caller`` may not use a route that needs ``need``."""
        if caller is not ANONYMOUS:
            return Forbidden(f"this API key lacks the scope this route needs ({need.replace('|', ' or ')})", "insufficient_scope")
        # Anyone on an open gateway: only the admin token opens the admin API.
        if self.admin_token is None:
            return Unauthorized("the admin API is closed: set BURNISH_ADMIN_TOKEN on the gateway, or use a key with the admin scope", "admin_disabled")
        return Unauthorized("missing or wrong admin token (Authorization: Bearer <BURNISH_ADMIN_TOKEN>)", "invalid_admin_token")


def principal(scope: Scope) -> Principal:
    """The caller of the request being handled (set by ``access_middleware``)."""
    found: Principal = scope["state"]["principal"]
    return found


def required_scope(handler: Any) -> str:
    return str(handler.opt.get("scope", "admin"))


def access_middleware(app: ASGIApp) -> ASGIApp:
    """Raw ASGI (a Litestar middleware factory), run after routing: authenticate, authorize, limit."""
    # Each route's scope, and whether a sign-in's session may let a request in (the dashboard's
    # pages: ``opt["session"]``), read once: a handler's ``opt`` is merged from its layers on each read (~0.01 ms).
    needs: dict[int, tuple[str, bool]] = {}

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        need, session = PUBLIC, False
        if scope["type"] == "http":
            handler = scope["route_handler"]
            rule = needs.get(id(handler))
            if rule is None:
                rule = needs[id(handler)] = (required_scope(handler), bool(handler.opt.get("session")))
            need, session = rule
        # OPTIONS is Litestar's own answer of the allowed methods (and CORS preflights carry no key).
        if need == PUBLIC or scope.get("method") == "OPTIONS":
            await app(scope, receive, send)
            return
        access: Access = scope["app"].state.services.access
        headers = scope["headers"]
        # The cookie is read on the dashboard's routes only, and there only without a credential of the request's own.
        secret = cookie_secret(headers, scope["scheme"]) if session and credential(headers) is None else None
        caller = await (access.admit(headers, need) if secret is None else access.admit_session(secret, need))
        scope.setdefault("state", {})["principal"] = caller
        try:
            await app(scope, receive, send)
        finally:
            access.release(caller)

    return middleware


async def follow_keys(db: Database, access: Access, every_s: float = KEYS_REFRESH_EVERY_S) -> None:
    """Keep the key ring in step with the store and share the limits among the gateways that are up."""
    next_beat = 0.0
    while True:
        try:
            access.ring.replace(await db.read(store.load_keys))
            # Heartbeats only matter to limits: no write each beat on a fleet without any.
            if access.ring.limited and time.monotonic() >= next_beat:
                access.limiter.gateways = await db.transaction(store.heartbeat, access.gateway_id, ALIVE_S)
                next_beat = time.monotonic() + HEARTBEAT_EVERY_S
        except Exception as exc:  # the store away for a moment: keep the last snapshot
            log.warning("API keys not refreshed: %s", exc)
        await asyncio.sleep(every_s)
