"""The gateway is invisible to real clients: same answers as the upstream, and every call recorded."""

from __future__ import annotations

import json
import random

import anthropic
import httpx
import openai
import pytest

from burnish_server.core.protocols.packed import pack_ids
from burnish_server.core.protocols.surfaces import CHAT
from burnish_server.gateway.edge.entry import proxy_route
from burnish_server.gateway.proxy.capture import StreamCapture
from tests.conftest import Gateway
from tests.gateway.test_trajectories import assert_openai_error
from tests.upstream import Upstream, choice_text, logprobs_for, prompt_ids, token_ids

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two plus two"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "search", "description": "look up", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
    }
]


def only_call(gw: Gateway, trajectory_id: str) -> dict:
    t = gw.trajectory(trajectory_id)
    assert t["call_count"] == 1, t
    return t["calls"][0]


def test_chat_plain_sync_client_sees_upstream_answer(gateway: Gateway, upstream_server: tuple[Upstream, str]) -> None:
    direct = openai.OpenAI(base_url=upstream_server[1] + "/v1", api_key="k")
    through = openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", default_headers={"X-Trajectory-Id": "plain-1"})
    want = direct.chat.completions.create(model="tiny", messages=MESSAGES)
    raw = through.chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES)
    got = raw.parse()
    assert got.model_dump() == want.model_dump()
    assert raw.headers["x-trajectory-id"] == "plain-1"

    call = only_call(gateway, "plain-1")
    assert call["endpoint"] == "chat.completions" and call["status"] == "ok" and call["http_status"] == 200
    assert call["model"] == "tiny" and call["stream"] is False
    assert call["request"]["messages"] == MESSAGES
    assert call["response"] == want.model_dump(exclude_unset=True)
    assert call["usage"] == {"prompt_tokens": 10, "completion_tokens": want.usage.completion_tokens, "total_tokens": want.usage.total_tokens}
    assert call["attempts"] == 1 and call["upstream_ms"] > 0


async def test_chat_stream_async_client_sees_upstream_chunks(gateway: Gateway, upstream_server: tuple[Upstream, str]) -> None:
    # Closed here, on their loop: not by the garbage collector on some other thread's.
    async with (
        openai.AsyncOpenAI(base_url=upstream_server[1] + "/v1", api_key="k") as direct,
        openai.AsyncOpenAI(base_url=gateway.url + "/t/stream-1/v1", api_key="k") as through,
    ):
        kwargs = dict(model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
        want = [c.model_dump() async for c in await direct.chat.completions.create(**kwargs)]
        got = [c.model_dump() async for c in await through.chat.completions.create(**kwargs)]
        assert got == want and len(got) > 3
        plain = await direct.chat.completions.create(model="tiny", messages=MESSAGES)

    call = only_call(gateway, "stream-1")
    assert call["stream"] is True and call["status"] == "ok"
    assert call["response"]["choices"][0]["message"] == {"role": "assistant", "content": plain.choices[0].message.content}
    assert call["response"]["choices"][0]["finish_reason"] == "stop"
    assert call["usage"]["completion_tokens"] == plain.usage.completion_tokens


def test_stream_bytes_pass_through_unchanged(gateway: Gateway, upstream_server: tuple[Upstream, str]) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "stream": True}
    want = httpx.post(upstream_server[1] + "/v1/chat/completions", json=body).content
    with httpx.Client() as client, client.stream("POST", gateway.url + "/v1/chat/completions", json=body) as r:
        chunks = list(r.iter_raw())
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-trajectory-id"].startswith("t-")  # untagged: a generated one-call trajectory
    assert b"".join(chunks) == want
    assert b"".join(chunks).endswith(b"data: [DONE]\n\n")


def test_request_body_forwarded_byte_for_byte_without_gateway_headers(gateway: Gateway, upstream: Upstream) -> None:
    body = b'{"model":"tiny",  "messages":[{"role":"user","content":"spacing \\u00e9 kept"}], "extra_field": {"x": [1,2]}}'
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json", "authorization": "Bearer sk-user", "x-trajectory-id": "fwd-1", "x-custom": "yes"},
    )
    assert r.status_code == 200
    seen = upstream.requests[-1]
    assert seen["body"] == body
    assert seen["headers"]["authorization"] == "Bearer sk-user" and seen["headers"]["x-custom"] == "yes"
    assert "x-trajectory-id" not in seen["headers"]
    assert gateway.trajectory("fwd-1")["calls"][0]["request"]["extra_field"] == {"x": [1, 2]}


