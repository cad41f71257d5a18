"""A request id on every request: the client's ``X-Request-Id`` if it is a sane one, else a
new one. It goes back in the response's ``X-Request-Id`` and into every log line written
while the request is handled (``core/logs.py``)."""

from __future__ import annotations

import itertools
import os
import re

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from burnish_server.core.logs import request_id

HEADER = b"x-request-id"
_VALID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Raw ASGI (a Litestar middleware factory): one header read, one header added.

    A new id is this process's random prefix and a counter: unique without a call for random
    bytes per request (``os.urandom`` cost ~0.01 ms a call here); an id names a request in
    the logs, it is no secret."""
    prefix = b"req-" + os.urandom(6).hex().encode() + b"-"
    numbers = itertools.count(1)

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        given = None
        for name, value in scope["headers"]:
            if name == HEADER:
                given = value
                break
        rid = given if given is not None and _VALID.fullmatch(given) else prefix + b"%x" % next(numbers)
        token = request_id.set(rid.decode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (HEADER, rid)]
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)

    return middleware
