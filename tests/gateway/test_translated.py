"""Policy calls on the Responses API and Anthropic Messages, served through chat completions.

Against the deterministic upstream (tests/upstream.py), whose chat answer is a pure function
of the request: the official SDKs get the protocol they spoke (plain and streamed, their
stream helpers assemble the final answer), every call is recorded with the chat
completion's token ids, and bad input is refused in the surface's own error format.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Gateway
from tests.upstream import Upstream, choice_text, logprobs_for, prompt_ids, token_ids, words

TOOL = {"type": "function", "name": "search", "description": "look up", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
ANTHROPIC_TOOL = {"name": "search", "description": "look up", "input_schema": TOOL["parameters"]}


@pytest.fixture
def gw(gateway: Gateway) -> Gateway:
    gateway.create_policy("agent", base_model="tiny")
    return gateway


def openai_client(gw: Gateway, trajectory: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/t/{trajectory}/v1", api_key="x", max_retries=0)


def anthropic_client(gw: Gateway, trajectory: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{gw.url}/t/{trajectory}", api_key="x", max_retries=0)


def sent_upstream(upstream: Upstream) -> dict[str, Any]:
    """The last request the upstream got, checked to be a chat completion for the policy."""
    last = upstream.requests[-1]
    assert last["path"] == "/v1/chat/completions", last["path"]
    body = json.loads(last["body"])
    assert body["model"] == "agent@0" or body["model"] == "tiny", body["model"]
    assert body["return_token_ids"] is True and body["logprobs"] is True
    return body


def the_call(gw: Gateway, trajectory: str, index: int = -1) -> dict[str, Any]:
    return gw.trajectory(trajectory)["calls"][index]


def assert_token_exact(call: dict[str, Any], chat: dict[str, Any], text: str) -> None:
    """Recorded with the chat completion's tokens: prompt ids, sampled ids, their logprobs."""
    tokens = call["tokens"]
    assert tokens["prompt_token_ids"] == prompt_ids(chat)
    assert tokens["completion_token_ids"] == [token_ids(text)]
    assert tokens["completion_logprobs"] == [pytest.approx(logprobs_for(text))]


# ---- the Responses API ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_responses_text(gw: Gateway, upstream: Upstream, stream: bool) -> None:
    client = openai_client(gw, f"resp-{stream}")
    kwargs: dict[str, Any] = dict(model="agent", input="hello there", instructions="be brief", max_output_tokens=40)
    if stream:
        with client.responses.stream(**kwargs) as s:
            kinds = [event.type for event in s]
            response = s.get_final_response()
        assert kinds == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            *["response.output_text.delta"] * len(words(response.output_text)),  # the upstream streams a word per event
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    else:
        response = client.responses.create(**kwargs)
    chat = sent_upstream(upstream)
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    assert chat["max_tokens"] == 40
    text = choice_text(chat, 0)
    assert response.output_text == text
    assert response.status == "completed" and response.model == "agent" and response.id.startswith("resp_")
    assert response.usage is not None and response.usage.input_tokens == upstream.chat(chat)[0]["usage"]["prompt_tokens"]
    call = the_call(gw, f"resp-{stream}")
    assert call["endpoint"] == "responses" and call["status"] == "ok" and call["policy"] == "agent"
    assert call["response"]["id"] == response.id and call["response"]["output"][0]["content"][0]["text"] == text
    assert_token_exact(call, chat, text)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_responses_tool_round_trip(gw: Gateway, upstream: Upstream, stream: bool) -> None:
    """A function tool is called; its output goes back with previous_response_id, which the
    gateway resolves from what it recorded."""
    client = openai_client(gw, f"tools-{stream}")
    if stream:
        with client.responses.stream(model="agent", input="find cats", tools=[TOOL]) as s:
            first = s.get_final_response()
    else:
        first = client.responses.create(model="agent", input="find cats", tools=[TOOL])
    (call,) = [item for item in first.output if item.type == "function_call"]
    chat = sent_upstream(upstream)
    assert chat["tools"] == [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}]
    assert call.name == "search" and json.loads(call.arguments) == {"query": choice_text(chat, 0)}

    second = client.responses.create(
        model="agent",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "three cats"}],
        tools=[TOOL],
        tool_choice="none",
    )
    chat2 = sent_upstream(upstream)
    assert chat2["messages"] == [
        {"role": "user", "content": "find cats"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call.call_id, "type": "function", "function": {"name": "search", "arguments": call.arguments}}],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "three cats"},
    ]
    assert chat2["tool_choice"] == "none"
    assert second.previous_response_id == first.id
    recorded = the_call(gw, f"tools-{stream}")
    # Recorded with the whole conversation the model saw.
    assert [item["type"] for item in recorded["request"]["input"]] == ["message", "function_call", "function_call_output"]
    assert recorded["request"]["previous_response_id"] == first.id


