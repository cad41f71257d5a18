"""The proxy's HTTP/1.1 client (gateway/http1.py) against scripted servers on loopback sockets.

Failures seen through the gateway (answers that are not HTTP, time-outs, cuts) are in
test_hostile.py and test_faults.py; here, what the client itself promises: connections kept
alive and reused, or not, bodies handed over as they arrive, flow control, the limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from burnish_server.gateway.http1 import HIGH_WATER, MAX_HEAD_BYTES, Pool

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Server:
    """Runs ``script`` on every connection; counts connections and keeps each request's head."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
        body = await reader.readexactly(length)
        self.bodies.append(body)
        return body


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_a_connection_is_kept_alive_and_the_request_goes_as_sent() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                writer.write(OK)

        async with Server(script) as server:
            pool = Pool(4, 5)
            body = b'{"model": "tiny",  "x": "\xc3\xa9"}'
            for _ in range(3):
                response = await pool.request(b"POST", server.url, b"/v1/chat/completions?a=1", [(b"x-custom", b"v")], body, 5, 5)
                assert response.status_code == 200 and response.headers["content-type"] == "application/json"
                assert await response.aread() == b"{}"
            assert server.connections == 1
            head = server.heads[0]
            assert head.startswith(b"POST /v1/chat/completions?a=1 HTTP/1.1\r\n") and b"\r\nx-custom: v\r\n" in head
            assert b"host: 127.0.0.1:" in head and b"content-length: %d\r\n" % len(body) in head
            assert server.bodies == [body] * 3  # byte for byte
            await pool.aclose()

    run(test)


def test_a_base_url_with_a_path_prefixes_every_request() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(OK)

        async with Server(script) as server:
            pool = Pool(4, 5)
            response = await pool.request(b"GET", server.url + "/vllm/", b"/v1/models", [], None, 5, 5)
            await response.aread()
            assert server.heads[0].startswith(b"GET /vllm/v1/models HTTP/1.1\r\n") and b"content-length" not in server.heads[0]
            await pool.aclose()

    run(test)


def test_a_chunked_body_is_handed_over_as_it_arrives() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.write(b"0\r\n\r\n")
            await reader.read()

        async with Server(script) as server:
            pool = Pool(4, 5)
            response = await pool.request(b"POST", server.url, b"/v1/chat/completions", [], b"{}", 5, 5)
            pieces = [piece async for piece in response.aiter_bytes()]
            assert pieces == [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]  # never joined
            await pool.aclose()

    run(test)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}",  # ends with the connection
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["until the end of the connection", "connection: close"],
)
def test_an_answer_that_closes_its_connection_is_read_whole_and_the_next_request_connects_again(answer: bytes) -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(answer)

        async with Server(script) as server:
            pool = Pool(4, 5)
            for _ in range(2):
                response = await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
                assert await response.aread() == b"{}"
            assert server.connections == 2
            await pool.aclose()

    run(test)


def test_an_idle_connection_the_upstream_closed_is_not_reused() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(OK)
            await writer.drain()  # then closes: an upstream's idle time-out

        async with Server(script) as server:
            pool = Pool(4, 5)
            for _ in range(2):
                response = await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
                assert await response.aread() == b"{}"
                await asyncio.sleep(0.1)
            assert server.connections == 2
            await pool.aclose()

    run(test)


def test_an_informational_answer_before_the_answer_is_skipped() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + OK)
            await reader.read()

        async with Server(script) as server:
            pool = Pool(4, 5)
            response = await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
            assert response.status_code == 200 and "link" not in response.headers
            assert await response.aread() == b"{}"
            await pool.aclose()

    run(test)


def test_a_body_read_unfinished_closes_its_connection() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
                await writer.drain()

        async with Server(script) as server:
            pool = Pool(4, 5)
            response = await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
            await response.aclose()  # the rest of the body never read: the connection cannot serve another answer
            response = await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
            await response.aclose()
            assert server.connections == 2
            await pool.aclose()

    run(test)


def test_a_slow_reader_holds_a_bounded_part_of_a_large_body() -> None:
    size = 8 * 1024 * 1024

    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            writer.write(b"x" * size)
            await writer.drain()

        async with Server(script) as server:
            pool = Pool(4, 5)
            response = await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
            conn = response._conn
            assert conn is not None
            got, most = 0, 0
            async for piece in response.aiter_bytes():
                got += len(piece)
                most = max(most, conn.held)
                await asyncio.sleep(0.001)
            assert got == size
            assert most < HIGH_WATER + 512 * 1024  # paused past the high-water mark: what one read brings at most beyond it
            await pool.aclose()

    run(test)


def test_requests_beyond_the_limit_wait_for_a_connection() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                writer.write(OK)

        async with Server(script) as server:
            pool = Pool(1, 5)
            first = await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
            second = asyncio.ensure_future(pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5))
            await asyncio.sleep(0.1)
            assert not second.done()  # the one connection is still in use
            assert await first.aread() == b"{}"
            assert await (await second).aread() == b"{}"
            assert server.connections == 1
            await pool.aclose()

    run(test)


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)

        async with Server(script) as server:
            pool = Pool(4, 5)
            with pytest.raises(httpx.LocalProtocolError):
                await pool.request(b"POST", server.url, b"/", [(b"x-evil", b"a\r\nhost: elsewhere")], b"{}", 5, 5)
            assert server.connections == 0
            await pool.aclose()

    run(test)


def test_a_head_without_end_is_refused() -> None:
    async def test() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nX-Long: ")
            for _ in range(2 * MAX_HEAD_BYTES // 4096):
                writer.write(b"a" * 4096)
                await writer.drain()
            await reader.read()

        async with Server(script) as server:
            pool = Pool(4, 5)
            with pytest.raises(httpx.RemoteProtocolError, match="head over"):
                await pool.request(b"POST", server.url, b"/", [], b"{}", 5, 5)
            await pool.aclose()

    run(test)


def test_nothing_listening_is_a_connect_error() -> None:
    async def test() -> None:
        async with Server(lambda r, w: asyncio.sleep(0)) as server:
            url = server.url
        pool = Pool(4, 5)
        with pytest.raises(httpx.ConnectError):
            await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
        await pool.aclose()

    run(test)