def test_tool_calls_plain_and_streamed(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/t/tools-1/v1", api_key="k")
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
    streamed = list(client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, stream=True))
    assert plain.choices[0].finish_reason == "tool_calls"
    args = "".join(c.choices[0].delta.tool_calls[0].function.arguments for c in streamed if c.choices and c.choices[0].delta.tool_calls)
    assert args == plain.choices[0].message.tool_calls[0].function.arguments

    calls = gateway.trajectory("tools-1")["calls"]
    assert [c["stream"] for c in calls] == [False, True]
    tool_call = calls[1]["response"]["choices"][0]["message"]["tool_calls"][0]
    assert tool_call == plain.choices[0].message.tool_calls[0].model_dump()
    assert json.loads(tool_call["function"]["arguments"]) == {"query": choice_text({"messages": MESSAGES}, 0)}
    assert calls[1]["response"]["choices"][0]["finish_reason"] == "tool_calls"


def test_n_choices_streamed_are_reassembled_per_choice(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/t/n-1/v1", api_key="k")
    list(client.chat.completions.create(model="tiny", messages=MESSAGES, n=3, stream=True))
    choices = only_call(gateway, "n-1")["response"]["choices"]
    assert [c["message"]["content"] for c in choices] == [choice_text({"messages": MESSAGES}, i) for i in range(3)]


@pytest.mark.parametrize("stream", [False, True])
def test_token_ids_and_logprobs_are_captured(gateway: Gateway, stream: bool) -> None:
    client = openai.OpenAI(base_url=gateway.url + f"/t/tok-{stream}/v1", api_key="k")
    extra = {"return_token_ids": True}
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, logprobs=True, stream=stream, extra_body=extra)
    if stream:
        list(response)
    tokens = only_call(gateway, f"tok-{stream}")["tokens"]
    texts = [choice_text({"messages": MESSAGES}, i) for i in range(2)]
    assert tokens["prompt_token_ids"] == prompt_ids({"messages": MESSAGES})
    assert tokens["completion_token_ids"] == [token_ids(t) for t in texts]
    assert tokens["completion_logprobs"] == [pytest.approx(logprobs_for(t), rel=1e-6) for t in texts]


def test_token_ids_are_stored_packed(gateway: Gateway) -> None:
    """Token ids go to the store as int32 arrays, not JSON lists."""
    import asyncio

    from sqlalchemy import select
    from sqlalchemy.ext.asyncio import create_async_engine

    from burnish_server.store.models import Call

    openai.OpenAI(base_url=gateway.url + "/t/packed/v1", api_key="k").chat.completions.create(
        model="tiny", messages=MESSAGES, extra_body={"return_token_ids": True}
    )

    async def read() -> bytes:
        engine = create_async_engine(gateway.settings.resolved_database_url)
        async with engine.connect() as conn:
            blob = (await conn.execute(select(Call.completion_token_ids).where(Call.trajectory_id == "packed"))).scalar_one()
        await engine.dispose()
        return blob

    assert asyncio.run(read()) == pack_ids(token_ids(choice_text({"messages": MESSAGES}, 0)))


@pytest.mark.parametrize("stream", [False, True])
def test_completions(gateway: Gateway, upstream_server: tuple[Upstream, str], stream: bool) -> None:
    direct = openai.OpenAI(base_url=upstream_server[1] + "/v1", api_key="k")
    through = openai.OpenAI(base_url=gateway.url + f"/t/cmpl-{stream}/v1", api_key="k")
    want = direct.completions.create(model="tiny", prompt="count to three", stream=stream)
    got = through.completions.create(model="tiny", prompt="count to three", stream=stream)
    if stream:
        want, got = [c.model_dump() for c in want], [c.model_dump() for c in got]
        assert got == want
    else:
        assert got.model_dump() == want.model_dump()
    call = only_call(gateway, f"cmpl-{stream}")
    assert call["endpoint"] == "completions"
    assert call["response"]["choices"][0]["text"] == choice_text({"prompt": "count to three"}, 0)


