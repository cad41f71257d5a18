"""The upstream: pooled connections to the replicas, and the retry rule.

The proxy's requests go through ``gateway/upstream/connections/http1.py``, a lean HTTP/1.1 client (httptools'
parser over an asyncio protocol): measured on this path, aiohttp cost ~360k instructions a
request, httpx over aiohttp's transport twice that, and httpcore's pure-Python HTTP/1.1
more again (docs/performance.md). Where the environment routes the upstream through a proxy
(``HTTP_PROXY``/``HTTPS_PROXY``, not bypassed by ``NO_PROXY``), which http1 does not speak,
the same requests go through httpx instead (``HttpxPool``), as RULER's judge and the trainer
already do: slower, and only for deployments that need it.

Failures are burnish's upstream errors (``core/platform/errors.py``), whichever client raised them.
A call is sent again (exponential backoff with jitter, each time to the call's next replica)
only while nothing has reached the client, and only when the upstream did nothing with it:
it could not be connected to, its answer was not HTTP or never began, or it answered
429/502/503/504 (busy, or a proxy in front of it could not reach it). A proxied call has no
effect on the upstream but the compute of an answer, and the gateway records only what it
relays, so an answer that never began costs nothing to ask for again. A time-out, or an
answer that broke off, is reported, never retried. Besides, http1 sends a request once more
on a new connection when the kept-alive one it reused was closed before any answer (the
upstream closed it as idle): so a call is sent at most twice per attempt, ``upstream_attempts``
attempts in all.

Time-outs (``core/platform/settings.py``): connecting (``upstream_connect_timeout``), the wait for
the answer to begin (``upstream_timeout``: its head, counted from sending the request, and
a stream's first event), and silence between reads once it has begun
(``upstream_read_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import urllib.request
from collections.abc import Iterable
from urllib.parse import urlsplit

from burnish_server.core.platform.errors import (
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    VersionLoading,
)
from burnish_server.core.platform.replicas import ReplicaSet
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.proxy.filing import FILING_HEADERS
from burnish_server.gateway.upstream.connections.base import Connections, UpstreamResponse
from burnish_server.gateway.upstream.connections.http1 import Pool, check_header
from burnish_server.gateway.upstream.connections.httpx_pool import HttpxPool

log = logging.getLogger("burnish.gateway")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# The upstream did nothing with the request: sent again (see above).
RETRIED = (UpstreamConnectError, UpstreamClosed, UpstreamProtocolError)

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# Not forwarded upstream: the gateway's own headers, and what the client sets itself.
_DROP_REQUEST = _HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding", b"expect"} | {h.encode() for h in FILING_HEADERS}
_CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
# Not relayed to the client: the ASGI server sets framing and its own date and server.
_DROP_RESPONSE = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date", "server", "te", "trailer", "upgrade"}
)


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for https replicas: the system's trust store unless a CA bundle is
    given, with a client certificate where one is (None: the default, made when first needed)."""
    if not (settings.upstream_ca_bundle or settings.upstream_client_cert):
        return None
    context = ssl.create_default_context(cafile=settings.upstream_ca_bundle or None)
    if settings.upstream_client_cert:
        context.load_cert_chain(settings.upstream_client_cert, settings.upstream_client_key or None)
    return context


def proxied(urls: Iterable[str]) -> bool:
    """Whether the environment sends any of these URLs through a proxy (``*_PROXY``, ``NO_PROXY``)."""
    proxies = urllib.request.getproxies_environment()
    for url in urls:
        parts = urlsplit(url)
        if proxies.get(parts.scheme) and not urllib.request.proxy_bypass_environment(parts.netloc, proxies):  # type: ignore[attr-defined]
            return True
    return False


