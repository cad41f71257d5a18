"""The upstream: one pooled aiohttp session to the replicas, and the retry rule.

aiohttp directly, not httpx: measured on this path (``bench/profile_gateway.py`` and a
loop of calls to the benchmark's upstream), httpx's client over the aiohttp transport
cost 0.43 ms of CPU per call against aiohttp's own 0.16 ms, a third of the whole
gateway's. (httpcore's pure-Python HTTP/1.1 before it cost ~0.7 ms.) httpx stays
everywhere off the hot path (RULER's judge, the trainer, the SDK); its exception classes
remain this module's vocabulary for failures, so callers handle one kind.

A request is retried (exponential backoff with jitter) on connection errors and on
429/502/503/504, and only here, before the gateway has sent the client anything; each
retry goes to the call's next replica. Once the first byte is on its way to the client,
a failure is reported, never retried.

Time-outs (``core/settings.py``): connecting (``upstream_connect_timeout``), the wait for
the answer to begin (``upstream_timeout``: its headers, and a stream's first event), and
silence between reads once it has begun (``upstream_read_timeout``). aiohttp measures the
first wait on the socket (its ``sock_read``), and ``Upstream.request`` bounds the whole
wait for the headers too, for an upstream that stops reading the request; ``_Body``
times each read of the body. Every failure is an ``httpx`` error: an answer that is not
HTTP (garbage for a status line, broken headers or chunked framing) is
``RemoteProtocolError``, a connection error like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Iterable, Iterator

import aiohttp
import httpx
from aiohttp.http_exceptions import HttpProcessingError
from httpx_aiohttp.transport import map_aiohttp_exceptions

from burnish_server.core.replicas import ReplicaSet
from burnish_server.core.settings import Settings
from burnish_server.gateway.keys import KEY_HEADERS

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# The request never reached the upstream, or the connection died before any answer.
CONNECTION_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# Not forwarded upstream: the gateway's own headers, and what aiohttp sets itself.
_DROP_REQUEST = _HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding", b"expect"} | {h.encode() for h in KEY_HEADERS}
_CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
# Not relayed to the client: the ASGI server sets framing and its own date and server.
_DROP_RESPONSE = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date", "server", "te", "trailer", "upgrade"}
)


class Upstream:
    """The replicas (one, or several: ``core/replicas.py`` orders them for each call) and one
    pooled aiohttp session to all of them. ``gateway/replicas.py`` keeps their health and models."""

    def __init__(self, settings: Settings, replicas: ReplicaSet) -> None:
        self.replicas = replicas
        self.attempts = max(1, settings.upstream_attempts)
        self.initial_wait, self.max_wait = settings.retry_initial_wait, settings.retry_max_wait
        self.api_key = "Bearer " + settings.upstream_api_key if settings.upstream_api_key else None
        self.max_connections = settings.max_connections
        # Time-outs (the module's docstring): the wait for the headers as a whole, then aiohttp's
        # own clock on the socket, and _Body's on each read of the body.
        self.timeout = aiohttp.ClientTimeout(sock_connect=settings.upstream_connect_timeout, sock_read=settings.upstream_timeout or None)
        self.head_timeout = settings.upstream_connect_timeout + settings.upstream_timeout if settings.upstream_timeout else None
        self.first = settings.upstream_timeout or None
        self.between = settings.upstream_read_timeout or None
        self._session: aiohttp.ClientSession | None = None
        self._checks: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Made on first use, inside the running loop (aiohttp's requirement)."""
        if self._session is None:
            self._session = _session(self.max_connections)
        return self._session

    @property
    def checks(self) -> aiohttp.ClientSession:
        """The health checks' own few connections: a pool full of long streams must not make
        a replica look down."""
        if self._checks is None:
            self._checks = _session(16)
        return self._checks

    async def aclose(self) -> None:
        for session in (self._session, self._checks):
            if session is not None:
                await session.close()

    def request_headers(self, raw: Iterable[tuple[bytes, bytes]], *, ours: bool = False) -> list[tuple[str, str]]:
        """The client's headers as sent upstream. ``ours``: the client's credential is a burnish
        key (or the admin token), which must never reach the upstream."""
        drop = _DROP_REQUEST | _CREDENTIALS if ours else _DROP_REQUEST
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw if k.lower() not in drop]
        # Identity: the gateway reads what it forwards, and loopback bandwidth is free.
        headers.append(("accept-encoding", "identity"))
        if self.api_key is not None:
            headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
            headers.append(("authorization", self.api_key))
        return headers

    async def send(
        self, method: str, path: str, *, content: bytes | None, headers: list[tuple[str, str]], key: str | None = None, model: str | None = None
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
                response = await self.request(method, replica.url + path, content, headers)
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
        self, method: str, url: str, content: bytes | None, headers: list[tuple[str, str]] | dict[str, str], timeout: float | None = None
    ) -> UpstreamResponse:
        """One request, no retry; every failure an ``httpx`` error. ``timeout``: for the whole
        of a small exchange (a health check), in place of the upstream's time-outs."""
        try:
            async with asyncio.timeout(timeout or self.head_timeout):
                response = await (self.checks if timeout else self.session).request(
                    method,
                    url,
                    data=content or None,
                    headers=headers,
                    allow_redirects=False,
                    auto_decompress=False,
                    compress=False,
                    timeout=aiohttp.ClientTimeout(total=timeout) if timeout else self.timeout,
                )
        except Exception as exc:
            if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError):  # ours, not aiohttp's own
                raise httpx.ReadTimeout(f"no answer from the upstream within {timeout or self.head_timeout:g} s") from exc
            with _httpx_errors():
                raise
        if response.connection is not None and response.connection.protocol is not None:
            # The body's reads keep their own time (_Body): aiohttp stops re-arming its clock on each read.
            response.connection.protocol.read_timeout = None
        return UpstreamResponse(response, timeout or self.first, timeout or self.between)


