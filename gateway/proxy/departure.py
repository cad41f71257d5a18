"""A client gone is a call stopped: while the gateway waits on the upstream, a client that
disconnects cancels the wait, so the upstream's connection closes and vLLM aborts the request.

Without this a plain call whose client left went on to the end: on the CPU every token vLLM
sampled for no one delayed the next agent's calls. A stream's relay watches for the same
thing while it sends (``streaming.py``); this covers the time before an answer begins, and
the whole of a plain one::

    with Departure(receive, svc.waiting):
        response = await call.send(...)     # a disconnect here raises ClientGone
        raw = await call.read(response)

ASGI servers deliver ``http.disconnect`` to ``receive`` once the request's body has been read
and the client closes its connection; a small task waits for it and cancels the call's task.
Only a call that has waited a while gets that task: ``Waiting.watch``, one loop for the whole
app, looks at the calls waiting every ``WATCH_EVERY_S`` and starts it for those it saw waiting
at its last look. Most calls are answered sooner, and a task on every call added 11% to a
lone plain call's instructions (a timer on every call, 4%; a set's add and discard, next to
nothing: ``bench/inprocess.py --instructions``). A client that left before its task starts is
found gone at once (``receive`` answers at once), so a call stays upstream at most twice
``WATCH_EVERY_S`` after its client left.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from litestar.types import Receive

from burnish_server.core.platform.errors import Invalid

# How often the calls waiting on the upstream are looked at (see above).
WATCH_EVERY_S = 0.2


class ClientGone(Invalid):
    """The client disconnected while the gateway waited on the upstream (answered to no one: the
    call is recorded ``client_disconnected``, as a body the client left half-sent is refused)."""

    default_code = "client_disconnected"


class Waiting:
    """The calls waiting on the upstream now, each a ``Departure``."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: set[Departure] = set()

    async def watch(self, every_s: float = WATCH_EVERY_S) -> None:
        """Until cancelled: each call seen waiting at the last look gets its watcher."""
        while True:
            await asyncio.sleep(every_s)
            for call in list(self.calls):
                call.look()


class Departure:
    """Within ``with``: the current task cancelled when the client disconnects (once it has
    waited a while: see above), and ``ClientGone`` raised in its place. A cancellation from
    elsewhere (a server shutting down) passes through as it is."""

    __slots__ = ("receive", "waiting", "task", "seen", "watcher", "gone")

    def __init__(self, receive: Receive, waiting: Waiting) -> None:
        self.receive, self.waiting = receive, waiting
        self.seen = self.gone = False
        self.watcher: asyncio.Task[None] | None = None

    def __enter__(self) -> Departure:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.waiting.calls.add(self)
        return self

    def look(self) -> None:
        """``Waiting.watch``'s look: the first marks the call, the next starts its watcher."""
        if self.seen and self.watcher is None:
            self.watcher = asyncio.ensure_future(self._watch())
        self.seen = True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        # Looks and the watcher only run while this task waits inside the block, so a disconnect
        # can only cancel an await inside it: once the block is left, nothing more is.
        self.waiting.calls.discard(self)
        if self.watcher is not None:
            self.watcher.cancel()
        if self.gone:  # our cancellation taken back, whatever it became; another one (a shutdown) stands
            others = self.task.uncancel()
            if others == 0 and kind is not None and issubclass(kind, asyncio.CancelledError):
                raise ClientGone("the client disconnected before the answer") from None

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.task.cancel()
