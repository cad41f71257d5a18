"""The streaming response both the proxy and the translated surfaces relay through."""

from __future__ import annotations

from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Send


class RelayResponse(ASGIStreamingResponse):
    """Litestar's streaming response, plus: the iterator is always closed.

    When the client disconnects, Litestar cancels the send loop, possibly while
    the generator sits at a ``yield``; closing it here runs its ``finally`` at
    once, so the call is recorded as disconnected and the upstream released.
    """

    async def send_body(self, send: Send, receive: Receive) -> None:
        try:
            await super().send_body(send, receive)
        finally:
            await self.iterator.aclose()  # type: ignore[union-attr]
