"""The upstream: pooled connections to the replicas, and the retry rule.

The proxy's requests go through ``gateway/http1.py``, a lean HTTP/1.1 client (httptools'
parser over an asyncio protocol): measured on this path, aiohttp cost ~360k instructions a
request, httpx over aiohttp's transport twice that, and httpcore's pure-Python HTTP/1.1
more again (docs/performance.md). httpx stays everywhere off the hot path (RULER's judge,
the trainer, the SDK); its exception classes are this module's vocabulary for failures, so
callers handle one kind.

A request is retried (exponential backoff with jitter) on connection errors and on
429/502/503/504, and only here, before the gateway has sent the client anything; each
retry goes to the call's next replica. Once the first byte is on its way to the client,
a failure is reported, never retried.

Time-outs (``core/settings.py``): connecting (``upstream_connect_timeout``), the wait for
the answer to begin (``upstream_timeout``: its head, counted from sending the request, and
a stream's first event), and silence between reads once it has begun
(``upstream_read_timeout``). Every failure is an ``httpx`` error: an answer that is not
HTTP (garbage for a status line, broken headers or chunked framing) is
``RemoteProtocolError``, a connection error like any other.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable

import httpx

from burnish_server.core.replicas import ReplicaSet
from burnish_server.core.settings import Settings
from burnish_server.gateway.http1 import Pool
from burnish_server.gateway.http1 import Response as UpstreamResponse
from burnish_server.gateway.keys import KEY_HEADERS

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# The request never reached the upstream, or the connection died before any answer.
CONNECTION_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# Not forwarded upstream: the gateway's own headers, and what the client sets itself.
_DROP_REQUEST = _HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding", b"expect"} | {h.encode() for h in KEY_HEADERS}
_CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
# Not relayed to the client: the ASGI server sets framing and its own date and server.
_DROP_RESPONSE = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date", "server", "te", "trailer", "upgrade"}
)


class Upstream:
    """The replicas (one, or several: ``core/replicas.py`` orders them for each call) and one
    connection pool to all of them. ``gateway/replicas.py`` keeps their health and models."""

    def __init__(self, settings: Settings, replicas: ReplicaSet) -> None:
        self.replicas = replicas
        self.attempts = max(1, settings.upstream_attempts)
        self.initial_wait, self.max_wait = settings.retry_initial_wait, settings.retry_max_wait
        self.api_key = b"Bearer " + settings.upstream_api_key.encode() if settings.upstream_api_key else None
        self.first = settings.upstream_timeout or None
        self.between = settings.upstream_read_timeout or None
        self.pool = Pool(settings.max_connections, settings.upstream_connect_timeout)
        # The health checks' own few connections: a pool full of long streams must not make a
        # replica look down.
        self.checks = Pool(16, settings.upstream_connect_timeout)

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
        self, method: str, path: str, *, content: bytes | None, headers: list[tuple[bytes, bytes]], key: str | None = None, model: str | None = None
    ) -> tuple[UpstreamResponse, int]:
        """Send with retries; returns the (streaming) response and the attempts it took.

        ``key`` (the trajectory id) and ``model`` choose the replica; each retry goes to the
        next choice, after a backoff, and a replica that cannot be reached is marked down
        until its next health check. After the last attempt a retryable status is returned as
        it is (the caller relays it); a connection error or time-out becomes ``UpstreamFailure``.

        The loop is written out rather than run by tenacity (used for RULER's judge): on the
        hot path tenacity's per-call machinery cost 0.026 ms, 3% of a whole proxied call.
        """
        order = self.replicas.order(key, model)
        if not order:
            raise UpstreamFailure(502, "no upstream replica is known (upstream_discover resolved to none yet)")
        attempt = 0
        while True:
            replica = order[attempt % len(order)]
            if not replica.healthy:  # found down during this call: the next choice that is not
                replica = next((r for r in order if r.healthy), replica)
            attempt += 1
            try:
                response = await self.request(method, replica.url, path, content, headers)
            except CONNECTION_ERRORS as exc:
                replica.healthy = False  # until gateway/replicas.py sees it answer again
                if attempt >= self.attempts:
                    raise UpstreamFailure.from_error(exc, "could not reach the upstream", attempt) from exc
            except httpx.HTTPError as exc:  # a time-out or a failure mid-request: not retried (the upstream may have it)
                raise UpstreamFailure.from_error(exc, "could not reach the upstream", attempt) from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= self.attempts:
                    return response, attempt
                await response.aclose()
            # Exponential backoff with jitter, as tenacity's wait_exponential_jitter.
            await asyncio.sleep(min(self.initial_wait * 2 ** (attempt - 1), self.max_wait) + random.uniform(0, self.initial_wait))

    async def request(
        self, method: str, base: str, path: str, content: bytes | None, headers: list[tuple[bytes, bytes]], timeout: float | None = None
    ) -> UpstreamResponse:
        """One request to ``base`` + ``path``, no retry; every failure an ``httpx`` error.
        ``timeout``: for the head and for each read of a small exchange (a health check, on
        its own pool), in place of the upstream's time-outs."""
        pool, first, between = (self.checks, timeout, timeout) if timeout else (self.pool, self.first, self.between)
        return await pool.request(method.encode(), base, path.encode("latin-1"), headers, content, first, between)


class UpstreamFailure(Exception):
    """No usable answer from the upstream: what the client gets (502 or 504) and why."""

    def __init__(self, status: int, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.attempts = attempts

    @classmethod
    def from_error(cls, exc: httpx.HTTPError, what: str, attempts: int = 1) -> UpstreamFailure:
        # 504 only for an upstream that connected, then went silent (or kept every connection
        # busy past that time); a failure to connect is a 502.
        if isinstance(exc, httpx.ReadTimeout | httpx.PoolTimeout):
            return cls(504, "the upstream did not answer in time", attempts)
        return cls(502, f"{what}: {exc or type(exc).__name__}", attempts)


def response_headers(response: UpstreamResponse) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in _DROP_RESPONSE}  # names in lower case