def test_responses_unknown_previous_response(gw: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client(gw, "prev").responses.create(model="agent", input="hi", previous_response_id="resp_nope")
    assert refused.value.code == "previous_response_not_found"
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_responses_store_false_is_not_continued(gw: Gateway) -> None:
    client = openai_client(gw, "nostore")
    first = client.responses.create(model="agent", input="hi", store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="agent", input="again", previous_response_id=first.id)
    assert gw.trajectory("nostore")["call_count"] == 1  # recorded all the same


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"model": "agent", "input": "hi", "tools": [TOOL], "tool_choice": {"type": "web_search"}}, "unsupported"),
        ({"model": "agent", "input": "hi", "tools": [{"type": "namespace", "name": "ns"}]}, "invalid_request"),
        ({"model": "agent", "input": [{"type": "item_reference", "id": "x"}]}, "unsupported"),
        ({"model": "agent", "input": 5}, "invalid_request"),
        ({"model": "agent", "input": []}, "invalid_request"),
        ({"model": "agent", "input": [{"type": "message", "role": "narrator", "content": "x"}]}, "invalid_request"),
        ({"model": "agent", "input": "hi", "text": {"format": {"type": "yaml"}}}, "unsupported"),
    ],
)
def test_responses_bad_input(gw: Gateway, upstream: Upstream, body: dict[str, Any], code: str) -> None:
    sent = len(upstream.requests)
    r = httpx.post(f"{gw.url}/t/bad/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers["x-trajectory-id"] == "bad"
    assert len(upstream.requests) == sent  # refused before anything went upstream


def test_responses_upstream_error(gw: Gateway) -> None:
    r = httpx.post(f"{gw.url}/t/upstream-err/v1/responses", json={"model": "agent", "input": "hi"}, headers={"x-fault": "status:500"})
    assert r.status_code == 500 and r.json()["error"]["message"] == "fault 500"
    assert the_call(gw, "upstream-err")["status"] == "upstream_error"


# ---- Anthropic Messages ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_messages_text(gw: Gateway, upstream: Upstream, stream: bool) -> None:
    client = anthropic_client(gw, f"msg-{stream}")
    kwargs: dict[str, Any] = dict(model="agent", max_tokens=50, system="be brief", messages=[{"role": "user", "content": "hi claude"}])
    if stream:
        with client.messages.stream(**kwargs) as s:
            kinds = [event.type for event in s]
            message = s.get_final_message()
        # The SDK adds "text" events of its own beside each content_block_delta.
        assert [k for k in kinds if k != "text"] == [
            "message_start",
            "content_block_start",
            *["content_block_delta"] * len(words(message.content[0].text)),  # type: ignore[union-attr]
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    else:
        message = client.messages.create(**kwargs)
    chat = sent_upstream(upstream)
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi claude"}]
    assert chat["max_tokens"] == 50
    text = choice_text(chat, 0)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == text  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.model == "agent"
    assert message.usage.input_tokens == upstream.chat(chat)[0]["usage"]["prompt_tokens"]
    call = the_call(gw, f"msg-{stream}")
    assert call["endpoint"] == "messages" and call["status"] == "ok"
    assert call["response"]["content"] == [{"type": "text", "text": text}]
    assert_token_exact(call, chat, text)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_messages_tool_use_and_result(gw: Gateway, upstream: Upstream, stream: bool) -> None:
    client = anthropic_client(gw, f"mtools-{stream}")
    question = {"role": "user", "content": "find cats"}
    if stream:
        with client.messages.stream(model="agent", max_tokens=50, messages=[question], tools=[ANTHROPIC_TOOL]) as s:
            first = s.get_final_message()
    else:
        first = client.messages.create(model="agent", max_tokens=50, messages=[question], tools=[ANTHROPIC_TOOL])
    chat = sent_upstream(upstream)
    assert chat["tools"] == [{"type": "function", "function": {"name": "search", "parameters": TOOL["parameters"], "description": "look up"}}]
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "search" and use.input == {"query": choice_text(chat, 0)}
    assert first.stop_reason == "tool_use"

    client.messages.create(
        model="agent",
        max_tokens=50,
        tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "none"},
        messages=[
            question,
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "let me look"}, {"type": "tool_use", "id": use.id, "name": "search", "input": use.input}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "three cats"}, {"type": "text", "text": "and?"}]},
        ],
    )
    chat2 = sent_upstream(upstream)
    assert chat2["messages"] == [
        {"role": "user", "content": "find cats"},
        {
            "role": "assistant",
            "content": "let me look",
            "tool_calls": [{"id": use.id, "type": "function", "function": {"name": "search", "arguments": json.dumps(use.input, separators=(",", ":"))}}],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "three cats"},
        {"role": "user", "content": "and?"},
    ]
    assert chat2["tool_choice"] == "none"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "agent", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": "agent", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "agent", "max_tokens": 5, "messages": [{"role": "narrator", "content": "x"}]}, "role"),
        ({"model": "agent", "max_tokens": "many", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (
            {"model": "agent", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "w"}]},
            "tools",
        ),
        ({"model": "agent", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
    ],
)
def test_messages_bad_input_in_anthropic_format(gw: Gateway, upstream: Upstream, body: dict[str, Any], fragment: str) -> None:
    sent = len(upstream.requests)
    r = httpx.post(f"{gw.url}/t/mbad/v1/messages", json=body)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert fragment in error["error"]["message"]
    assert len(upstream.requests) == sent


