"""A request id on every request: the client's ``X-Request-Id`` if it is a sane one, else a
new one. It goes back in the response's ``X-Request-Id`` and into every log line written
while the request is handled (``core/platform/logs.py``). The gateway's entry point applies it to
every HTTP request, whichever way it is served (``gateway/edge/entry.py``)."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable

from litestar.types import Message, Send

HEADER = b"x-request-id"
_VALID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


class RequestIds:
    """New ids are this process's random prefix and a counter: unique without a call for
    random bytes per request (``os.urandom`` cost ~0.01 ms a call here); an id names a
    request in the logs, it is no secret."""

    def __init__(self) -> None:
        self.prefix = b"req-" + os.urandom(6).hex().encode() + b"-"
        self.numbers = itertools.count(1)

    def of(self, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The client's id, if it sent a sane one, else a new one."""
        for name, value in headers:
            if name == HEADER:
                if _VALID.fullmatch(value):
                    return value
                break
        return self.prefix + b"%x" % next(self.numbers)


def sending_id(send: Send, rid: bytes) -> Send:
    """``send``, with ``X-Request-Id`` added to the response's head."""

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), (HEADER, rid)]
        await send(message)

    return send_with_id
