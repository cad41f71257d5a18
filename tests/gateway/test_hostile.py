"""Hostile input, and an upstream that misbehaves below HTTP: never a 500, never a stack trace.

Every bad request is a 4xx in the error format of its surface (OpenAI's on /v1 and /admin,
Anthropic's on /v1/messages) and leaves the store as it was; an upstream that answers
something that is not HTTP, stalls, or sends answers of the wrong shape costs a 502/504
(or a cut stream) that is recorded. All of it against a real gateway on a loopback socket:
the hand-written table below for the requests, and ``RawUpstream``, a TCP server that
answers with fixed bytes, for the upstream.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from burnish_server.core.platform.ids import ID_REGEX
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.app import create_app
from tests.conftest import ADMIN_TOKEN, Gateway, fresh_database_url
from tests.servers import ServerThread
from tests.upstream import Upstream

MESSAGES = [{"role": "user", "content": "tell me"}]
CHAT = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'
DEEP = b"[" * 1000 + b"]" * 1000  # msgspec gives up near the interpreter's recursion limit


def with_deep(prefix: bytes) -> bytes:
    return prefix + b',"x":' + DEEP + b"}"


# ---- the table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One hostile request and what it must get: ``code`` in the surface's format ``kind``
    ("openai", "anthropic", or "server": refused by the HTTP server before the app, as text)."""

    name: str
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str | bytes] = field(default_factory=dict)
    status: int = 400
    code: str | None = None
    kind: str = "openai"
    admin: bool = False