def test_messages_errors_reach_the_sdk(gw: Gateway) -> None:
    client = anthropic_client(gw, "sdk-err")
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="agent", max_tokens=5, messages=[])
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    r = httpx.post(f"{gw.url}/t/sdk-err/v1/messages", content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.post(
        f"{gw.url}/t/sdk-err/v1/messages",
        json={"model": "agent", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        headers={"x-fault": "status:503"},
    )
    assert r.status_code == 503 and r.json() == {"type": "error", "error": {"type": "api_error", "message": "fault 503"}}


def test_messages_stream_cut_is_recorded(gw: Gateway) -> None:
    body = {"model": "agent", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "one two three four five"}]}
    with httpx.stream("POST", f"{gw.url}/t/mcut/v1/messages", json=body, headers={"x-fault": "cut:3"}) as r:
        text = r.read().decode()
    assert "message_stop" not in text and "event: error" in text
    call = the_call(gw, "mcut")
    assert call["status"] == "upstream_cut"
    assert call["response"]["content"][0]["type"] == "text"  # what arrived


def test_non_policy_models_still_pass_through(gw: Gateway, upstream: Upstream) -> None:
    """model "tiny" is no policy: its Messages call goes to the upstream's own /v1/messages."""
    anthropic_client(gw, "pass").messages.create(model="tiny", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert upstream.requests[-1]["path"] == "/v1/messages"
    openai_client(gw, "pass").responses.create(model="tiny", input="hi")
    assert upstream.requests[-1]["path"] == "/v1/responses"


# ---- hostile input --------------------------------------------------------------------------

VALID = {
    "responses": {"model": "agent", "input": [{"type": "message", "role": "user", "content": "hi"}], "tools": [TOOL], "max_output_tokens": 5},
    "messages": {
        "model": "agent",
        "max_tokens": 5,
        "system": "s",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [ANTHROPIC_TOOL],
    },
}


def _junk(rng: Any, depth: int = 0) -> Any:
    kinds = ["null", "int", "float", "str", "bool"] + (["list", "dict"] if depth < 3 else [])
    match rng.choice(kinds):
        case "null":
            return None
        case "int":
            return rng.choice([0, -1, 2**63, -(2**70), 7])
        case "float":
            return rng.choice([0.5, -1e308, 1e308])
        case "str":
            return rng.choice(["", "x" * 300, "\u0000", "message", "function_call", "tool_use", "user", "\ud7ff"])
        case "bool":
            return rng.choice([True, False])
        case "list":
            return [_junk(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["type", "role", "content", "name", "input", "text", "call_id", "id"]): _junk(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _mutate(rng: Any, value: Any, depth: int = 0) -> Any:
    """The value with one randomly chosen place inside it replaced by junk."""
    if depth > 0 and rng.random() < 0.3 or not isinstance(value, dict | list) or not value:
        return _junk(rng)
    if isinstance(value, dict):
        key = rng.choice(list(value))
        return {**value, key: _mutate(rng, value[key], depth + 1)}
    i = rng.randrange(len(value))
    return [*value[:i], _mutate(rng, value[i], depth + 1), *value[i + 1 :]]


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_hostile_bodies_get_the_surfaces_errors_never_a_500(gw: Gateway, surface: str) -> None:
    import random

    rng = random.Random(14)
    with gw.client() as c:
        for _ in range(150):
            body = _mutate(rng, VALID[surface])
            if isinstance(body, dict):
                body["model"] = "agent"  # keep it a policy call: the translated path is what is fuzzed
            r = c.post(f"/t/fuzz-{surface}/v1/{surface}", json=body)
            assert r.status_code in (200, 400), (body, r.status_code, r.text)
            if r.status_code == 400:
                error = r.json()
                if surface == "messages":
                    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
                else:
                    assert error["error"]["type"] == "invalid_request_error", error
    # What was accepted was answered and recorded; what was refused left no trace.
    assert all(call["status"] == "ok" for call in gw.trajectory(f"fuzz-{surface}")["calls"])


# ---- what the coding CLIs send (docs/coding-agents.md) --------------------------------------

NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for sub-agents.",
    "tools": [{"type": "function", "name": "close_agent", "description": "close one", "strict": False, "parameters": TOOL["parameters"]}],
}
# The Codex CLI's request, as 0.169.0 sends it, less its long instructions and most tools.
CODEX_BODY: dict[str, Any] = {
    "model": "agent",
    "stream": True,
    "input": [
        {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
        {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]},
    ],
    "tools": [NAMESPACE, {"type": "web_search", "external_web_access": False}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a2",
    "client_metadata": {"session_id": "01a2"},
}


def test_codex_request_namespaces_and_hosted_tools(gw: Gateway, upstream: Upstream) -> None:
    """A namespace's functions are offered under their flat names and answered under the
    client's; the hosted web_search is left out, said in a header and on the recorded call."""
    r = httpx.post(f"{gw.url}/t/codex/v1/responses", json=CODEX_BODY, headers={"session-id": "01a2"})
    assert r.status_code == 200, r.text
    assert r.headers["x-burnish-omitted-tools"] == "web_search"
    chat = sent_upstream(upstream)
    assert [t["function"]["name"] for t in chat["tools"]] == ["multi_agent_v1__close_agent"]
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    final = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")][-1]["response"]
    (call,) = final["output"]
    assert (call["type"], call["name"], call["namespace"]) == ("function_call", "close_agent", "multi_agent_v1")
    recorded = the_call(gw, "codex")
    assert recorded["adjustments"] == {"omitted_tools": ["web_search"]}
    assert recorded["tokens"]["prompt_token_ids"] == prompt_ids(chat)

    # The next turn sends the call back with its namespace: the model sees the name it wrote.
    turn = {**CODEX_BODY, "input": [*CODEX_BODY["input"], call, {"type": "function_call_output", "call_id": call["call_id"], "output": "closed"}]}
    assert httpx.post(f"{gw.url}/t/codex/v1/responses", json=turn).status_code == 200
    assert sent_upstream(upstream)["messages"][2]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"


def test_a_policy_can_refuse_hosted_tools(gw: Gateway) -> None:
    with gw.admin() as admin:
        assert admin.patch("/admin/policies/agent", json={"serving": {"hosted_tools": "refuse"}}).json()["serving"] == {
            "hosted_tools": "refuse",
            "max_tokens": None,
        }
    r = httpx.post(f"{gw.url}/t/refused/v1/responses", json=CODEX_BODY)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1]" and "web_search" in r.json()["error"]["message"]


# Claude Code 2.1.328's request, as it sends it, less its long system prompt and most tools.
CLAUDE_CODE_BODY: dict[str, Any] = {
    "model": "agent",
    "max_tokens": 64,
    "stream": True,
    "system": [{"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "List the files"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /work", "cache_control": {"type": "ephemeral"}}]},
    ],
    "tools": [
        {"name": "Bash", "description": "run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
        {"name": "ToolSearch", "description": "load deferred tools", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}},
        {"name": "NotebookEdit", "description": "edit a notebook", "input_schema": {"type": "object"}, "defer_loading": True},
        {"type": "web_search_20250305", "name": "web_search"},
    ],
    "metadata": {"user_id": '{"session_id":"4b8b"}'},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}
