"""What the upstream's two connection pools have in common: how they are asked, and what they answer.

``http1.py``'s ``Pool`` (the proxy's own HTTP/1.1 client, the fast path) and ``httpx_pool.py``'s
``HttpxPool`` (for an upstream reached through the environment's proxy) both fit ``Connections``,
and both answer with an ``UpstreamResponse``; ``gateway/upstream/client.py`` picks one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class UpstreamResponse(Protocol):
    """An answer as either client gives it: status, headers (names in lower case), the body
    read whole or as it arrives; ``aclose`` lets the connection go."""

    status_code: int
    headers: dict[str, str]

    async def aread(self) -> bytes: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Connections(Protocol):
    """A pool of connections to the replicas: http1's ``Pool``, or ``HttpxPool``."""

    async def request(
        self, method: bytes, base: str, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes | None, first: float | None, between: float | None
    ) -> UpstreamResponse: ...

    def stats(self) -> dict[str, int]: ...

    async def aclose(self) -> None: ...
