"""The upstream: one pooled ``httpx.AsyncClient`` and the retry rule.

The client's transport is aiohttp's (``httpx-aiohttp``), not httpcore: measured in
``bench/profile_gateway.py``, httpcore's pure-Python HTTP/1.1 and its pool, which
scans every pooled connection on each request, took ~0.7 ms of CPU per call alone
and twice that at 64 concurrent calls, which is most of the gateway's budget.

A request is retried (tenacity, exponential backoff with jitter) on connection
errors and on 429/502/503/504, and only here, before the gateway has sent the
client anything. Once the first byte is on its way to the client, a failure is
reported, never retried.

Time-outs (``core/settings.py``): connecting (``upstream_connect_timeout``), the wait for
the answer to begin (``upstream_timeout``: its headers, and a stream's first event), and
silence between reads once it has begun (``upstream_read_timeout``). aiohttp measures the
last two on the socket (its ``sock_read``); ``_Transport`` switches from one to the other
when the headers are in, and bounds the whole wait for them too, for an upstream that
stops reading the request. Every failure of the transport is an ``httpx`` error: an
answer that is not HTTP (garbage for a status line, broken headers or chunked framing)
is ``RemoteProtocolError``, a connection error like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import aiohttp
import httpx
from aiohttp.http_exceptions import HttpProcessingError
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    wait_exponential_jitter,
)

from burnish_server.core.replicas import ReplicaSet
from burnish_server.core.settings import Settings
from burnish_server.gateway.keys import KEY_HEADERS

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# The request never reached the upstream, or the connection died before any answer.
CONNECTION_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# Not forwarded upstream: the gateway's own headers, and what httpx sets itself.
_DROP_REQUEST = _HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding", b"expect"} | {h.encode() for h in KEY_HEADERS}
_CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
# Not relayed to the client: the ASGI server sets framing and its own date and server.
_DROP_RESPONSE = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date", "server", "te", "trailer", "upgrade"}
)


class Upstream:
    """The replicas (one, or several: ``core/replicas.py`` orders them for each call) and one
    pooled client to all of them. ``gateway/replicas.py`` keeps their health and models."""

    def __init__(self, settings: Settings, replicas: ReplicaSet) -> None:
        self.replicas = replicas
        self.retrying = AsyncRetrying(
            stop=stop_after_attempt(max(1, settings.upstream_attempts)),
            wait=wait_exponential_jitter(multiplier=settings.retry_initial_wait, max=settings.retry_max_wait, jitter=settings.retry_initial_wait),
            retry=retry_if_exception_type(CONNECTION_ERRORS) | retry_if_result(lambda r: r.status_code in RETRY_STATUSES),
            before_sleep=_discard_response,
            # Out of attempts: hand back the last response (the caller relays it), or raise the last error.
            retry_error_callback=_last_outcome,
        )
        self.api_key = settings.upstream_api_key.encode() if settings.upstream_api_key else None
        limits = httpx.Limits(max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.upstream_timeout, connect=settings.upstream_connect_timeout),
            transport=_Transport(settings, limits=limits, trust_env=False),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    def request_headers(self, raw: Iterable[tuple[bytes, bytes]], *, ours: bool = False) -> list[tuple[bytes, bytes]]:
        """The client's headers as sent upstream. ``ours``: the client's credential is a burnish
        key (or the admin token), which must never reach the upstream."""
        drop = _DROP_REQUEST | _CREDENTIALS if ours else _DROP_REQUEST
        headers = [(k, v) for k, v in raw if k.lower() not in drop]
        # Identity: the gateway reads what it forwards, and loopback bandwidth is free.
        headers.append((b"accept-encoding", b"identity"))
        if self.api_key is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            headers.append((b"authorization", b"Bearer " + self.api_key))
        return headers

    async def send(
        self, method: str, path: str, *, content: bytes | None, headers: list[tuple[bytes, bytes]], key: str | None = None, model: str | None = None
    ) -> tuple[httpx.Response, int]:
        """Send with retries; returns the (streaming) response and the attempts it took.

        ``key`` (the trajectory id) and ``model`` choose the replica; each retry goes to the
        next choice, and a replica that cannot be reached is marked down until its next
        health check. After the last attempt a retryable status is returned as it is (the
        caller relays it); a connection error or time-out becomes ``UpstreamFailure``.
        """
        order = self.replicas.order(key, model)
        if not order:
            raise UpstreamFailure(502, "no upstream replica is known (upstream_discover resolved to none yet)")
        tried = 0

        async def attempt() -> httpx.Response:
            nonlocal tried
            replica = order[tried % len(order)]
            tried += 1
            request = self.client.build_request(method, replica.url + path, content=content, headers=headers)
            try:
                return await self.client.send(request, stream=True)
            except CONNECTION_ERRORS:
                replica.healthy = False  # until gateway/replicas.py sees it answer again
                raise

        try:
            response: httpx.Response = await self.retrying.copy()(attempt)  # a copy per call: tenacity keeps its count on the object
        except httpx.HTTPError as exc:
            raise UpstreamFailure.from_error(exc, "could not reach the upstream", tried) from exc
        return response, tried


class UpstreamFailure(Exception):
    """No usable answer from the upstream: what the client gets (502 or 504) and why."""

    def __init__(self, status: int, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.attempts = attempts

    @classmethod
    def from_error(cls, exc: httpx.HTTPError, what: str, attempts: int = 1) -> UpstreamFailure:
        # 504 only for an upstream that connected, then went silent. (The aiohttp transport
        # reports a refused connection as ConnectTimeout: a 502, like any failure to connect.)
        if isinstance(exc, httpx.ReadTimeout):
            return cls(504, "the upstream did not answer in time", attempts)
        return cls(502, f"{what}: {exc or type(exc).__name__}", attempts)


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    """aiohttp's errors as httpx's: httpx-aiohttp's own mapping, then what it lets through."""
    try:
        with map_aiohttp_exceptions():
            yield
    except (aiohttp.ClientError, HttpProcessingError) as exc:  # e.g. ClientResponseError: garbage for a status line
        raise httpx.RemoteProtocolError(f"the upstream's answer is not valid HTTP: {_words(exc)}") from exc


