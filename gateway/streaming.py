"""The responses the proxy answers with: a plain answer relayed whole, and the streaming
response both the proxy and the translated surfaces relay through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from litestar.datastructures import MutableScopeHeaders
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Send


def _relayed(response: ASGIResponse, status_code: int, headers: Mapping[str, str], length: int | None) -> None:
    """Set what Litestar's ``__init__`` would, for headers given as they go out (names in lower
    case). Litestar's own works out a content type, a length and cookies and checks the status
    against the body through its header multidict: ~0.04 ms a call, 5% of a lone proxied call."""
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if "content-type" not in headers:
        raw.append((b"content-type", b"application/json"))
    if length is not None:
        raw.append((b"content-length", b"%d" % length))
    response.headers = MutableScopeHeaders({"headers": raw})
    response.status_code = status_code
    response.content_length = length or 0
    response.background = None
    response.is_head_response = False
    response.encoding = "utf-8"
    response._encoded_cookies = ()


class Relayed(ASGIResponse):
    """An upstream's plain answer, sent as it came with the headers given."""

    __slots__ = ()

    def __init__(self, body: bytes, status_code: int, headers: Mapping[str, str]) -> None:
        _relayed(self, status_code, headers, len(body))
        self.body = body


class RelayResponse(ASGIStreamingResponse):
    """Litestar's streaming response, with its body sent on asyncio directly, and its headers
    as given (``_relayed``).

    Litestar sends the body in an anyio task group: one task streams, another waits for the
    client to disconnect and then cancels the group. That machinery cost ~0.17 ms per stream
    on the benchmark VM, against ~0.01 ms for the sends themselves, and it is paid before the
    first chunk goes out. Here the stream runs in the handler's own task, and one small task
    waits for the disconnect and cancels it.

    Either way the iterator is always closed: when the client goes away while the generator
    sits at a ``yield``, closing it runs its ``finally`` at once, so the call is recorded as
    disconnected and the upstream released.
    """

    def __init__(self, *, iterator: AsyncIterator[bytes], status_code: int, headers: Mapping[str, str]) -> None:
        _relayed(self, status_code, headers, None)
        self.body = b""
        self.iterator = iterator

    async def send_body(self, send: Send, receive: Receive) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None
        gone = sent = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not sent:  # ASGI servers also answer http.disconnect once the response is complete
                gone = True
                streaming.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self._stream(send)
            sent = True
        except asyncio.CancelledError:
            if not gone:
                raise  # cancelled from outside (a server shutting down): not ours to swallow
            streaming.uncancel()
        finally:
            watcher.cancel()
            await self.iterator.aclose()  # type: ignore[union-attr]
