"""A client gone is a call stopped: while the gateway waits on the upstream, a client that
disconnects cancels the wait, so the upstream's connection closes and vLLM aborts the request.

Without this a plain call whose client left went on to the end: on the CPU every token vLLM
sampled for no one delayed the next agent's calls. A stream's relay watches for the same
thing while it sends (``streaming.py``); this covers the time before an answer begins, and
the whole of a plain one::

    with Departure(receive):
        response = await call.send(...)     # a disconnect here raises ClientGone
        raw = await call.read(response)

ASGI servers deliver ``http.disconnect`` to ``receive`` once the request's body has been read
and the client closes its connection; a small task waits for it and cancels the call's task.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from litestar.types import Receive


class ClientGone(Exception):
    """The client disconnected while the gateway waited on the upstream."""


class Departure:
    """Within ``with``: the current task cancelled when the client disconnects, and
    ``ClientGone`` raised in its place. A cancellation from elsewhere (a server shutting down)
    passes through as it is."""

    __slots__ = ("receive", "task", "watcher", "gone")

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.gone = False

    def __enter__(self) -> Departure:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.watcher = asyncio.ensure_future(self._watch())
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        # The watcher only runs while this task waits inside the block, so a disconnect can only
        # cancel an await inside it: once the block is left, nothing more is cancelled.
        self.watcher.cancel()
        if self.gone and kind is not None and issubclass(kind, asyncio.CancelledError):
            self.task.uncancel()
            raise ClientGone("the client disconnected before the answer") from None

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.task.cancel()
