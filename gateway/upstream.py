"""The upstream: one pooled ``httpx.AsyncClient`` and the retry rule.

The client's transport is aiohttp's (``httpx-aiohttp``), not httpcore: measured in
``bench/profile_gateway.py``, httpcore's pure-Python HTTP/1.1 and its pool, which
scans every pooled connection on each request, took ~0.7 ms of CPU per call alone
and twice that at 64 concurrent calls, which is most of the gateway's budget.

A request is retried (tenacity, exponential backoff with jitter) on connection
errors and on 429/502/503/504, and only here, before the gateway has sent the
client anything. Once the first byte is on its way to the client, a failure is
reported, never retried.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx
from httpx_aiohttp import AiohttpTransport
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    wait_exponential_jitter,
)

from burnish_server.core.settings import Settings
from burnish_server.gateway.keys import KEY_HEADERS

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# The request never reached the upstream, or the connection died before any answer.
CONNECTION_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# Not forwarded upstream: the gateway's own headers, and what httpx sets itself.
_DROP_REQUEST = _HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding", b"expect"} | {h.encode() for h in KEY_HEADERS}
# Not relayed to the client: the ASGI server sets framing and its own date and server.
_DROP_RESPONSE = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date", "server", "te", "trailer", "upgrade"}
)


def base_url(upstream: str) -> str:
    """Accept both ``http://host:8000`` and the ``.../v1`` people paste from client configs."""
    url = upstream.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class Upstream:
    def __init__(self, settings: Settings) -> None:
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
            base_url=base_url(settings.upstream),
            timeout=httpx.Timeout(settings.upstream_timeout, connect=settings.connect_timeout),
            transport=AiohttpTransport(limits=limits, trust_env=False),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    def request_headers(self, raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in raw if k.lower() not in _DROP_REQUEST]
        # Identity: the gateway reads what it forwards, and loopback bandwidth is free.
        headers.append((b"accept-encoding", b"identity"))
        if self.api_key is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            headers.append((b"authorization", b"Bearer " + self.api_key))
        return headers

    async def send(self, method: str, path: str, *, content: bytes | None, headers: list[tuple[bytes, bytes]]) -> tuple[httpx.Response, int]:
        """Send with retries; returns the (streaming) response and the attempts it took.

        After the last attempt a retryable status is returned as it is (the caller
        relays it); a connection error or time-out becomes ``UpstreamFailure``.
        """
        request = self.client.build_request(method, path, content=content, headers=headers)
        retrying = self.retrying.copy()  # per call: tenacity keeps the attempt count on the object
        try:
            response: httpx.Response = await retrying(self.client.send, request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamFailure.from_error(exc, "could not reach the upstream", retrying.statistics.get("attempt_number", 1)) from exc
        return response, retrying.statistics.get("attempt_number", 1)


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


def _last_outcome(state: RetryCallState) -> httpx.Response:
    assert state.outcome is not None  # tenacity calls this only after an attempt
    return state.outcome.result()


async def _discard_response(state: RetryCallState) -> None:
    if state.outcome is not None and not state.outcome.failed:
        await state.outcome.result().aclose()


def response_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE}