def _words(exc: BaseException) -> str:
    """An aiohttp error on one line, without the URL (the upstream's address is not the client's business)."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


class _Body(httpx.AsyncByteStream):
    """An aiohttp response's body: its errors as httpx's, each read bounded in time (the first
    by the time-out for the answer to begin, the others by the read time-out)."""

    CHUNK_SIZE = 16 * 1024

    def __init__(self, response: aiohttp.ClientResponse, first: float | None, between: float | None) -> None:
        self.response = response
        self.first = first
        self.between = between

    async def __aiter__(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        content = self.response.content
        wait = self.first
        with _httpx_errors():
            try:
                async with asyncio.timeout(None) as deadline:
                    while True:
                        deadline.reschedule(loop.time() + wait if wait else None)
                        chunk = await content.read(self.CHUNK_SIZE)
                        deadline.reschedule(None)  # the time the caller holds a chunk is not the upstream's
                        if not chunk:
                            return
                        yield chunk
                        wait = self.between
            except TimeoutError as exc:
                if isinstance(exc, aiohttp.ClientError):  # aiohttp's own (sock_read): mapped as it is
                    raise
                raise self._silent(wait) from exc

    def _silent(self, waited: float | None) -> httpx.HTTPError:
        # aiohttp's C parser, on broken chunked framing, fails the connection but leaves the
        # body's reader waiting: the error is on the connection's protocol.
        protocol = self.response.connection.protocol if self.response.connection is not None else None
        if protocol is not None and (error := protocol.exception()) is not None and not isinstance(error, TimeoutError):
            return httpx.RemoteProtocolError(f"the upstream's answer is not valid HTTP: {_words(error)}")
        return httpx.ReadTimeout(f"the upstream sent nothing for {waited:g} s")

    async def aclose(self) -> None:
        with _httpx_errors():
            self.response.release()
            await self.response.wait_for_close()


class _Transport(AiohttpTransport):
    """httpx-aiohttp's transport, with the upstream's time-outs and every error as httpx's."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first = settings.upstream_timeout or None
        self.between = settings.upstream_read_timeout or None
        # The whole wait for the answer's headers (a connection from the pool, connecting, sending
        # the request): aiohttp's own clock (sock_read) starts only once the request is sent.
        self.head_timeout = settings.upstream_connect_timeout + settings.upstream_timeout if settings.upstream_timeout else None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        timeout = request.extensions.get("timeout", {})
        with _httpx_errors():
            try:
                async with asyncio.timeout(self.head_timeout):
                    response = await self.client.request(
                        request.method,
                        str(request.url),
                        headers=request.headers,
                        data=request.content or None,
                        allow_redirects=False,
                        auto_decompress=False,
                        compress=False,
                        timeout=aiohttp.ClientTimeout(sock_connect=timeout.get("connect"), sock_read=timeout.get("read")),
                        server_hostname=request.extensions.get("sni_hostname"),
                    )
            except TimeoutError as exc:
                if isinstance(exc, aiohttp.ClientError):  # aiohttp's own time-outs: mapped as they are
                    raise
                raise httpx.ReadTimeout(f"no answer from the upstream within {self.head_timeout:g} s") from exc
        if response.connection is not None and response.connection.protocol is not None:
            # The body's reads keep their own time (_Body): aiohttp stops re-arming its clock on each read.
            response.connection.protocol.read_timeout = None
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response, self.first, self.between),
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode()},
        )


def _last_outcome(state: RetryCallState) -> httpx.Response:
    assert state.outcome is not None  # tenacity calls this only after an attempt
    return state.outcome.result()


async def _discard_response(state: RetryCallState) -> None:
    if state.outcome is not None and not state.outcome.failed:
        await state.outcome.result().aclose()


def response_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE}