CLAUDE_CODE_HEADERS = {"anthropic-beta": "claude-code-20250219,mid-conversation-tool-changes-2026-07-01", "anthropic-version": "2023-06-01"}


def test_claude_code_request_system_anywhere_and_deferred_tools(gw: Gateway, upstream: Upstream) -> None:
    """A system message after the first turn stays where it is; a deferred tool is offered
    once a tool_reference loads it, and the reference reads as the tool's definition."""
    r = httpx.post(f"{gw.url}/t/claude/v1/messages?beta=true", json=CLAUDE_CODE_BODY, headers=CLAUDE_CODE_HEADERS)
    assert r.status_code == 200, r.text
    assert r.headers["x-burnish-omitted-tools"] == "web_search_20250305"
    chat = sent_upstream(upstream)
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [
        ("system", "You are a Claude agent."),
        ("user", "List the files"),
        ("system", "# Environment\ncwd: /work"),
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["Bash", "ToolSearch"]

    search = {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "select:NotebookEdit"}}
    loaded = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_reference", "tool_name": "NotebookEdit"}]}
    turn = {**CLAUDE_CODE_BODY, "messages": [*CLAUDE_CODE_BODY["messages"], {"role": "assistant", "content": [search]}, {"role": "user", "content": [loaded]}]}
    assert httpx.post(f"{gw.url}/t/claude/v1/messages?beta=true", json=turn, headers=CLAUDE_CODE_HEADERS).status_code == 200
    chat = sent_upstream(upstream)
    assert [t["function"]["name"] for t in chat["tools"]] == ["Bash", "ToolSearch", "NotebookEdit"]
    definition = {"description": "edit a notebook", "name": "NotebookEdit", "parameters": {"type": "object"}}
    assert chat["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": f"<functions>\n<function>{json.dumps(definition, separators=(',', ':'))}</function>\n</functions>",
    }
    assert [c["adjustments"] for c in gw.trajectory("claude")["calls"]] == [{"omitted_tools": ["web_search_20250305"]}] * 2


