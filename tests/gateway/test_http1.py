"""The proxy's HTTP/1.1 client (gateway/upstream/connections/http1.py) against scripted servers on loopback sockets.

Failures seen through the gateway (answers that are not HTTP, time-outs, cuts) are in
test_hostile.py and test_faults.py; here, what the client itself promises: connections kept
alive and reused, or not, bodies handed over as they arrive, flow control, the limit.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from burnish_server.core.platform.errors import Invalid, UpstreamConnectError, UpstreamPoolTimeout, UpstreamProtocolError, UpstreamReadError
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.upstream.connections.http1 import HIGH_WATER, MAX_HEAD_BYTES, Pool

IDLE = Settings().upstream_idle_expiry

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


class Server:
    """Answers each request on a connection with ``answer``, up to ``per_connection`` requests,
    then closes it. Counts connections and keeps each request's head and body."""

    def __init__(self, answer: bytes | Answer = OK, per_connection: int = 1000) -> None:
        self.answer = answer
        self.per_connection = per_connection
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for _ in range(self.per_connection):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
                self.heads.append(head)
                self.bodies.append(await reader.readexactly(length))
                if isinstance(self.answer, bytes):
                    writer.write(self.answer)
                else:
                    await self.answer(writer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    pool = Pool(4, 5, idle_expiry=IDLE)
    yield pool
    await pool.aclose()


async def post(pool: Pool, url: str, body: bytes = b"{}") -> bytes:
    response = await pool.request(b"POST", url, b"/", [], body, 5, 5)
    return await response.aread()


async def test_a_connection_is_kept_alive_and_the_request_goes_as_sent(pool: Pool) -> None:
    server = Server()
    url = await server.start()
    body = b'{"model": "tiny",  "x": "\xc3\xa9"}'
    for _ in range(3):
        response = await pool.request(b"POST", url, b"/v1/chat/completions?a=1", [(b"x-custom", b"v")], body, 5, 5)
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        assert await response.aread() == b"{}"
    assert server.connections == 1
    head = server.heads[0]
    assert head.startswith(b"POST /v1/chat/completions?a=1 HTTP/1.1\r\n") and b"\r\nx-custom: v\r\n" in head
    assert b"host: 127.0.0.1:" in head and b"content-length: %d\r\n" % len(body) in head
    assert server.bodies == [body] * 3  # byte for byte


async def test_a_base_url_with_a_path_prefixes_every_request(pool: Pool) -> None:
    server = Server()
    url = await server.start()
    response = await pool.request(b"GET", url + "/vllm/", b"/v1/models", [], None, 5, 5)
    await response.aread()
    assert server.heads[0].startswith(b"GET /vllm/v1/models HTTP/1.1\r\n") and b"content-length" not in server.heads[0]


async def test_a_chunked_body_is_handed_over_as_it_arrives(pool: Pool) -> None:
    events = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]

    async def stream(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")

    url = await Server(stream).start()
    response = await pool.request(b"POST", url, b"/v1/chat/completions", [], b"{}", 5, 5)
    assert [piece async for piece in response.aiter_bytes()] == events  # never joined


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}",  # ends with the connection
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
        OK,  # then the upstream closes the idle connection (its keep-alive time-out)
    ],
    ids=["until the end of the connection", "connection: close", "closed while idle"],
)
async def test_a_connection_the_upstream_ends_is_not_reused(pool: Pool, answer: bytes) -> None:
    server = Server(answer, per_connection=1)
    url = await server.start()
    for _ in range(2):
        assert await post(pool, url) == b"{}"
        await asyncio.sleep(0.05)
    assert server.connections == 2


async def test_an_informational_answer_before_the_answer_is_skipped(pool: Pool) -> None:
    url = await Server(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + OK).start()
    response = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
    assert response.status_code == 200 and "link" not in response.headers
    assert await response.aread() == b"{}"


async def test_a_body_read_unfinished_closes_its_connection(pool: Pool) -> None:
    server = Server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
    url = await server.start()
    for _ in range(2):
        response = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
        await response.aclose()  # the rest never read: the connection cannot serve another answer
    assert server.connections == 2


async def test_a_slow_reader_holds_a_bounded_part_of_a_large_body(pool: Pool) -> None:
    size = 8 * 1024 * 1024
    url = await Server(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size).start()
    response = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
    conn = response._conn
    assert conn is not None
    got, most = 0, 0
    async for piece in response.aiter_bytes():
        got += len(piece)
        most = max(most, conn.held)
        await asyncio.sleep(0.001)
    assert got == size
    assert most < HIGH_WATER + 512 * 1024  # paused past the high-water mark: at most what one read brings beyond it


async def test_requests_beyond_the_limit_wait_for_a_connection() -> None:
    server = Server()
    url = await server.start()
    pool = Pool(1, 5, idle_expiry=IDLE)
    first = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
    second = asyncio.ensure_future(post(pool, url))
    await asyncio.sleep(0.1)
    assert not second.done()  # the one connection is still in use
    assert await first.aread() == b"{}"
    assert await second == b"{}"
    assert server.connections == 1
    await pool.aclose()


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(pool: Pool) -> None:
    server = Server()
    url = await server.start()
    for name, value in [(b"x-evil", b"a\r\nhost: elsewhere"), (b"x-nul", b"a\x00b"), (b"x evil", b"a"), (b"x:evil", b"a"), (b"", b"a")]:
        with pytest.raises(Invalid) as refused:
            await pool.request(b"POST", url, b"/", [(name, value)], b"{}", 5, 5)
        assert refused.value.status == 400 and refused.value.code == "invalid_header"
    assert server.connections == 0
    assert await (await pool.request(b"POST", url, b"/", [(b"x-fine", b"tab\tand latin-1 \xe9")], b"{}", 5, 5)).aread() == b"{}"


