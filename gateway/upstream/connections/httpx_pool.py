"""The upstream's connections through httpx, for an upstream the environment routes through a proxy.

``http1.py`` does not speak to proxies (``HTTP_PROXY``/``HTTPS_PROXY``); httpx does. Slower, and
only for deployments that need it (``gateway/upstream/client.py`` chooses). Its errors become
burnish's upstream errors, as http1's do.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import httpx

from burnish_server.core.platform.errors import (
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPoolTimeout,
    UpstreamProtocolError,
    UpstreamReadError,
    UpstreamTimeout,
)
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.upstream.connections.base import UpstreamResponse


def _as_upstream_error(exc: httpx.HTTPError, received: bool) -> UpstreamError:
    why = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.PoolTimeout):
        return UpstreamPoolTimeout(f"every connection to the upstream stayed busy: {why}")
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError | httpx.ProxyError):
        return UpstreamConnectError(why)
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(why)
    if not received and (isinstance(exc, httpx.ReadError) or "disconnected without" in why):  # h11's words for a close before the answer
        return UpstreamClosed(why)
    if isinstance(exc, httpx.RemoteProtocolError) and not received:
        return UpstreamProtocolError(why)
    return UpstreamReadError(why)


class _HttpxResponse:
    __slots__ = ("_response", "status_code", "headers")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.headers: dict[str, str] = {}
        for k, v in response.headers.raw:  # as they came, as http1 gives them: latin-1, joined
            key, value = k.decode("latin-1").lower(), v.decode("latin-1")
            self.headers[key] = f"{self.headers[key]}, {value}" if key in self.headers else value

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise _as_upstream_error(exc, received=True) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxPool:
    """http1's ``Pool`` interface over httpx, which honours the environment's proxies."""

    def __init__(self, settings: Settings, limit: int, tls: ssl.SSLContext | None) -> None:
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit, keepalive_expiry=settings.upstream_idle_expiry),
            verify=tls if tls is not None else True,
            trust_env=True,
        )
        self.connect_timeout = settings.upstream_connect_timeout or None

    async def request(
        self, method: bytes, base: str, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes | None, first: float | None, between: float | None
    ) -> UpstreamResponse:
        url = base.rstrip("/") + path.decode("latin-1")
        # httpx has one read time-out: the answer's (upstream_timeout) bounds every read here.
        timeout = httpx.Timeout(connect=self.connect_timeout, read=first, write=first, pool=first)
        request = self.client.build_request(method.decode(), url, headers=headers, content=body, timeout=timeout)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _as_upstream_error(exc, received=False) from exc
        return _HttpxResponse(response)

    def stats(self) -> dict[str, int]:
        return {"in_use": 0, "idle": 0, "origins": 0}  # httpx does not say

    async def aclose(self) -> None:
        await self.client.aclose()
