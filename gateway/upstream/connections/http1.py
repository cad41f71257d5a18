"""A lean HTTP/1.1 client for the proxy's calls: httptools' parser over an asyncio protocol.

The proxy's upstream is one or a few vLLM servers on a private network, spoken to in plain
HTTP/1.1 with keep-alive. aiohttp, which this replaced on that path, cost ~360k instructions
a request (building its request object, a task to write the body, its stream reader and
timer machinery): more than a quarter of a whole proxied call. This module does only what the
proxy needs, with llhttp (httptools, the parser uvicorn reads requests with) doing the
parsing:

- one ``transport.write`` a request, head and body together;
- the answer's head awaited on one future, armed with one timer;
- its body handed over as it arrives: whatever has come is taken at once, and nothing waits
  for more (a stream's events reach the client when the upstream sent them), with flow
  control past ``HIGH_WATER`` bytes held;
- keep-alive connections reused per origin, the most recently used first, at most
  ``limit`` busy at once and ``per_origin`` to one replica; idle ones closed past their age;
  ``https`` upstreams over the system's TLS context, or one with a CA bundle and a client
  certificate (``gateway/upstream/client.py: tls_context``).

Left out, as the proxy wants none of them: redirects, cookies, content decoding (the gateway
asks for ``identity``), ``Expect: 100-continue``, HTTP/2. Proxies from the environment
(``HTTPS_PROXY``...) are not spoken here: an upstream that must be reached through one is
spoken to with httpx instead (``gateway/upstream/client.py``).

Every failure is one of burnish's upstream errors (``core/platform/errors.py``; ``gateway/upstream/client.py``
decides which are retried):

- ``UpstreamConnectError``: no connection (refused, unreachable, a name that does not resolve,
  connecting timed out): nothing was sent;
- ``UpstreamClosed``: a connection closed (or reset) before any byte of the answer;
- ``UpstreamProtocolError``: an answer that is not HTTP, or a TLS handshake that failed;
- ``UpstreamReadError``: a connection closed before the end of its answer;
- ``UpstreamTimeout``: silence past the time-out given for that wait; ``UpstreamPoolTimeout``:
  every connection to the replica stayed busy that long;
- ``Invalid``: a header that cannot be sent (a name that is no HTTP token, a line break or
  NUL in a value), refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from burnish_server.core.platform.errors import (
    Invalid,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPoolTimeout,
    UpstreamProtocolError,
    UpstreamReadError,
    UpstreamTimeout,
)

HIGH_WATER = 256 * 1024  # bytes of body held before the connection stops reading
LOW_WATER = 64 * 1024  # ... and starts again
MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and headers, at most
_NO_BODY_STATUSES = frozenset({204, 304})

Origin = tuple[str, str, int]  # scheme, host, port


class Target:
    """A base URL (``http://host:port/prefix``), split once: where to connect, what to say."""

    __slots__ = ("origin", "host", "prefix")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.origin: Origin = (parts.scheme, parts.hostname, port)
        self.host = parts.netloc.rpartition("@")[2].encode("idna")  # the Host header: no credentials
        self.prefix = parts.path.rstrip("/").encode()


class Connection(asyncio.Protocol):
    """One keep-alive connection, and the state of the exchange on it (one at a time)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.busy = False
        self.idle_since = 0.0
        self._begin()

    def _begin(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.done = False
        self.until_eof = False  # a body delimited by the connection's end
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self.chunks: deque[bytes] = deque()
        self.held = 0  # bytes in chunks
        self.head_bytes = 0  # of the head so far
        self.received = False  # any byte of the answer
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio's side --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.done:  # nothing asked for (an idle connection, or bytes after the answer): not reused
            self._close()
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(UpstreamProtocolError(f"the upstream's answer is not valid HTTP: {exc}"))
            return
        if not self.head_done:  # llhttp holds a header's pieces until it ends: bounded here
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._fail(UpstreamProtocolError(f"the upstream's answer is not valid HTTP: a head over {MAX_HEAD_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        # Also at the upstream's end of the stream: asyncio's default eof_received closes the transport.
        self.closed = True
        if self.busy and not self.done and self.error is None:
            if self.head_done and self.until_eof and exc is None:
                self.done = True
            else:
                if self.head_done:
                    self.error = UpstreamReadError("the upstream closed the connection before the end of its answer")
                else:
                    self.error = UpstreamClosed("the upstream closed the connection before answering")
        self._wake()

    # -- httptools' side -------------------------------------------------------------------
    # Once the answer's head is done, headers are trailers (ignored); once the answer is done,
    # anything llhttp reads in the same bytes is a second answer no one asked for: the
    # connection is closed and what it says is dropped.

    def on_message_begin(self) -> None:
        if self.done:
            self._close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        if self.done:
            return
        self.status = self.parser.get_status_code()
        if self.status < 200:  # 1xx: informational, the answer follows
            self.headers = {}
            return
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it once the message is complete
        self.until_eof = (
            "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "").lower() and self.status not in _NO_BODY_STATUSES
        )
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.done:
            return
        self.chunks.append(body)
        self.held += len(body)
        if self.held > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.head_done and not self.done:
            self.done = True
            self._wake()

    # -- the exchange ----------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._begin()
        self.busy = True
        self.transport.write(data)  # what the socket cannot take at once waits in the transport

    async def head(self, timeout: float | None) -> None:
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        while not self.head_done and self.error is None:
            await self._wait(deadline, timeout)
        if self.error is not None:  # broken before its head ended, or in the bytes that came with it
            raise self.error

    async def chunk(self, timeout: float | None) -> bytes:
        """What has arrived of the body since the last call, at once, or the next piece to
        arrive; ``b""`` at its end. What arrived before a failure is handed over before the
        failure is raised."""
        while not self.chunks:
            if self.done:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait(asyncio.get_running_loop().time() + timeout if timeout else None, timeout)
        # What arrived together goes on together (several events of a stream in one read): one
        # write to the client instead of one each, and nothing waits for more to come.
        piece = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.held -= len(piece)
        if self.paused and self.held < LOW_WATER and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return piece

    @property
    def reusable(self) -> bool:
        """The answer came whole (read or not) and both sides keep the connection open."""
        return self.done and self.keep_alive and not self.closed and self.error is None and not self.paused

    async def _wait(self, deadline: float | None, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_at(deadline, _expire, waiter, timeout) if deadline is not None else None
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        self.error = error
        self._close()
        self._wake()

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None], timeout: float | None) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout(f"the upstream sent nothing for {timeout:g} s"))


class Response:
    """An answer: its status and headers (names in lower case), and its body, read whole or
    as it arrives. Its connection goes back to the pool once the body is read to its end or
    ``aclose`` is called (which is always safe, and closes the connection if the answer had
    not all come). The body's first piece may take ``first`` seconds, as long as the head
    could (a stream's first event comes after the prompt is processed); each later piece
    ``between``. No HEAD requests: the parser cannot be told that such an answer has no body."""

    __slots__ = ("status_code", "headers", "_pool", "_conn", "_origin", "_first", "_between")

    def __init__(self, pool: Pool, conn: Connection, origin: Origin, first: float | None, between: float | None) -> None:
        self.status_code = conn.status
        self.headers = conn.headers
        self._pool = pool
        self._conn: Connection | None = conn
        self._origin = origin
        self._first = first  # the time-out for the body's first piece (a stream's first event)
        self._between = between  # ... and for each after it

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        timeout = self._first
        while chunk := await conn.chunk(timeout):
            yield chunk
            if self._conn is not conn:  # closed meanwhile: the connection may serve another call now
                return
            timeout = self._between
        self._release()

    async def aclose(self) -> None:
        self._release()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(self._origin, conn)


# What an HTTP header name may be made of (RFC 9110's token), and what a value may not hold:
# control characters other than tab (a line break would start a header of the client's own).
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NOT_IN_VALUES = bytes([*range(0, 9), *range(10, 32), 127])
_VALUE_BYTES = bytes(b for b in range(256) if b not in _NOT_IN_VALUES)


def check_header(name: bytes, value: bytes) -> None:
    """``Invalid`` for a header that cannot go on the wire as it is."""
    if not name or name.translate(None, _TOKEN):
        raise Invalid(f"header name {name.decode('latin-1')!r} is not an HTTP token", "invalid_header")
    if value.translate(None, _VALUE_BYTES):
        raise Invalid(f"header {name.decode('latin-1')!r} has a control character (a line break or NUL) in its value", "invalid_header")


class _Origin:
    """One origin's connections: its slots, its idle connections (most recently used last),
    and the requests that hold or wait for one of its slots."""

    __slots__ = ("slots", "idle", "users")

    def __init__(self, limit: int) -> None:
        self.slots = asyncio.Semaphore(limit)
        self.idle: list[Connection] = []
        self.users = 0


async def _acquire(slots: asyncio.Semaphore, timeout: float | None) -> bool:
    """A slot, waiting at most ``timeout`` when none is free; False if none came."""
    if not slots.locked():
        await slots.acquire()
        return True
    try:
        async with asyncio.timeout(timeout):
            await slots.acquire()
    except TimeoutError:
        return False
    return True


class Pool:
    """Keep-alive connections per origin, the most recently used first. At most ``limit`` in
    use at once, and at most ``per_origin`` to any one origin (a replica that stalls holds no
    more than that, and the others keep serving); a request beyond either waits for one to
    come free, for as long as it would wait for its answer to begin. Idle connections past
    ``idle_expiry`` are closed, and an origin with none in use and none idle (a replica that
    left) is forgotten, at most every ``idle_expiry`` seconds. ``tls``: the context for https
    origins (default: the system's trust store)."""

    def __init__(
        self, limit: int, connect_timeout: float | None, *, per_origin: int | None = None, idle_expiry: float, tls: ssl.SSLContext | None = None
    ) -> None:
        self.limit = limit
        self.per_origin = min(per_origin or limit, limit)
        self.connect_timeout = connect_timeout or None
        self.idle_expiry = idle_expiry
        self._origins: dict[Origin, _Origin] = {}
        self._slots: asyncio.Semaphore | None = None  # made in the running loop
        self._targets: dict[str, Target] = {}
        self._tls = tls
        self._closed = False
        self._pruned_at = time.monotonic()
        self.in_use = 0  # connections held by requests now

    def target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = Target(url)
        return target

    def stats(self) -> dict[str, int]:
        """For /metrics: connections in use and idle, and origins known."""
        idle = sum(len(o.idle) for o in self._origins.values())
        return {"in_use": self.in_use, "idle": idle, "origins": len(self._origins)}

    async def request(
        self, method: bytes, base: str, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes | None, first: float | None, between: float | None
    ) -> Response:
        """Send one request and wait for its answer's head (for at most ``first`` seconds after
        sending). The body is the returned ``Response``'s to read.

        A kept-alive connection the upstream closes before answering at all (it gave up on
        the idle connection as the request went out) is not a failure of the call: the request
        is sent once more, on a new connection. Only then: the upstream answered nothing, and a
        proxied call has no effect on it but the compute of an answer."""
        now = time.monotonic()
        if now - self._pruned_at > self.idle_expiry:
            self._prune(now)
        target = self.target(base)
        head = [method, b" ", target.prefix, path, b" HTTP/1.1\r\nhost: ", target.host, b"\r\n"]
        for name, value in headers:
            check_header(name, value)
            head += (name, b": ", value, b"\r\n")
        if body is not None:
            head.append(b"content-length: %d\r\n" % len(body))
        head.append(b"\r\n")
        if body:
            head.append(body)
        data = b"".join(head)

        slots = self._slots
        if slots is None:
            slots = self._slots = asyncio.Semaphore(self.limit)
        origin = self._origins.get(target.origin)
        if origin is None:
            origin = self._origins[target.origin] = _Origin(self.per_origin)
        origin.users += 1
        try:
            if not await _acquire(origin.slots, first):
                raise UpstreamPoolTimeout(f"all {self.per_origin} connections to {target.origin[1]}:{target.origin[2]} stayed busy for {first:g} s")
            try:
                if not await _acquire(slots, first):
                    raise UpstreamPoolTimeout(f"all {self.limit} connections to the upstream stayed busy for {first:g} s")
            except BaseException:
                origin.slots.release()
                raise
        except BaseException:
            origin.users -= 1
            raise
        self.in_use += 1
        fresh = False
        while True:
            try:
                conn, fresh = await self._connection(target.origin, origin, fresh)
            except BaseException:
                self._give_back(origin)
                raise
            try:
                conn.send(data)
                await conn.head(first)
            except UpstreamClosed:
                if fresh or conn.received:
                    self.release(target.origin, conn)
                    raise
                conn._close()  # closed as the request went out: once more on a new one, in the same slot
                fresh = True
            except BaseException:
                self.release(target.origin, conn)
                raise
            else:
                return Response(self, conn, target.origin, first, between)

    def release(self, origin: Origin, conn: Connection) -> None:
        """Back to the pool if its answer came whole (read or not) and both sides keep it open;
        else closed. Gives the call's slots back."""
        conn.busy = False
        state = self._origins[origin]
        if conn.reusable and not self._closed:
            conn.chunks.clear()
            conn.idle_since = time.monotonic()
            state.idle.append(conn)
        else:
            conn._close()
        self._give_back(state)

    def _give_back(self, origin: _Origin) -> None:
        self.in_use -= 1
        origin.users -= 1
        origin.slots.release()
        assert self._slots is not None
        self._slots.release()

    async def _connection(self, origin: Origin, state: _Origin, fresh: bool) -> tuple[Connection, bool]:
        """An idle connection to ``origin`` (unless ``fresh``), else a new one; and whether it is new."""
        idle = state.idle
        if idle and not fresh:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < self.idle_expiry:
                    return conn, False
                conn._close()
        scheme, host, port = origin
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(Connection, host, port, ssl=tls)
        except TimeoutError as exc:  # ours, or the kernel's (ETIMEDOUT)
            raise UpstreamConnectError(f"could not connect within {self.connect_timeout:g} s" if self.connect_timeout else "connecting timed out") from exc
        except ssl.SSLError as exc:  # something answered, but not as the TLS settings expect: 502, not "down"
            raise UpstreamProtocolError(f"the TLS handshake with the upstream failed: {exc.reason or exc}") from exc
        except OSError as exc:  # refused, unreachable, a name that does not resolve
            raise UpstreamConnectError(exc.strerror or str(exc) or type(exc).__name__) from exc
        return conn, True

    def _prune(self, now: float) -> None:
        """Close idle connections past their age; forget origins with none in use or idle (a
        replica that left), and the base URLs that named them."""
        self._pruned_at = now
        for key, state in list(self._origins.items()):
            keep = [c for c in state.idle if not c.closed and now - c.idle_since < self.idle_expiry]
            for conn in state.idle:
                if conn not in keep:
                    conn._close()
            state.idle = keep
            if not keep and state.users == 0:
                del self._origins[key]
        if len(self._targets) > len(self._origins):
            self._targets = {url: t for url, t in self._targets.items() if t.origin in self._origins}

    async def aclose(self) -> None:
        self._closed = True  # connections released from now on are closed
        for state in self._origins.values():
            for conn in state.idle:
                conn._close()
            state.idle.clear()
