"""The responses the proxy answers with: a plain answer relayed whole, and a stream relayed
event by event (``Relay``, through the call's ``Translation``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import anyio
from litestar.types import Receive, Scope, Send

from burnish_server.core.platform.errors import NotRecorded, UpstreamError
from burnish_server.core.protocols.records import CLIENT_DISCONNECTED, UPSTREAM_CUT
from burnish_server.gateway.proxy.call import Call
from burnish_server.gateway.proxy.translation import Translation
from burnish_server.gateway.upstream.client import UpstreamResponse


class Relay:
    """An upstream's stream relayed to the client (``events``) and recorded whatever way it
    ends, through the call's ``Translation`` (as it came, or translated). ``finish`` records
    what arrived if nothing was recorded yet (the client left), and lets the upstream's answer
    go. ``RelayResponse`` calls it once the response is over, so it runs even for a stream that
    never began (``aclose`` on an async generator that never started does not run its
    ``finally``)."""

    def __init__(self, call: Call, response: UpstreamResponse, translation: Translation) -> None:
        self.call = call
        self.response = response
        self.translation = translation
        self.recorded = False
        translation.start()

    async def events(self) -> AsyncIterator[bytes]:
        """Each chunk's events as they arrive; once the upstream is done, the record committed,
        then the stream's last event (held back until the record is durable)."""
        translation = self.translation
        assert translation.capture is not None
        try:
            async for chunk in self.response.aiter_bytes():
                if out := translation.feed(chunk):
                    yield out
            status, error = translation.capture.outcome()
        except UpstreamError as exc:
            status, error = UPSTREAM_CUT, f"the upstream stream failed: {self.call.svc.redact.text(exc.message)}"
        before, last = translation.end(status, error)
        if before:
            yield before
        self.recorded = True
        try:
            await self.call.commit(translation.record(status, error))
        except NotRecorded as exc:
            yield self.call.surface.error_event(exc.message)
            return
        if last:
            yield last

    async def finish(self) -> None:
        if not self.recorded and self.call.svc.settings.record:
            # The client went away: record what arrived, without waiting on the commit.
            record = self.translation.record(CLIENT_DISCONNECTED, "the client disconnected before the end")
            self.call.svc.writer.submit(record).add_done_callback(unheard)
            self.call.observe(record, status=499)  # nginx's "client closed request"
        with anyio.CancelScope(shield=True):
            await self.response.aclose()


def unheard(future: asyncio.Future[object]) -> None:
    """A record no one waits for: its failure (the store away) is the writer's to log, not asyncio's."""
    if not future.cancelled():
        future.exception()


def _raw_headers(headers: Mapping[str, str], length: int | None) -> list[tuple[bytes, bytes]]:
    """Headers as they go out (names in lower case), with a content type and, for a whole
    body, its length."""
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if "content-type" not in headers:
        raw.append((b"content-type", b"application/json"))
    if length is not None:
        raw.append((b"content-length", b"%d" % length))
    return raw


class Relayed:
    """An upstream's plain answer, sent as it came with the headers given: an ASGI app, which a
    Litestar handler may return as it is. Litestar's ``Response`` works out a content type, a
    length and cookies and checks the status against the body through its header multidict:
    ~0.04 ms a call, 5% of a lone proxied call, for nothing the proxy needs."""

    __slots__ = ("body", "status_code", "headers")

    def __init__(self, body: bytes, status_code: int, headers: Mapping[str, str]) -> None:
        self.body = body
        self.status_code = status_code
        self.headers = _raw_headers(headers, len(body))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


class RelayResponse:
    """A stream relayed event by event: an ASGI app, which a Litestar handler may return as it is.

    Litestar's streaming response sends the body in an anyio task group: one task streams,
    another waits for the client to disconnect and then cancels the group. That machinery cost
    ~0.17 ms per stream on the benchmark VM, against ~0.01 ms for the sends themselves, and it
    is paid before the first chunk goes out. Here the stream runs in the caller's own task,
    and one small task waits for the disconnect and cancels it.

    Either way the iterator is closed, and then the relay finished (``Relay.finish``): when the
    client goes away, the call is recorded as disconnected and the upstream released.
    """

    __slots__ = ("relay", "status_code", "headers", "iterator")

    def __init__(self, relay: Relay, status_code: int, headers: Mapping[str, str]) -> None:
        self.relay = relay
        self.status_code = status_code
        self.headers = _raw_headers(headers, None)
        self.iterator = relay.events()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
            await self._body(send, receive)
        finally:
            await self.relay.finish()

    async def _body(self, send: Send, receive: Receive) -> None:
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
            async for chunk in self.iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            sent = True
        except asyncio.CancelledError:
            if not gone:
                raise  # cancelled from outside (a server shutting down): not ours to swallow
            streaming.uncancel()
        finally:
            watcher.cancel()
            await self.iterator.aclose()  # type: ignore[attr-defined]