async def test_a_head_without_end_is_refused(pool: Pool) -> None:
    async def endless(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Long: ")
        for _ in range(2 * MAX_HEAD_BYTES // 4096):
            writer.write(b"a" * 4096)
            await writer.drain()

    url = await Server(endless).start()
    with pytest.raises(UpstreamProtocolError, match="head over"):
        await post(pool, url)


async def test_nothing_listening_is_a_connect_error(pool: Pool) -> None:
    server = Server()
    url = await server.start()
    server.server.close()
    await server.server.wait_closed()
    with pytest.raises(UpstreamConnectError):
        await post(pool, url)


async def test_an_https_upstream_is_spoken_to_over_tls(pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A certificate the system trusts (here: SSL_CERT_FILE, which OpenSSL's default paths read)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = Server()
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=tls)
    url = f"https://127.0.0.1:{server.server.sockets[0].getsockname()[1]}"
    assert await post(pool, url) == b"{}"
    assert await post(pool, url) == b"{}"
    assert server.connections == 1 and server.heads[0].startswith(b"POST / HTTP/1.1\r\n")
    with pytest.raises(UpstreamProtocolError, match="CERTIFICATE_VERIFY_FAILED"):  # a certificate no one trusts: 502, no retry mends it
        monkeypatch.delenv("SSL_CERT_FILE")
        await post(Pool(1, 5, idle_expiry=IDLE), url)


async def test_a_kept_alive_connection_closed_as_the_request_goes_out_is_retried_on_a_new_one(pool: Pool) -> None:
    async def first_only(writer: asyncio.StreamWriter) -> None:
        if len(server.heads) == 2:  # the second request, on the kept-alive connection: closed unanswered (its idle time-out, just then)
            writer.transport.abort()
        else:
            writer.write(OK)

    server = Server(first_only)
    url = await server.start()
    assert await post(pool, url) == b"{}"
    assert await post(pool, url) == b"{}"
    assert server.connections == 2 and len(server.heads) == 3  # the second request went twice


async def test_a_connection_idle_past_its_expiry_is_not_reused() -> None:
    pool = Pool(4, 5, idle_expiry=0.05)
    server = Server()
    url = await server.start()
    for _ in range(2):
        assert await post(pool, url) == b"{}"
        await asyncio.sleep(0.1)
    assert server.connections == 2
    await pool.aclose()


async def test_bytes_after_the_answer_are_dropped_and_the_connection_not_reused(pool: Pool) -> None:
    server = Server(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")
    url = await server.start()
    for _ in range(2):
        response = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
        assert await response.aread() == b"{}" and response.headers["content-length"] == "2"
    assert server.connections == 2


async def test_a_chunked_answer_cut_short_is_an_error_whatever_the_case_of_its_header(pool: Pool) -> None:
    async def cut(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n")
        await writer.drain()
        writer.close()

    url = await Server(cut).start()
    response = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
    with pytest.raises(UpstreamReadError, match="before the end"):
        await response.aread()


async def test_an_answer_that_came_whole_is_reused_even_unread(pool: Pool) -> None:
    server = Server(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}")
    url = await server.start()
    for _ in range(2):
        response = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
        await asyncio.sleep(0.05)  # the body is in
        await response.aclose()  # a retried status: its body is not read
    assert server.connections == 1


async def test_waiting_for_a_busy_pool_is_bounded() -> None:
    url = await Server().start()
    pool = Pool(1, 5, idle_expiry=IDLE)
    held = await pool.request(b"POST", url, b"/", [], b"{}", 5, 5)
    with pytest.raises(UpstreamPoolTimeout) as waited:
        await pool.request(b"POST", url, b"/", [], b"{}", 0.2, 0.2)
    assert waited.value.status == 504
    await held.aclose()
    assert await post(pool, url) == b"{}"  # the slot the timed-out wait never took is free
    await pool.aclose()


async def test_a_stalled_replica_holds_at_most_its_share_of_the_connections() -> None:
    """Two replicas, three connections in all, two to each: a replica whose answers never come
    holds two, and the other still gets the third at once."""
    stalled, healthy = Server(_never), Server()
    slow_url, fast_url = await stalled.start(), await healthy.start()
    pool = Pool(3, 5, per_origin=2, idle_expiry=IDLE)
    waiting = [asyncio.ensure_future(pool.request(b"POST", slow_url, b"/", [], b"{}", 30, 30)) for _ in range(3)]
    await asyncio.sleep(0.2)
    assert stalled.connections == 2  # the third waits for one of the replica's own two
    assert await asyncio.wait_for(post(pool, fast_url), 2) == b"{}"
    with pytest.raises(UpstreamPoolTimeout, match="127.0.0.1"):  # its own share, full, says whose
        await pool.request(b"POST", slow_url, b"/", [], b"{}", 0.1, 0.1)
    for task in waiting:
        task.cancel()
    await pool.aclose()


async def test_idle_connections_and_replicas_that_left_are_forgotten() -> None:
    pool = Pool(4, 5, idle_expiry=0.05)
    gone, staying = Server(), Server()
    gone_url, staying_url = await gone.start(), await staying.start()
    assert await post(pool, gone_url) == b"{}" and await post(pool, staying_url) == b"{}"
    assert pool.stats() == {"in_use": 0, "idle": 2, "origins": 2}
    await asyncio.sleep(0.1)
    assert await post(pool, staying_url) == b"{}"  # the first request past the expiry prunes
    assert pool.stats() == {"in_use": 0, "idle": 1, "origins": 1}
    assert list(pool._targets) == [staying_url]  # noqa: SLF001 (the base URL of the replica that left is gone too)
    await pool.aclose()


async def _never(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)