ANTHROPIC_MSG = b'{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'
# A table: one case a line.
# fmt: off
CASES = [
    # --- the proxy, OpenAI's surfaces ---
    Case("utf8 in a passthrough chat", "POST", "/t/hostile/v1/chat/completions", b'{"model":"tiny","messages":[{"role":"user","content":"\xff"}]}', code="invalid_json"),
    Case("utf8 in the model", "POST", "/t/hostile/v1/chat/completions", b'{"model":"\xff\xfe"}', code="invalid_json"),
    Case("utf8 in a policy chat", "POST", "/t/hostile/v1/chat/completions", b'{"model":"agent","messages":[{"role":"user","content":"\xed\xa0\x80"}]}', code="invalid_json"),
    Case("utf8 in a policy completion", "POST", "/t/hostile/v1/completions", b'{"model":"agent","prompt":"\xc3"}', code="invalid_json"),
    Case("utf8 in a policy response", "POST", "/t/hostile/v1/responses", b'{"model":"agent","input":"\x80"}', code="invalid_json"),
    Case("nested 1000 deep", "POST", "/t/hostile/v1/chat/completions", with_deep(CHAT[:-1]), code="invalid_json"),
    Case("nested 1000 deep, policy", "POST", "/t/hostile/v1/chat/completions", with_deep(b'{"model":"agent","messages":[]'), code="invalid_json"),
    Case("only nesting", "POST", "/t/hostile/v1/chat/completions", DEEP, code="invalid_request"),  # not an object: refused at once
    Case("an array", "POST", "/t/hostile/v1/chat/completions", b"[1,2]", code="invalid_request"),
    Case("a string", "POST", "/t/hostile/v1/chat/completions", b'"chat"', code="invalid_request"),
    Case("null", "POST", "/t/hostile/v1/chat/completions", b"null", code="invalid_request"),
    Case("a huge number", "POST", "/t/hostile/v1/chat/completions", b"1e999999", code="invalid_request"),
    Case("a NaN literal", "POST", "/t/hostile/v1/chat/completions", b'{"model":"tiny","messages":[],"temperature":NaN}', code="invalid_json"),
    Case("Infinity", "POST", "/t/hostile/v1/chat/completions", b'{"model":"tiny","messages":[],"temperature":Infinity}', code="invalid_json"),
    Case("model a number", "POST", "/t/hostile/v1/chat/completions", b'{"model":5,"messages":[]}', code="invalid_request"),
    Case("model an object", "POST", "/t/hostile/v1/chat/completions", b'{"model":{"a":1},"messages":[]}', code="invalid_request"),
    Case("stream a string", "POST", "/t/hostile/v1/chat/completions", b'{"model":"tiny","stream":"yes"}', code="invalid_request"),
    Case("stream a number", "POST", "/t/hostile/v1/chat/completions", b'{"model":"tiny","stream":1}', code="invalid_request"),
    Case("model with NUL", "POST", "/t/hostile/v1/chat/completions", b'{"model":"tiny\\u0000","messages":[]}', code="invalid_request"),
    Case("model with a newline", "POST", "/t/hostile/v1/chat/completions", b'{"model":"a\\nb","messages":[]}', code="invalid_request"),
    Case("model of 300 characters", "POST", "/t/hostile/v1/chat/completions", b'{"model":"' + b"m" * 300 + b'","messages":[]}', code="invalid_request"),
    Case("empty body", "POST", "/t/hostile/v1/chat/completions", b"", code="invalid_json"),
    Case("blank body", "POST", "/t/hostile/v1/chat/completions", b" \r\n\t ", code="invalid_json"),
    Case("a byte-order mark", "POST", "/t/hostile/v1/chat/completions", b"\xef\xbb\xbf" + CHAT, code="invalid_json"),
    Case("trailing garbage", "POST", "/t/hostile/v1/chat/completions", CHAT + b" and more", code="invalid_json"),
    Case("not JSON, as text/plain", "POST", "/t/hostile/v1/chat/completions", b"model=tiny", {"content-type": "text/plain"}, code="invalid_json"),
    Case("form-encoded", "POST", "/t/hostile/v1/completions", b"model=tiny&prompt=x", {"content-type": "application/x-www-form-urlencoded"}, code="invalid_json"),
    Case("a previous_response_id number", "POST", "/t/hostile/v1/responses", b'{"model":"agent","input":"hi","previous_response_id":5}', code="invalid_request"),
    # --- keys: headers and the URL prefix ---
    Case("trajectory id '.'", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "."}, code="invalid_id"),
    Case("trajectory id '..'", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": ".."}, code="invalid_id"),
    Case("trajectory id '...' in the path", "POST", "/t/.../v1/chat/completions", CHAT, code="invalid_id"),
    Case("trajectory id %2E%2E in the path", "POST", "/t/%2E%2E/v1/chat/completions", CHAT, code="invalid_id"),
    Case("group id %00 in the path", "POST", "/g/%00/t/hostile/v1/chat/completions", CHAT, code="invalid_id"),
    Case("trajectory id of 129", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "a" * 129}, code="invalid_id"),
    Case("trajectory id of 5000", "POST", "/t/" + "a" * 5000 + "/v1/chat/completions", CHAT, code="invalid_id"),
    Case("trajectory id UTF-8", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "é".encode()}, code="invalid_id"),
    Case("trajectory id latin-1", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": b"caf\xe9"}, code="invalid_id"),
    Case("trajectory id with a tab", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "a\tb"}, code="invalid_id"),
    Case("group id UTF-8", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "hostile", "x-group-id": "ü".encode()}, code="invalid_id"),
    Case("group id '..'", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "hostile", "x-group-id": ".."}, code="invalid_id"),
    Case("group size ²", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "hostile", "x-group-id": "g", "x-group-size": "²".encode("latin-1")}, code="invalid_group_size"),
    Case("group size ٣", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "hostile", "x-group-id": "g", "x-group-size": "٣".encode()}, code="invalid_group_size"),
    Case("group size of 5000 digits", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "hostile", "x-group-id": "g", "x-group-size": "9" * 5000}, code="invalid_group_size"),
    Case("group size 0", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "hostile", "x-group-id": "g", "x-group-size": "0"}, code="invalid_group_size"),
    Case("group size -3", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "hostile", "x-group-id": "g", "x-group-size": "-3"}, code="invalid_group_size"),
    Case("eval UTF-8", "POST", "/t/hostile/v1/chat/completions", CHAT, {"x-eval": b"ja" + "ä".encode()}, code="invalid_eval"),
    Case("eval maybe", "POST", "/t/hostile/v1/chat/completions", CHAT, {"x-eval": "maybe"}, code="invalid_eval"),
    Case("a control character in a key header", "POST", "/v1/chat/completions", CHAT, {"x-trajectory-id": "a\x01b"}, kind="server"),
    # --- Anthropic's surface ---
    Case("messages: utf8", "POST", "/t/hostile/v1/messages", b'{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"\xff"}]}', kind="anthropic"),
    Case("messages: utf8, policy", "POST", "/t/hostile/v1/messages", b'{"model":"agent","max_tokens":5,"messages":[{"role":"user","content":"\xff"}]}', kind="anthropic"),
    Case("messages: nested", "POST", "/t/hostile/v1/messages", with_deep(ANTHROPIC_MSG[:-1]), kind="anthropic"),
    Case("messages: empty", "POST", "/t/hostile/v1/messages", b"", kind="anthropic"),
    Case("messages: an array", "POST", "/t/hostile/v1/messages", b"[]", kind="anthropic"),
    Case("messages: messages a string, policy", "POST", "/t/hostile/v1/messages", b'{"model":"agent","max_tokens":5,"messages":"x"}', kind="anthropic"),
    Case("messages: max_tokens 1e999, policy", "POST", "/t/hostile/v1/messages", b'{"model":"agent","max_tokens":1e999,"messages":[]}', kind="anthropic"),
    Case("messages: trajectory '..'", "POST", "/v1/messages", ANTHROPIC_MSG, {"x-trajectory-id": ".."}, kind="anthropic"),
    Case("messages: group size ²", "POST", "/v1/messages", ANTHROPIC_MSG, {"x-trajectory-id": "h", "x-group-id": "g", "x-group-size": b"\xb2"}, kind="anthropic"),
    # --- rewards, groups, RULER ---
    Case("reward: utf8", "POST", "/v1/trajectories/seed/reward", b'{"reward":"\xff"}', code="invalid_json", admin=True),
    Case("reward: nested", "POST", "/v1/trajectories/seed/reward", b'{"reward":1,"components":' + DEEP + b"}", code="invalid_json", admin=True),
    Case("reward: only nesting", "POST", "/v1/trajectories/seed/reward", DEEP, code="invalid_json", admin=True),
    Case("reward: NaN", "POST", "/v1/trajectories/seed/reward", b'{"reward":NaN}', code="invalid_json", admin=True),
    Case("reward: 1e999", "POST", "/v1/trajectories/seed/reward", b'{"reward":1e999}', code="invalid_json", admin=True),
    Case("reward: a string", "POST", "/v1/trajectories/seed/reward", b'{"reward":"high"}', code="invalid_reward", admin=True),
    Case("reward: true", "POST", "/v1/trajectories/seed/reward", b'{"reward":true}', code="invalid_reward", admin=True),
    Case("reward: an array", "POST", "/v1/trajectories/seed/reward", b"[]", code="invalid_reward", admin=True),
    Case("reward: null", "POST", "/v1/trajectories/seed/reward", b"null", code="invalid_reward", admin=True),
    Case("reward: empty", "POST", "/v1/trajectories/seed/reward", b"", code="invalid_reward", admin=True),
    Case("reward: blank", "POST", "/v1/trajectories/seed/reward", b"   ", code="invalid_json", admin=True),
    Case("reward: a component's name empty", "POST", "/v1/trajectories/seed/reward", b'{"reward":1,"components":{"":1}}', code="invalid_reward", admin=True),
    Case("reward: as text/plain", "POST", "/v1/trajectories/seed/reward", b"reward=1", {"content-type": "text/plain"}, code="invalid_json", admin=True),
    Case("reward: msgpack", "POST", "/v1/trajectories/seed/reward", b"\x81\xa6reward\x01", {"content-type": "application/x-msgpack"}, code="invalid_json", admin=True),
    Case("reward: id '..'", "POST", "/v1/trajectories/%2E%2E/reward", b'{"reward":1}', code="invalid_id", admin=True),
    Case("reward: id '.'", "POST", "/v1/trajectories/%2E/reward", b'{"reward":1}', code="invalid_id", admin=True),
    Case("reward: id with %00", "POST", "/v1/trajectories/a%00b/reward", b'{"reward":1}', code="invalid_id", admin=True),
    Case("reward: id with %2F", "POST", "/v1/trajectories/a%2Fb/reward", b'{"reward":1}', status=404, code="not_found", admin=True),
    Case("reward: id with %FF", "POST", "/v1/trajectories/%FF/reward", b'{"reward":1}', code="invalid_id", admin=True),
    Case("trajectory: id of 5000", "GET", "/v1/trajectories/" + "a" * 5000, code="invalid_id", admin=True),
    Case("close: group '.'", "POST", "/v1/groups/%2E/close", code="invalid_id", admin=True),
    Case("ruler: utf8", "POST", "/v1/groups/seedgroup/ruler", b'{"rubric":"\xff"}', code="invalid_json", admin=True),
    Case("ruler: nested", "POST", "/v1/groups/seedgroup/ruler", DEEP, code="invalid_json", admin=True),
    Case("ruler: an array", "POST", "/v1/groups/seedgroup/ruler", b"[1]", code="invalid_request", admin=True),
    # --- query strings ---
    Case("list: limit abc", "GET", "/v1/trajectories?limit=abc", code="invalid_request", admin=True),
    Case("list: limit empty", "GET", "/v1/trajectories?limit=", code="invalid_request", admin=True),
    Case("list: limit 0", "GET", "/v1/trajectories?limit=0", code="invalid_request", admin=True),
    Case("list: limit -1", "GET", "/v1/trajectories?limit=-1", code="invalid_request", admin=True),
    Case("list: limit 1e3", "GET", "/v1/trajectories?limit=1e3x", code="invalid_request", admin=True),
    Case("list: limit of 23 digits", "GET", "/v1/trajectories?limit=99999999999999999999999", code="invalid_request", admin=True),
    Case("list: order %00", "GET", "/v1/trajectories?order=%00", code="invalid_request", admin=True),
    Case("list: after %FF", "GET", "/v1/trajectories?after=%FF", code="invalid_request", admin=True),
    Case("list: group '..'", "GET", "/v1/trajectories?group_id=..", code="invalid_request", admin=True),
    Case("list: rewarded maybe", "GET", "/v1/trajectories?rewarded=maybe", code="invalid_request", admin=True),
    Case("export: eval maybe", "GET", "/v1/trajectories/export?eval=maybe", code="invalid_request", admin=True),
    # --- the admin API ---
    Case("admin: utf8", "POST", "/admin/policies", b'{"name":"\xff","base_model":"tiny"}', code="invalid_json", admin=True),
    Case("admin: nested", "POST", "/admin/policies", DEEP, code="invalid_json", admin=True),
    Case("admin: name '..'", "POST", "/admin/policies", b'{"name":"..","base_model":"tiny"}', code="invalid_id", admin=True),
    Case("admin: name '.'", "GET", "/admin/policies/%2E", code="invalid_id", admin=True),
    Case("admin: NaN learning rate", "PATCH", "/admin/policies/agent", b'{"train":{"learning_rate":NaN}}', code="invalid_json", admin=True),
    Case("admin: 1e999 learning rate", "PATCH", "/admin/policies/agent", b'{"train":{"learning_rate":1e999}}', code="invalid_json", admin=True),
    Case("admin: patch an array", "PATCH", "/admin/policies/agent", b"[]", code="invalid_policy", admin=True),
    Case("admin: rollback 1e999", "POST", "/admin/policies/agent/rollback", b'{"step":1e999}', code="invalid_json", admin=True),
    Case("admin: rollback of 23 digits", "POST", "/admin/policies/agent/rollback", b'{"step":99999999999999999999999}', code="invalid_rollback", admin=True),
    Case("admin: token not latin-1 text", "GET", "/admin/policies", headers={"authorization": b"Bearer \xc3\xa9"}, status=401, code="invalid_admin_token"),
]
# fmt: on