def test_a_cli_session_is_one_trajectory_unless_a_key_is_given(gw: Gateway) -> None:
    body = {"model": "agent", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        r = httpx.post(f"{gw.url}/v1/messages", json=body, headers={"x-claude-code-session-id": "sess-1"})
        assert r.headers["x-trajectory-id"] == "sess-1"
    assert len(gw.trajectory("sess-1")["calls"]) == 2
    # A trajectory header or a path prefix still wins; a session id off the ids' rule is no key.
    assert httpx.post(f"{gw.url}/v1/messages", json=body, headers={"session-id": "sess-1", "x-trajectory-id": "mine"}).headers["x-trajectory-id"] == "mine"
    assert httpx.post(f"{gw.url}/t/path/v1/messages", json=body, headers={"session-id": "sess-1"}).headers["x-trajectory-id"] == "path"
    r = httpx.post(f"{gw.url}/v1/messages", json=body, headers={"session-id": "not an id!"})
    assert r.status_code == 200 and r.headers["x-trajectory-id"].startswith("t-")


def test_a_policy_budget_for_calls_that_ask_none(gw: Gateway, upstream: Upstream) -> None:
    """The Codex CLI asks no budget of any call: the policy's serving.max_tokens is sent, and said."""
    with gw.admin() as admin:
        assert admin.patch("/admin/policies/agent", json={"serving": {"max_tokens": 300}}).status_code == 200
    assert httpx.post(f"{gw.url}/t/budget/v1/responses", json=CODEX_BODY).status_code == 200
    assert sent_upstream(upstream)["max_tokens"] == 300
    assert httpx.post(f"{gw.url}/t/budget/v1/responses", json={**CODEX_BODY, "max_output_tokens": 20}).status_code == 200
    assert sent_upstream(upstream)["max_tokens"] == 20  # a budget asked for is the client's
    assert [c["adjustments"] for c in gw.trajectory("budget")["calls"]] == [
        {"omitted_tools": ["web_search"], "max_tokens_sent": 300},
        {"omitted_tools": ["web_search"]},
    ]