@pytest.mark.parametrize("stream", [False, True])
def test_responses(gateway: Gateway, upstream_server: tuple[Upstream, str], stream: bool) -> None:
    direct = openai.OpenAI(base_url=upstream_server[1] + "/v1", api_key="k")
    through = openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", default_headers={"X-Trajectory-Id": f"resp-{stream}"})
    if stream:
        want = [e.model_dump() for e in direct.responses.create(model="tiny", input="hello", stream=True)]
        got = [e.model_dump() for e in through.responses.create(model="tiny", input="hello", stream=True)]
        assert got == want
    else:
        assert through.responses.create(model="tiny", input="hello").output_text == direct.responses.create(model="tiny", input="hello").output_text
    call = only_call(gateway, f"resp-{stream}")
    assert call["endpoint"] == "responses" and call["status"] == "ok"
    assert call["response"]["status"] == "completed"
    assert call["response"]["output"][0]["content"][0]["text"] == choice_text({"input": "hello"}, 0)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages(gateway: Gateway, upstream_server: tuple[Upstream, str], stream: bool) -> None:
    direct = anthropic.Anthropic(base_url=upstream_server[1], api_key="k")
    through = anthropic.Anthropic(base_url=gateway.url + f"/g/grp-a/t/msg-{stream}", api_key="k")
    kwargs = dict(model="tiny", max_tokens=50, messages=[{"role": "user", "content": "hi claude"}])
    if stream:
        with direct.messages.stream(**kwargs) as s:
            want = s.get_final_message()
        with through.messages.stream(**kwargs) as s:
            got = s.get_final_message()
    else:
        want, got = direct.messages.create(**kwargs), through.messages.create(**kwargs)
    assert got.model_dump() == want.model_dump()
    call = only_call(gateway, f"msg-{stream}")
    assert call["endpoint"] == "messages" and call["status"] == "ok"
    assert call["response"]["content"] == [{"type": "text", "text": choice_text({"messages": kwargs["messages"]}, 0)}]
    assert call["response"]["stop_reason"] == "end_turn"
    assert gateway.trajectory(f"msg-{stream}")["group_id"] == "grp-a"


def test_models_lists_the_upstreams(gateway: Gateway) -> None:
    models = openai.OpenAI(base_url=gateway.url + "/t/any/v1", api_key="k").models.list()
    assert [m.id for m in models] == ["tiny"]


def test_trajectory_keys_prefix_header_and_generated(gateway: Gateway) -> None:
    with gateway.client() as c:
        body = {"model": "tiny", "messages": MESSAGES}
        r1 = c.post("/g/g-keys/t/k-1/v1/chat/completions", json=body, headers={"x-trajectory-id": "ignored"})
        r2 = c.post("/v1/chat/completions", json=body, headers={"x-trajectory-id": "k-2", "x-group-id": "g-keys", "x-group-size": "2"})
        r3 = c.post("/v1/chat/completions", json=body)
    assert r1.headers["x-trajectory-id"] == "k-1"  # the path wins over the header
    assert r2.headers["x-trajectory-id"] == "k-2"
    generated = r3.headers["x-trajectory-id"]
    assert generated.startswith("t-") and gateway.trajectory(generated)["call_count"] == 1
    with gateway.client() as c:
        group = c.get("/v1/groups/g-keys").json()
    assert [m["id"] for m in group["members"]] == ["k-1", "k-2"]
    assert group["expected_size"] == 2


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v1/chat/completions", ("chat.completions", {})),
        ("/eval/v1/messages", ("messages", {})),
        ("/t/a/v1/responses", ("responses", {"trajectory_id": "a"})),
        ("/eval/g/g/t/a/v1/completions", ("completions", {"group_id": "g", "trajectory_id": "a"})),
        ("/g/g/v1/chat/completions", None),  # a group only before a trajectory
        ("/t//v1/chat/completions", None),
        ("/t/a/b/v1/chat/completions", None),
        ("/v1/chat/completions/", None),
        ("/v1/models", None),
        ("/v1/embeddings", None),
        ("/evalv1/chat/completions", None),
    ],
)
def test_the_entry_point_knows_the_proxy_routes(path: str, route: tuple | None) -> None:
    """What gateway/edge/entry.py serves itself; every other path goes to Litestar's routing."""
    found = proxy_route(path)
    assert (found and (found[0].name, found[1])) == route