class Upstream:
    """The replicas (one, or several: ``core/platform/replicas.py`` orders them for each call) and one
    connection pool to all of them. ``gateway/upstream/replicas.py`` keeps their health and models."""

    def __init__(self, settings: Settings, replicas: ReplicaSet) -> None:
        self.replicas = replicas
        self.attempts = max(1, settings.upstream_attempts)
        self.initial_wait, self.max_wait = settings.retry_initial_wait, settings.retry_max_wait
        self.api_key = b"Bearer " + settings.upstream_api_key.encode() if settings.upstream_api_key else None
        if self.api_key is not None:  # a key with a line break would fail every call, as the client's fault
            check_header(b"authorization", self.api_key)
        self.first = settings.upstream_timeout or None
        self.between = settings.upstream_read_timeout or None
        tls = tls_context(settings)
        self.pool: Connections
        self.checks: Connections
        if proxied(r.url for r in replicas.replicas) or (settings.upstream_discover and proxied([settings.upstream_discover])):
            log.warning(
                "the upstream is reached through the environment's proxy (HTTP_PROXY/HTTPS_PROXY): calls go through httpx, at more CPU each; set NO_PROXY to reach it directly"
            )
            self.pool = HttpxPool(settings, settings.max_connections, tls)
            self.checks = HttpxPool(settings, settings.health_check_connections, tls)
        else:
            several = len(replicas.replicas) > 1 or bool(settings.upstream_discover)
            per_replica = settings.max_connections_per_replica or (settings.max_connections // 2 if several else settings.max_connections)
            idle = settings.upstream_idle_expiry
            self.pool = Pool(settings.max_connections, settings.upstream_connect_timeout, per_origin=per_replica, idle_expiry=idle, tls=tls)
            self.checks = Pool(settings.health_check_connections, settings.upstream_connect_timeout, per_origin=per_replica, idle_expiry=idle, tls=tls)

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.checks.aclose()

    def request_headers(self, raw: Iterable[tuple[bytes, bytes]], *, ours: bool = False) -> list[tuple[bytes, bytes]]:
        """The client's headers as sent upstream. ``ours``: the client's credential is a burnish
        key (or the admin token), which must never reach the upstream."""
        drop = _DROP_REQUEST | _CREDENTIALS if ours else _DROP_REQUEST
        headers = [(k, v) for k, v in raw if k.lower() not in drop]
        # Identity: the gateway reads what it forwards, and loopback bandwidth is free.
        headers.append((b"accept-encoding", b"identity"))
        if self.api_key is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            headers.append((b"authorization", self.api_key))
        return headers

    async def send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None,
        headers: list[tuple[bytes, bytes]],
        sticky: str | None = None,
        model: str | None = None,
        kept: bool = False,
    ) -> tuple[UpstreamResponse, int]:
        """Send with retries; returns the (streaming) response and the attempts it took.

        ``sticky`` (the trajectory id) and ``model`` choose the replica; each retry goes to the
        next choice, after a backoff, and a replica that cannot be reached is marked down
        until its next health check. After the last attempt a retryable status is returned as
        it is (the caller relays it); a failure raises its ``UpstreamError``, saying why.
        ``kept``: ``model`` is a version the trainer keeps loaded everywhere, so a 404 means
        the replica is being caught up: retried, and at the last ``VersionLoading`` (503).

        The loop is written out rather than run by tenacity (used for RULER's judge): on the
        hot path tenacity's per-call machinery cost 0.026 ms, 3% of a whole proxied call.
        """
        order = self.replicas.order(sticky, model)
        if not order:
            raise UpstreamConnectError("no upstream replica is known (upstream_discover resolved to none yet)")
        attempt = 0
        while True:
            replica = order[attempt % len(order)]
            if not replica.healthy:  # found down during this call: the next choice that is not
                replica = next((r for r in order if r.healthy), replica)
            attempt += 1
            try:
                response = await self.request(method, replica.url, path, content, headers)
            except RETRIED as exc:
                replica.healthy = False  # until gateway/upstream/replicas.py sees it answer again
                if attempt >= self.attempts:
                    raise failed(exc, "could not reach the upstream", attempt) from exc
            except UpstreamError as exc:  # a time-out, or a failure mid-answer: not retried (the upstream may have it)
                raise failed(exc, "could not reach the upstream", attempt) from exc
            else:
                lacking = kept and response.status_code == 404
                if not lacking and (response.status_code not in RETRY_STATUSES or attempt >= self.attempts):
                    return response, attempt
                await response.aclose()
                if lacking and attempt >= self.attempts:
                    raise VersionLoading(f"no replica serves {model} yet: it is being loaded again (a replica restarted); retry shortly", attempts=attempt)
            # Exponential backoff with jitter, as tenacity's wait_exponential_jitter.
            await asyncio.sleep(min(self.initial_wait * 2 ** (attempt - 1), self.max_wait) + random.uniform(0, self.initial_wait))

    async def request(
        self, method: str, base: str, path: str, content: bytes | None, headers: list[tuple[bytes, bytes]], timeout: float | None = None
    ) -> UpstreamResponse:
        """One request to ``base`` + ``path``, no retry. ``timeout``: for the head and for each
        read of a small exchange (a health check, on its own pool), in place of the upstream's
        time-outs."""
        pool, first, between = (self.checks, timeout, timeout) if timeout else (self.pool, self.first, self.between)
        return await pool.request(method.encode(), base, path.encode("latin-1"), headers, content, first, between)


def failed(exc: UpstreamError, what: str, attempts: int = 1) -> UpstreamError:
    """``exc`` as the client is told it: what the gateway was doing, and why it failed (a
    time-out says only that: its figures are the gateway's business)."""
    if isinstance(exc, UpstreamTimeout):
        out: UpstreamError = type(exc)("the upstream did not answer in time", attempts=attempts)
    else:
        out = type(exc)(f"{what}: {exc.message}", attempts=attempts)
    return out


def response_headers(response: UpstreamResponse) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in _DROP_RESPONSE}  # names in lower case


def is_stream(response: UpstreamResponse) -> bool:
    return response.status_code < 400 and response.headers.get("content-type", "").startswith("text/event-stream")