def _snapshot(gw: Gateway) -> list[Any]:
    """Everything a hostile request might have changed, as the API shows it."""
    with gw.admin() as c:
        answers = [
            c.get(p) for p in ("/v1/trajectories?limit=1000", "/v1/trajectories/seed", "/v1/groups/seedgroup", "/admin/policies", "/v1/trajectories/hostile")
        ]
    return [(r.status_code, r.json()) for r in answers]


def assert_error(r: httpx.Response, status: int, code: str | None, kind: str) -> None:
    """The status, the surface's error format, and no trace of the gateway's insides."""
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text and 'File "' not in r.text and "internal_error" not in r.text, r.text
    if kind == "server":  # refused by the HTTP server itself, before the app saw it
        return
    body = r.json()
    if kind == "anthropic":
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"} and body["error"]["message"], body
        assert body["error"]["type"] == ("invalid_request_error" if status == 400 else body["error"]["type"])
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["message"] and body["error"]["type"].endswith("_error"), body
        if code is not None:
            assert body["error"]["code"] == code, body


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def hostile_gateway(request: pytest.FixtureRequest, upstream_server: tuple[Upstream, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway per database for the whole table (as ``make_gateway`` makes them), with a
    policy, a recorded trajectory in a group, and a reward: what a hostile request must not change."""
    data = tmp_path_factory.mktemp("hostile")
    url = fresh_database_url(request.param, data)
    settings = Settings.load(
        {},
        upstream=upstream_server[1],
        data_dir=str(data),
        database_url=url,
        upstream_timeout=10,
        retry_initial_wait=0.01,
        retry_max_wait=0.05,
        admin_token=ADMIN_TOKEN,
    )
    server = ServerThread(create_app(settings)).start()
    gw = Gateway(server.url, settings)
    try:
        gw.create_policy()
        with gw.client() as c:
            r = c.post(
                "/v1/chat/completions",
                json={"model": "agent", "messages": MESSAGES},
                headers={"x-trajectory-id": "seed", "x-group-id": "seedgroup", "x-group-size": "2"},
            )
            assert r.status_code == 200, r.text
        with gw.admin() as c:
            assert c.post("/v1/trajectories/seed/reward", json={"reward": 0.5}).status_code == 200
        yield gw
    finally:
        server.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request_is_a_4xx_in_its_surfaces_format_and_stores_nothing(hostile_gateway: Gateway, case: Case) -> None:
    gw = hostile_gateway
    before = _snapshot(gw)
    headers: dict[str, str | bytes] = {"content-type": "application/json"} if case.body is not None else {}
    if case.admin:
        headers["authorization"] = f"Bearer {ADMIN_TOKEN}"
    headers.update(case.headers)
    with gw.client() as c:
        r = c.send(c.build_request(case.method, case.path, content=case.body, headers=headers))
    assert_error(r, case.status, case.code, case.kind)
    assert _snapshot(gw) == before


def test_ids_made_only_of_dots_are_refused_in_the_openapi_pattern_too(gateway: Gateway) -> None:
    schema = httpx.get(gateway.url + "/docs/openapi.json").json()
    params = schema["paths"]["/v1/trajectories/{trajectory_id}"]["get"]["parameters"]
    (trajectory,) = [p for p in params if p["name"] == "trajectory_id"]
    assert trajectory["schema"]["pattern"] == ID_REGEX
    with gateway.client() as c:  # a name with dots and more is still an id
        r = c.post("/t/v1..beta/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert r.status_code == 200 and gateway.trajectory("v1..beta")["id"] == "v1..beta"


@pytest.mark.parametrize(
    "model",
    ["agent@99999999999999999999", "agent@\u0661", "\u6a21\u578b", "caf\u00e9"],
    ids=["a 20-digit step", "a non-ASCII digit", "CJK", "latin-1"],
)
def test_odd_model_names_pass_through_and_are_recorded(make_gateway: Callable[..., Gateway], database_url: str, model: str) -> None:
    """Not refused: a model name the gateway does not route is forwarded untouched and recorded
    (a pinned step must be a small ASCII number; a name beyond ASCII is percent-encoded in the header)."""
    gw = make_gateway(database_url)
    gw.create_policy()
    r = httpx.post(gw.url + "/t/odd/v1/chat/completions", json={"model": model, "messages": MESSAGES})
    assert r.status_code == 200, r.text
    assert httpx.URL("http://x/" + r.headers["x-policy-version"]).path == "/" + model
    (call,) = gw.trajectory("odd")["calls"]
    assert call["status"] == "ok" and call["model"] == model and call["policy"] is None


# ---- an upstream that is no HTTP server -------------------------------------------------------


class RawUpstream:
    """A loopback TCP server that reads each request, then plays ``script`` on the connection:
    bytes are sent, a float is a pause, None holds the connection open until the test ends.
    ``read_request=False``: never reads at all (an upstream hung before its event loop)."""

    def __init__(self, script: list[bytes | float | None], *, read_request: bool = True) -> None:
        self.script = script
        self.read_request = read_request
        self.requests = 0
        self.done = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                if self.read_request and not self._read(conn):
                    return
                for step in self.script:
                    if step is None:
                        self.done.wait()
                        return
                    if isinstance(step, float):
                        time.sleep(step)
                    else:
                        conn.sendall(step)
                conn.shutdown(socket.SHUT_WR)
                time.sleep(0.05)
            except OSError:
                pass
            if not self.read_request:
                self.done.wait()

    def _read(self, conn: socket.socket) -> bool:
        """The request's head and its Content-Length of body (so closing sends FIN, not RST)."""
        data = b""
        while b"\r\n\r\n" not in data:
            if not (chunk := conn.recv(65536)):
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            if not (chunk := conn.recv(65536)):
                return False
            body += chunk
        with self.lock:
            self.requests += 1
        return True

    def close(self) -> None:
        self.done.set()
        self.sock.close()


@pytest.fixture
def raw_upstream() -> Iterator[Callable[..., RawUpstream]]:
    made: list[RawUpstream] = []

    def make(script: list[bytes | float | None], **kwargs: Any) -> RawUpstream:
        made.append(RawUpstream(script, **kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


EVENT = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}\n\n'
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def plain(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body


# Answers that are no HTTP at all: refused before anything reached the client, so retried; a
# malformed answer is the upstream's fault, 502.
NOT_HTTP = {
    "garbage for a status line": [b"HELLO THERE\r\n\r\n"],
    "binary for a status line": [b"\x16\x03\x01\x00\xff\x00garbage\r\n\r\n"],
    "a four-digit status": [b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\n{}"],
    "a header without a colon": [b"HTTP/1.1 200 OK\r\nContent-Type application/json\r\nContent-Length: 2\r\n\r\n{}"],
    "a Content-Length of letters": [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n{}"],
    "bad chunked framing with the head": [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b'{"id":') + b"ZZZ\r\nnope\r\n"
    ],
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("script", list(NOT_HTTP.values()), ids=list(NOT_HTTP))
def test_an_answer_that_is_not_http_is_a_502_retried_and_recorded(make_gateway, raw_upstream, script: list[bytes], stream: bool) -> None:
    raw = raw_upstream(script)
    gw = make_gateway(upstream=raw.url)
    r = httpx.post(gw.url + "/t/broken/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": stream})
    assert_error(r, 502, "upstream_unavailable", "openai")
    assert raw.requests == gw.settings.upstream_attempts  # nothing had reached the client: retried
    (call,) = gw.trajectory("broken")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 502 and call["attempts"] == gw.settings.upstream_attempts
    assert "127.0.0.1" not in r.json()["error"]["message"]  # aiohttp's words carry the upstream's URL: not passed on


@pytest.mark.parametrize("surface", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("down", ["closed without a word", "refused"])
def test_an_upstream_down_or_restarting_is_a_503_with_retry_after(make_gateway, raw_upstream, down: str, stream: bool, surface: str) -> None:
    """vLLM down (nothing listens: refused) or going away (the connection closed before any
    byte): retried, then 503 with Retry-After in the surface's format, which every client's
    retry logic waits on; recorded as the upstream's error."""
    if down == "refused":
        with socket.socket() as s:  # a port no one listens on
            s.bind(("127.0.0.1", 0))
            url, raw = f"http://127.0.0.1:{s.getsockname()[1]}", None
    else:
        raw = raw_upstream([])
        url = raw.url
    gw = make_gateway(upstream=url)
    path, body = ("/v1/messages", {"max_tokens": 5}) if surface == "anthropic" else ("/v1/chat/completions", {})
    r = httpx.post(gw.url + f"/t/down/{path.lstrip('/')}", json={"model": "tiny", "messages": MESSAGES, "stream": stream, **body})
    assert_error(r, 503, "upstream_unavailable", surface)
    assert r.headers["retry-after"] == "2"
    if raw is not None:
        assert raw.requests == gw.settings.upstream_attempts  # nothing had reached the client: retried
    (call,) = gw.trajectory("down")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 503 and call["attempts"] == gw.settings.upstream_attempts


def test_an_answer_that_is_not_http_is_anthropics_502_on_messages(make_gateway, raw_upstream) -> None:
    raw = raw_upstream(NOT_HTTP["garbage for a status line"])
    gw = make_gateway(upstream=raw.url)
    gw.create_policy()
    body = {"model": "agent", "max_tokens": 5, "messages": MESSAGES}
    for model in ("tiny", "agent"):  # passed through, and translated for a policy
        r = httpx.post(gw.url + f"/t/broken-{model}/v1/messages", json={**body, "model": model})
        assert_error(r, 502, None, "anthropic")
        assert r.json()["error"]["type"] == "api_error"
        assert [c["status"] for c in gw.trajectory(f"broken-{model}")["calls"]] == ["upstream_error"]


def test_a_models_listing_from_a_broken_upstream_is_a_502(make_gateway, raw_upstream) -> None:
    for script in (NOT_HTTP["garbage for a status line"], [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"]):
        gw = make_gateway(upstream=raw_upstream(script).url)
        assert_error(httpx.get(gw.url + "/v1/models"), 502, "upstream_unavailable", "openai")


def test_a_body_cut_short_is_a_502_and_recorded(make_gateway, raw_upstream) -> None:
    raw = raw_upstream([b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"id":"x",'])
    gw = make_gateway(upstream=raw.url)
    r = httpx.post(gw.url + "/t/short/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert_error(r, 502, "upstream_unavailable", "openai")
    assert raw.requests == 1  # the answer had begun: reported, not retried
    (call,) = gw.trajectory("short")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 502 and "broke off" in call["error"]


# A stream that starts well, then breaks its chunked framing (aiohttp's C parser reports it
# only when the read time-out comes: the gateway then finds the error on the connection).
BROKEN_MID_STREAM = [SSE_HEAD + chunk(EVENT), 0.1, b"ZZZ\r\nnot a chunk\r\n"]
CLOSED_MID_STREAM = [SSE_HEAD + chunk(EVENT), 0.1, chunk(EVENT)]


@pytest.mark.parametrize("script", [BROKEN_MID_STREAM, CLOSED_MID_STREAM], ids=["broken framing", "closed before its end"])
def test_a_stream_broken_midway_ends_in_an_error_event_and_is_recorded_cut(make_gateway, raw_upstream, script) -> None:
    gw = make_gateway(upstream=raw_upstream(script).url, upstream_read_timeout=1)
    gw.create_policy()
    for surface, model in (("chat/completions", "tiny"), ("chat/completions", "agent"), ("messages", "agent")):
        body = {"model": model, "messages": MESSAGES, "stream": True, "max_tokens": 5}
        trajectory = f"cut-{surface.replace('/', '-')}-{model}"
        with httpx.stream("POST", gw.url + f"/t/{trajectory}/v1/{surface}", json=body, timeout=30) as r:
            assert r.status_code == 200
            text = r.read().decode()
        last = text.strip().split("\n\n")[-1]
        assert "Traceback" not in text and '"error"' in last and ("event: error" in last) == (surface == "messages"), text
        assert "hi" in text  # what arrived reached the client first
        (call,) = gw.trajectory(trajectory)["calls"]
        assert call["status"] == "upstream_cut" and call["error"], call


# ---- time-outs -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_upstream_silent_before_its_answer_is_a_504_within_the_timeout(make_gateway, raw_upstream, stream: bool) -> None:
    raw = raw_upstream([None])  # reads the request, never answers
    gw = make_gateway(upstream=raw.url, upstream_timeout=0.5, upstream_read_timeout=30)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/t/silent/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": stream})
    assert_error(r, 504, "upstream_timeout", "openai")
    assert time.monotonic() - t0 < 3 and raw.requests == 1  # not retried: the upstream may be at work
    (call,) = gw.trajectory("silent")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 504


def test_an_upstream_that_stops_reading_the_request_is_a_504(make_gateway, raw_upstream) -> None:
    """Hung before it reads anything: the body outgrows the socket buffers and aiohttp's own
    clock (which starts once the request is sent) never starts; the gateway's does."""
    raw = raw_upstream([None], read_request=False)
    gw = make_gateway(upstream=raw.url, upstream_timeout=0.5, upstream_connect_timeout=0.5, upstream_read_timeout=30)
    big = "x" * (24 * 1024 * 1024)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/t/deaf/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": big}]}, timeout=60)
    assert_error(r, 504, "upstream_timeout", "openai")
    assert time.monotonic() - t0 < 10
    (call,) = gw.trajectory("deaf")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 504


def test_a_plain_answer_that_stalls_midway_is_a_504_after_the_read_timeout(make_gateway, raw_upstream) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    gw = make_gateway(upstream=raw_upstream([head + b'{"id"', 0.2, b':"x",', None]).url, upstream_timeout=30, upstream_read_timeout=0.5)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/t/stalled/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert_error(r, 504, "upstream_timeout", "openai")
    assert time.monotonic() - t0 < 5  # the read time-out, not the 30 s for the answer to begin
    (call,) = gw.trajectory("stalled")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 504


def test_a_stream_that_stalls_midway_is_cut_after_the_read_timeout(make_gateway, raw_upstream) -> None:
    gw = make_gateway(upstream=raw_upstream([SSE_HEAD + chunk(EVENT), 0.2, chunk(EVENT), None]).url, upstream_timeout=30, upstream_read_timeout=0.5)
    t0 = time.monotonic()
    with httpx.stream("POST", gw.url + "/t/stalled-s/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True}) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert time.monotonic() - t0 < 5
    assert text.count('"content":"hi"') == 2 and "upstream_error" in text and "Traceback" not in text
    (call,) = gw.trajectory("stalled-s")["calls"]
    assert call["status"] == "upstream_cut" and "0.5 s" in call["error"]
    assert call["response"]["choices"][0]["message"]["content"] == "hihi"


def test_a_streams_first_event_may_take_the_time_for_the_answer_to_begin(make_gateway, raw_upstream) -> None:
    """Prompt processing comes between a stream's headers and its first event: that wait is
    the upstream's time to begin (upstream_timeout), not the read time-out."""
    done = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    gw = make_gateway(upstream=raw_upstream([SSE_HEAD, 1.2, chunk(EVENT), 0.1, chunk(EVENT) + done]).url, upstream_timeout=30, upstream_read_timeout=0.6)
    with httpx.stream("POST", gw.url + "/t/slow-start/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True}) as r:
        text = r.read().decode()
    assert text.endswith("data: [DONE]\n\n"), text
    (call,) = gw.trajectory("slow-start")["calls"]
    assert call["status"] == "ok" and call["response"]["choices"][0]["message"]["content"] == "hihi"


# ---- answers of the wrong shape ---------------------------------------------------------------

WRONG_SHAPE_STREAM = [
    SSE_HEAD
    + chunk(b'data: {"choices":5}\n\n')
    + chunk(b"data: [1,2]\n\n")
    + chunk(b'data: {"choices":[{"index":"a","delta":5}]}\n\n')
    + chunk(b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":100000000}]}}]}\n\n')
    + chunk(b"data: \xff\xfe\n\n")
    + chunk(b'data: {"x":' + DEEP + b"}\n\n")
    + chunk(EVENT)
    + chunk(b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
]


def test_a_stream_of_the_wrong_shape_is_relayed_and_recorded_as_the_upstreams_error(make_gateway, raw_upstream) -> None:
    gw = make_gateway(upstream=raw_upstream(WRONG_SHAPE_STREAM).url)
    gw.create_policy()
    for model in ("tiny", "agent"):
        with httpx.stream("POST", gw.url + f"/t/shape-{model}/v1/chat/completions", json={"model": model, "messages": MESSAGES, "stream": True}) as r:
            text = r.read().decode("utf-8", "replace")
        assert r.status_code == 200 and text.endswith("data: [DONE]\n\n") and "Traceback" not in text
        (call,) = gw.trajectory(f"shape-{model}")["calls"]
        assert call["status"] == "upstream_error" and "wrong shape" in call["error"]
    # Translated for a policy: the client gets an error event in its surface's format.
    with httpx.stream("POST", gw.url + "/t/shape-resp/v1/responses", json={"model": "agent", "input": "hi", "stream": True}) as r:
        text = r.read().decode()
    assert "event: error" in text and "wrong shape" in text
    assert gw.trajectory("shape-resp")["calls"][0]["status"] == "upstream_error"


RESPONSES_WRONG_SHAPE = [
    SSE_HEAD
    + chunk(b'event: response.created\ndata: {"type":"response.created","response":{"id":"r","status":"in_progress"}}\n\n')
    + chunk(b'event: response.output_text.delta\ndata: {"type":["response.output_text.delta"],"delta":5}\n\n')
    + chunk(b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r","status":"completed","output":[]}}\n\n')
    + b"0\r\n\r\n"
]
MESSAGES_WRONG_SHAPE = [
    SSE_HEAD
    + chunk(b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":5}}\n\n')
    + chunk(b'event: content_block_delta\ndata: {"type":"content_block_delta","index":"a","delta":{"type":"text_delta","text":[1]}}\n\n')
    + chunk(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    + b"0\r\n\r\n"
]


@pytest.mark.parametrize(
    ("surface", "script", "payload", "last"),
    [
        ("responses", RESPONSES_WRONG_SHAPE, {"input": "hi"}, '"status":"completed","output":[]}}\n\n'),
        ("messages", MESSAGES_WRONG_SHAPE, {"max_tokens": 5, "messages": MESSAGES}, '{"type":"message_stop"}\n\n'),
    ],
)
def test_a_passed_through_stream_of_the_wrong_shape_is_relayed_to_its_end(
    make_gateway, raw_upstream, surface: str, script: list[bytes], payload: dict, last: str
) -> None:
    """On the surfaces that go as they came (a model that is no policy): each event is relayed
    as the upstream sent it, the terminal one too, and the call is recorded as the upstream's error."""
    gw = make_gateway(upstream=raw_upstream(script).url)
    with httpx.stream("POST", gw.url + f"/t/shape-{surface}/v1/{surface}", json={"model": "tiny", "stream": True, **payload}) as r:
        text = r.read().decode()
    assert r.status_code == 200 and text.endswith(last), text
    (call,) = gw.trajectory(f"shape-{surface}")["calls"]
    assert call["status"] == "upstream_error" and "wrong shape" in call["error"]


@pytest.mark.parametrize(
    "body",
    [b'{"id":"x","choices":"nope","usage":5}', b'{"id":"x","choices":[5,{"index":"a"}]}', b'{"choices":[{"index":0,"token_ids":["a"],"message":5}]}'],
    ids=["choices a string", "choices of numbers", "a message a number, token ids of strings"],
)
def test_a_plain_answer_of_the_wrong_shape_is_no_500(make_gateway, raw_upstream, body: bytes) -> None:
    gw = make_gateway(upstream=raw_upstream([plain(body)]).url)
    gw.create_policy()
    r = httpx.post(gw.url + "/t/shape/v1/chat/completions", json={"model": "agent", "messages": MESSAGES})
    assert r.status_code == 200  # relayed: the client sees what the upstream said
    for surface, kind, payload in (("messages", "anthropic", {"max_tokens": 5, "messages": MESSAGES}), ("responses", "openai", {"input": "hi"})):
        r = httpx.post(gw.url + f"/t/shape-{surface}/v1/{surface}", json={"model": "agent", **payload})
        assert_error(r, 502, "upstream_error", kind)  # no translation of it exists
        assert gw.trajectory(f"shape-{surface}")["calls"][0]["status"] == "upstream_error"


@pytest.mark.parametrize(
    "body",
    [b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"\xff"}}]}', b'{"id":"x","choices":' + DEEP + b"}", b"<html>hi</html>"],
    ids=["not UTF-8", "nested 1000 deep", "not JSON"],
)
def test_a_plain_answer_that_is_no_json_is_relayed_and_recorded(make_gateway, raw_upstream, body: bytes) -> None:
    gw = make_gateway(upstream=raw_upstream([plain(body)]).url)
    r = httpx.post(gw.url + "/t/nojson/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert r.status_code == 200 and r.content == body
    (call,) = gw.trajectory("nojson")["calls"]
    assert call["status"] == "ok" and call["response"] is None  # recorded, its body not kept as JSON


def test_settings_name_each_upstream_timeout(tmp_path: Path) -> None:
    s = Settings.load({"BURNISH_UPSTREAM_CONNECT_TIMEOUT": "2", "BURNISH_UPSTREAM_TIMEOUT": "90", "BURNISH_UPSTREAM_READ_TIMEOUT": "15"})
    assert (s.upstream_connect_timeout, s.upstream_timeout, s.upstream_read_timeout) == (2, 90, 15)
    assert s.connect_timeout == 2  # the older name, still read by the judge's client
    d = Settings.load({})
    assert (d.upstream_connect_timeout, d.upstream_timeout, d.upstream_read_timeout) == (5, 300, 60)