def test_a_path_litestar_routes_is_served_by_the_same_proxy(gateway: Gateway) -> None:
    """A trailing slash is no proxy route of the entry point's, but Litestar routes it to the
    proxy's own handler: the same answer, headers and record either way."""
    with gateway.client() as c:
        body = {"model": "tiny", "messages": MESSAGES}
        direct = c.post("/t/entry-1/v1/chat/completions", json=body)
        routed = c.post("/t/entry-2/v1/chat/completions/", json=body)
        refused = c.post("/t/entry-3/v1/chat/completions/", content=b'{"model": ')
    assert direct.status_code == routed.status_code == 200 and direct.json() == routed.json()
    assert routed.headers["x-trajectory-id"] == "entry-2" and routed.headers["x-request-id"].startswith("req-")
    assert {k for k in direct.headers if k.startswith("x-")} == {k for k in routed.headers if k.startswith("x-")}
    assert_openai_error(refused, 400, "invalid_json")
    assert only_call(gateway, "entry-2")["request"] == only_call(gateway, "entry-1")["request"]


def test_a_long_stream_is_recorded_whole() -> None:
    """Each event's text, logprobs and token ids are added in place (gateway/proxy/capture.py), so a
    long answer costs the same per event as a short one; what is recorded is all of it, and
    the events relayed to the client are the upstream's own."""
    n = 3000
    events = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "logprobs": {"content": [{"token": "t", "logprob": -i}]}, "token_ids": [i]}]}
        for i in range(n)
    ]
    events.append({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "k", "function": {"name": "f", "arguments": "{"}}]}}]})
    events.append({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, "finish_reason": "stop"}]})
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    capture = StreamCapture(CHAT)
    relayed = b"".join(capture.feed(raw[i : i + 997]) for i in range(0, len(raw), 997))
    assert relayed + capture.held == raw and capture.outcome() == ("ok", None)
    choice = capture.result()["choices"][0]
    assert choice["message"]["content"] == "".join(f"t{i} " for i in range(n))
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert [entry["logprob"] for entry in choice["logprobs"]["content"]] == [-i for i in range(n)]
    assert choice["token_ids"] == list(range(n)) and choice["finish_reason"] == "stop"


@pytest.mark.parametrize("separator", [b"\n\n", b"\r\n\r\n"])
def test_events_are_relayed_whole_however_the_reads_cut_them(separator: bytes) -> None:
    """Reads that end anywhere (a separator split between two, one byte at a time, an event
    over many reads, as a Responses answer's last event carrying the whole answer) relay the
    upstream's bytes unchanged, and the events are read whole."""
    text = "x" * 200_000
    events = [{"id": "c", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]} for i in range(50)]
    events.append({"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]})
    raw = b"".join(b"data: " + json.dumps(e).encode() + separator for e in events) + b"data: [DONE]" + separator
    chance = random.Random(7)
    for sizes in ([1] * 2000 + [997], [chance.randint(1, 40) for _ in range(400)] + [1024], [4096]):
        capture, relayed, at, i = StreamCapture(CHAT), b"", 0, 0
        while at < len(raw):
            size = sizes[min(i, len(sizes) - 1)]
            relayed += capture.feed(raw[at : at + size])
            at, i = at + size, i + 1
        assert relayed + capture.held == raw and capture.outcome() == ("ok", None)
        assert capture.result()["choices"][0]["message"]["content"] == "".join(f"t{i}" for i in range(50)) + text


def test_calls_of_a_trajectory_come_back_in_order(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/t/order/v1", api_key="k")
    for i in range(5):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"turn {i}"}])
    calls = gateway.trajectory("order")["calls"]
    assert [c["request"]["messages"][0]["content"] for c in calls] == [f"turn {i}" for i in range(5)]


def test_recording_off_still_proxies(make_gateway, upstream: Upstream) -> None:
    gw = make_gateway(record=False)
    r = httpx.post(gw.url + "/t/off/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert httpx.get(gw.url + "/v1/trajectories/off").status_code == 404


def test_behind_a_root_path_each_surface_still_answers_in_its_own_format(gateway: Gateway, upstream: Upstream) -> None:
    """Served under a root path (a reverse proxy that strips ``/api``), Litestar routes the
    proxy's calls; the surface, and so Anthropic's error format on /v1/messages, is known all
    the same."""
    from burnish_server.gateway.app import create_app
    from tests.servers import ServerThread

    with ServerThread(create_app(gateway.settings), root_path="/api") as server, httpx.Client(base_url=server.url, timeout=30) as c:
        refused = c.post("/v1/messages", content=b"not json", headers={"content-type": "application/json"})
        assert refused.status_code == 400 and refused.json()["type"] == "error", refused.text
        assert c.post("/v1/chat/completions", content=b"not json").json()["error"]["code"] == "invalid_json"
        served = c.post("/t/rooted/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
        assert served.status_code == 200 and served.headers["x-trajectory-id"] == "rooted"