def _session(limit: int) -> aiohttp.ClientSession:
    # No cookies kept between calls of different clients; no proxy from the environment.
    connector = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, skip_auto_headers=("Content-Type",))


class UpstreamResponse:
    """An upstream's answer: its status and headers, and its body read whole or chunk by chunk,
    every failure an ``httpx`` error (``_Body``). Closed once read, or by ``aclose``."""

    __slots__ = ("status_code", "headers", "_body")

    def __init__(self, response: aiohttp.ClientResponse, first: float | None, between: float | None) -> None:
        self.status_code = response.status
        self.headers = response.headers  # case-insensitive
        self._body = _Body(response, first, between)

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self._body])

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return self._body.__aiter__()

    async def aclose(self) -> None:
        await self._body.aclose()


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
    """aiohttp's errors as httpx's: httpx-aiohttp's own mapping, then what it lets through.
    Entered only once a failure is raised (``except Exception: with _httpx_errors(): raise``):
    two context managers around every read cost ~0.02 ms a call."""
    try:
        with map_aiohttp_exceptions():
            yield
    except (aiohttp.ClientError, HttpProcessingError) as exc:  # e.g. ClientResponseError: garbage for a status line
        raise httpx.RemoteProtocolError(f"the upstream's answer is not valid HTTP: {_words(exc)}") from exc


def _words(exc: BaseException) -> str:
    """An aiohttp error on one line, without the URL (the upstream's address is not the client's business)."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


class _Body:
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
        try:
            async with asyncio.timeout(None) as deadline:
                while True:
                    # What has arrived is taken at once; only a wait arms the clock (a small answer
                    # is whole with its headers: arming and disarming cost ~0.03 ms a call).
                    chunk = content.read_nowait(self.CHUNK_SIZE)
                    if not chunk and not content.at_eof():
                        deadline.reschedule(loop.time() + wait if wait else None)
                        chunk = await content.read(self.CHUNK_SIZE)
                        deadline.reschedule(None)  # the time the caller holds a chunk is not the upstream's
                    if not chunk:
                        return
                    yield chunk
                    wait = self.between
        except Exception as exc:
            if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError):  # ours, not aiohttp's own (sock_read)
                raise self._silent(wait) from exc
            with _httpx_errors():
                raise

    def _silent(self, waited: float | None) -> httpx.HTTPError:
        # aiohttp's C parser, on broken chunked framing, fails the connection but leaves the
        # body's reader waiting: the error is on the connection's protocol.
        protocol = self.response.connection.protocol if self.response.connection is not None else None
        if protocol is not None and (error := protocol.exception()) is not None and not isinstance(error, TimeoutError):
            return httpx.RemoteProtocolError(f"the upstream's answer is not valid HTTP: {_words(error)}")
        return httpx.ReadTimeout(f"the upstream sent nothing for {waited:g} s")

    async def aclose(self) -> None:
        try:
            self.response.release()
            await self.response.wait_for_close()
        except Exception:
            with _httpx_errors():
                raise


def response_headers(response: UpstreamResponse) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE}
