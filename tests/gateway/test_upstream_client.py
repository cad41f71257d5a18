"""The upstream client as a deployment configures it (gateway/upstream/client.py): TLS with the
operator's CA bundle and client certificate, and an upstream reached through the
environment's HTTP proxy (spoken to with httpx, which http1 does not replace there).
Scripted servers on loopback sockets: a TLS server that demands a client certificate, and a
small forward proxy."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import pytest

from burnish_server.core.platform.errors import Invalid, UpstreamClosed, UpstreamProtocolError
from burnish_server.core.platform.replicas import ReplicaSet
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.upstream.client import HttpxPool, Upstream, proxied
from burnish_server.gateway.upstream.connections.http1 import Pool
from tests.gateway.test_http1 import OK, Server


def _certificate(tmp_path: Path, name: str, *extra: str) -> tuple[Path, Path]:
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}", *extra, "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def _send(upstream: Upstream) -> bytes:
    response, _ = await upstream.send("POST", "/v1/chat/completions", content=b"{}", headers=[])
    try:
        return await response.aread()
    finally:
        await response.aclose()


async def test_tls_with_the_operators_ca_bundle_and_client_certificate(tmp_path: Path) -> None:
    server_cert, server_key = _certificate(tmp_path, "127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1")
    client_cert, client_key = _certificate(tmp_path, "gateway")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(server_cert, server_key)
    tls.verify_mode = ssl.CERT_REQUIRED  # a client without the certificate is refused
    tls.load_verify_locations(client_cert)
    server = Server()
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=tls)
    url = f"https://127.0.0.1:{server.server.sockets[0].getsockname()[1]}"

    configured = Settings.load(
        {}, upstream=url, upstream_attempts=1, upstream_ca_bundle=str(server_cert), upstream_client_cert=str(client_cert), upstream_client_key=str(client_key)
    )
    upstream = Upstream(configured, ReplicaSet([url]))
    assert isinstance(upstream.pool, Pool)
    assert await _send(upstream) == b"{}"
    await upstream.aclose()
    # The server unknown to us: the handshake fails, which no retry mends: 502. We unknown to
    # it: with TLS 1.3 the server refuses the certificate after the client's side of the
    # handshake, so the connection closes before any answer, as a replica going away does: 503.
    for missing, error, status in (
        ({"upstream_ca_bundle": ""}, UpstreamProtocolError, 502),
        ({"upstream_client_cert": "", "upstream_client_key": ""}, UpstreamClosed, 503),
    ):
        other = Upstream(Settings.load({}, **{**_fields(configured), **missing}), ReplicaSet([url]))
        with pytest.raises(error) as failed:
            await _send(other)
        assert failed.value.status == status, failed.value
        await other.aclose()


def _fields(settings: Settings) -> dict[str, object]:
    return {f: getattr(settings, f) for f in ("upstream", "upstream_attempts", "upstream_ca_bundle", "upstream_client_cert", "upstream_client_key")}


def test_an_upstream_key_that_cannot_be_sent_is_refused_at_start() -> None:
    with pytest.raises(Invalid, match="control character"):
        Upstream(Settings.load({}, upstream_api_key="sk-abc\ndef"), ReplicaSet(["http://127.0.0.1:1"]))


def test_one_replica_may_use_every_connection_and_several_share_them() -> None:
    one = Upstream(Settings.load({}, max_connections=10), ReplicaSet(["http://127.0.0.1:1"]))
    two = Upstream(Settings.load({}, max_connections=10), ReplicaSet(["http://127.0.0.1:1", "http://127.0.0.1:2"]))
    assert isinstance(one.pool, Pool) and isinstance(two.pool, Pool)
    assert (one.pool.per_origin, two.pool.per_origin) == (10, 5)


class ForwardProxy:
    """An HTTP forward proxy: takes absolute-form requests, sends each on (``connection:
    close``), relays the answer, and keeps the request lines it saw."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, _, rest = head.partition(b"\r\n")
        self.seen.append(line)
        method, target, version = line.split(b" ")
        host_port, _, path = target.removeprefix(b"http://").partition(b"/")
        host, _, port = host_port.partition(b":")
        length = next((int(h.split(b":")[1]) for h in rest.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
        body = await reader.readexactly(length)
        up_reader, up_writer = await asyncio.open_connection(host.decode(), int(port))
        kept = [h for h in rest.split(b"\r\n") if h and not h.lower().startswith((b"connection:", b"proxy-"))]
        up_writer.write(b" ".join([method, b"/" + path, version]) + b"\r\n" + b"\r\n".join([*kept, b"connection: close"]) + b"\r\n\r\n" + body)
        await up_writer.drain()
        writer.write(await up_reader.read())
        await writer.drain()
        up_writer.close()
        writer.close()


async def test_an_upstream_behind_the_environments_proxy_is_reached_through_it(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    server = Server(OK, per_connection=1)  # it closes after its answer, as the proxy asked
    url = await server.start()
    proxy = ForwardProxy()
    monkeypatch.setenv("HTTP_PROXY", await proxy.start())
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert proxied([url])
    upstream = Upstream(Settings.load({}, upstream=url, upstream_attempts=1), ReplicaSet([url]))
    assert isinstance(upstream.pool, HttpxPool)
    assert any("environment's proxy" in r.getMessage() for r in caplog.records)  # said at start, with how to avoid it
    assert await _send(upstream) == b"{}"
    assert proxy.seen == [f"POST {url}/v1/chat/completions HTTP/1.1".encode()]
    await upstream.aclose()

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # bypassed: http1 again, straight to the upstream
    assert not proxied([url])
    direct = Upstream(Settings.load({}, upstream=url, upstream_attempts=1), ReplicaSet([url]))
    assert isinstance(direct.pool, Pool) and await _send(direct) == b"{}"
    assert len(proxy.seen) == 1
    await direct.aclose()
