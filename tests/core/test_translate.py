"""core/protocols/translate: chat completion chunks to Responses and Messages events, field by field.

Pure functions of their input, so the whole event sequence is written out here. The same
sequences go through the gateway to the official SDKs in tests/gateway/test_translated.py.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.translate import messages, responses

CHUNKS: list[dict[str, Any]] = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2, 3]},
    {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}},
]
COMPLETION = {
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hello",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12},
    "prompt_token_ids": [1, 2, 3],
}


def parse(raw: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for event in raw:
        head, data = event.decode().removesuffix("\n\n").split("\n")
        out.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def feed(translator: Any, chunk: dict[str, Any]) -> list[bytes]:
    """A chunk as the gateway feeds it to a translator: read as a chat completion chunk."""
    return translator.feed(msgspec.convert(chunk, answers.ChatChunk))


def run(translator: Any) -> list[tuple[str, dict[str, Any]]]:
    raw = [e for chunk in CHUNKS for e in feed(translator, chunk)]
    closing, terminal = translator.finish()
    return parse([*raw, *closing, terminal])


# ---- the Responses API ----------------------------------------------------------------------


def responses_translator() -> responses.ResponsesTranslator:
    request = wire.ResponsesCreate(model="agent", input="hi", tools=[{"type": "function", "name": "f", "parameters": {}}])
    return responses.ResponsesTranslator(request, response_id="resp_x", created_at=7, model="agent")


def test_responses_events_field_by_field() -> None:
    events = run(responses_translator())
    assert [kind for kind, _ in events] == [data["type"] for _, data in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    body = [(kind, {k: v for k, v in data.items() if k not in ("type", "sequence_number")}) for kind, data in events]
    text_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    message = {"id": "msg_x_0", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    call = {"id": "fc_x_1", "type": "function_call", "status": "in_progress", "call_id": "call_1", "name": "f", "arguments": ""}
    done_message = {**message, "status": "completed", "content": [{**text_part, "text": "Hello"}]}
    done_call = {**call, "status": "completed", "arguments": '{"a": 1}'}
    assert body[0][0] == "response.created" and body[0][1]["response"]["status"] == "in_progress"
    assert body[0][1]["response"]["output"] == [] and body[0][1]["response"]["id"] == "resp_x"
    assert body[1][0] == "response.in_progress"
    assert body[2:-1] == [
        ("response.output_item.added", {"output_index": 0, "item": message}),
        ("response.content_part.added", {"item_id": "msg_x_0", "output_index": 0, "content_index": 0, "part": text_part}),
        ("response.output_text.delta", {"item_id": "msg_x_0", "output_index": 0, "content_index": 0, "delta": "Hel", "logprobs": []}),
        ("response.output_text.delta", {"item_id": "msg_x_0", "output_index": 0, "content_index": 0, "delta": "lo", "logprobs": []}),
        ("response.output_text.done", {"item_id": "msg_x_0", "output_index": 0, "content_index": 0, "text": "Hello", "logprobs": []}),
        ("response.content_part.done", {"item_id": "msg_x_0", "output_index": 0, "content_index": 0, "part": {**text_part, "text": "Hello"}}),
        ("response.output_item.done", {"output_index": 0, "item": done_message}),
        ("response.output_item.added", {"output_index": 1, "item": call}),
        ("response.function_call_arguments.delta", {"item_id": "fc_x_1", "output_index": 1, "delta": '{"a":'}),
        ("response.function_call_arguments.delta", {"item_id": "fc_x_1", "output_index": 1, "delta": " 1}"}),
        ("response.function_call_arguments.done", {"item_id": "fc_x_1", "output_index": 1, "arguments": '{"a": 1}', "name": "f"}),
        ("response.output_item.done", {"output_index": 1, "item": done_call}),
    ]
    kind, final = body[-1]
    assert kind == "response.completed"
    response = final["response"]
    assert response["status"] == "completed" and response["output"] == [done_message, done_call]
    assert response["usage"] == {
        "input_tokens": 3,
        "output_tokens": 9,
        "total_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    assert (response["object"], response["model"], response["created_at"], response["tool_choice"]) == ("response", "agent", 7, "auto")


def test_a_plain_answer_is_the_stream_added_up() -> None:
    streamed = responses_translator()
    run(streamed)
    assert msgspec.to_builtins(responses_translator().answer(COMPLETION)) == msgspec.to_builtins(streamed.result())


def test_responses_cut_by_length_is_incomplete() -> None:
    translator = responses_translator()
    feed(translator, {"choices": [{"index": 0, "delta": {"content": "abc"}, "finish_reason": "length"}]})
    closing, terminal = translator.finish()
    kind, data = parse([terminal])[0]
    assert kind == "response.incomplete" and data["response"]["status"] == "incomplete"
    assert data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["response"]["output"][0]["status"] == "incomplete"


def test_responses_reasoning_becomes_a_reasoning_item() -> None:
    translator = responses_translator()
    answer = translator.answer({"choices": [{"index": 0, "message": {"content": "4", "reasoning_content": "2+2"}, "finish_reason": "stop"}]})
    assert [item.type for item in answer.output] == ["reasoning", "message"]
    assert msgspec.to_builtins(answer.output[0])["content"] == [{"type": "reasoning_text", "text": "2+2"}]


def test_responses_request_to_chat() -> None:
    items = [
        {"type": "message", "role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": "data:x"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
    ]
    request = msgspec.convert(
        {
            "model": "agent",
            "instructions": "be kind",
            "input": items,
            "max_output_tokens": 9,
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}},
            "stream": True,
        },
        wire.ResponsesCreate,
    )
    assert responses.chat_request(request) == {
        "messages": [
            {"role": "system", "content": "be kind"},
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:x"}}]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "max_tokens": 9,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": True}},
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# ---- Anthropic Messages ---------------------------------------------------------------------


def messages_translator() -> messages.MessagesTranslator:
    request = wire.MessagesCreate(model="agent", max_tokens=20, messages=[wire.AnthropicMessage("user", "hi")])
    return messages.MessagesTranslator(request, message_id="msg_x", model="agent")


def test_messages_events_field_by_field() -> None:
    events = run(messages_translator())
    assert [kind for kind, _ in events] == [data["type"] for _, data in events]
    usage = {"input_tokens": 3, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    start = {"id": "msg_x", "type": "message", "role": "assistant", "model": "agent", "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    assert events == [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}}),
        # The arguments whole, as the object the answer holds, when the block closes.
        ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a":1}'}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"input_tokens": 3, "output_tokens": 9}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_messages_tool_arguments_that_are_no_object_stream_as_the_answer_holds_them() -> None:
    translator = messages_translator()
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "121E"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "67"}}]}, "finish_reason": "tool_calls"}]},
    ]
    raw = [e for chunk in chunks for e in feed(translator, chunk)]
    closing, _ = translator.finish()
    deltas = [data["delta"] for kind, data in parse(raw + closing) if kind == "content_block_delta"]
    assert deltas == [{"type": "input_json_delta", "partial_json": '{"_raw":"121E67"}'}]
    assert msgspec.to_builtins(translator.result())["content"][0]["input"] == {"_raw": "121E67"}


def test_messages_plain_answer_is_the_stream_added_up() -> None:
    streamed = messages_translator()
    run(streamed)
    plain = messages_translator().answer(COMPLETION)
    assert msgspec.to_builtins(plain) == msgspec.to_builtins(streamed.result())
    assert msgspec.to_builtins(plain)["content"] == [{"type": "text", "text": "Hello"}, {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}]


def test_messages_stop_reasons() -> None:
    request = wire.MessagesCreate(model="agent", max_tokens=5, stop_sequences=["END"], messages=[wire.AnthropicMessage("user", "hi")])

    def reason(choice: dict[str, Any]) -> tuple[str | None, str | None]:
        answer = messages.MessagesTranslator(request, message_id="m", model="agent").answer({"choices": [{"index": 0, "message": {"content": "x"}, **choice}]})
        return answer.stop_reason, answer.stop_sequence

    assert reason({"finish_reason": "stop"}) == ("end_turn", None)
    assert reason({"finish_reason": "stop", "stop_reason": "END"}) == ("stop_sequence", "END")
    assert reason({"finish_reason": "length"}) == ("max_tokens", None)


def test_messages_request_to_chat() -> None:
    body = {
        "model": "agent",
        "max_tokens": 30,
        "system": [{"type": "text", "text": "be kind"}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "see"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm"},
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "bad"}], "is_error": True}]},
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "top_k": 5,
        "metadata": {"user_id": "u1"},
    }
    assert messages.chat_request(msgspec.convert(body, wire.MessagesCreate)) == {
        "messages": [
            {"role": "system", "content": "be kind"},
            {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
            {"role": "assistant", "content": "ok", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "Error: bad"},
        ],
        "max_tokens": 30,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stop": ["END"],
        "top_k": 5,
        "user": "u1",
    }


# ---- long answers -----------------------------------------------------------------------------


def long_stream(pieces: int) -> list[dict[str, Any]]:
    """Reasoning, then text, then a tool call's arguments, each in many small pieces."""
    chunks = [{"choices": [{"index": 0, "delta": {"reasoning_content": f"r{i} "}}]} for i in range(pieces)]
    chunks += [{"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]} for i in range(pieces)]
    chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "["}}]}}]})
    chunks += [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": f"{i},"}}]}}]} for i in range(pieces)]
    chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "0]"}}]}, "finish_reason": "tool_calls"}]})
    return chunks


def test_a_long_answer_adds_up_piece_by_piece() -> None:
    """The translators write text and arguments in pieces (core/protocols/translate/common.py: StreamedFields):
    what the done events, a result taken mid-stream and the final answer say is all of it."""
    n = 3000
    reasoning, text = "".join(f"r{i} " for i in range(n)), "".join(f"t{i} " for i in range(n))
    arguments = "[" + "".join(f"{i}," for i in range(n)) + "0]"
    chunks = long_stream(n)

    translator = responses_translator()
    events = [e for chunk in chunks[: 2 * n] for e in feed(translator, chunk)]
    midway = msgspec.to_builtins(translator.result())["output"]  # a stream cut here is recorded with this
    assert [item["content"][0]["text"] for item in midway] == [reasoning, text]
    events += [e for chunk in chunks[2 * n :] for e in feed(translator, chunk)]
    closing, terminal = translator.finish()
    done = {kind: data for kind, data in parse([*events, *closing])}
    assert done["response.reasoning_text.done"]["text"] == reasoning and done["response.output_text.done"]["text"] == text
    assert done["response.function_call_arguments.done"]["arguments"] == arguments
    final = parse([terminal])[0][1]["response"]["output"]
    assert (final[0]["content"][0]["text"], final[1]["content"][0]["text"], final[2]["arguments"]) == (reasoning, text, arguments)

    translator = messages_translator()
    for chunk in chunks:
        feed(translator, chunk)
    translator.finish()
    blocks = msgspec.to_builtins(translator.result())["content"]
    assert (blocks[0]["thinking"], blocks[1]["text"], blocks[2]["input"]) == (reasoning, text, {"_raw": arguments})


def test_the_readers_see_what_the_model_was_shown() -> None:
    """A coding CLI's request read back (the transcript, the teacher's render check) gives the
    conversation and tools the translator sent vLLM: flat namespace names, no hosted tools, a
    deferred tool once loaded, a tool_reference as the definition it loads."""
    from burnish_server.core.protocols.transcript import read_bodies
    from tests.gateway.test_translated import CLAUDE_CODE_BODY, CODEX_BODY

    search = {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "select:NotebookEdit"}}
    loaded = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_reference", "tool_name": "NotebookEdit"}], "is_error": True}
    claude = {
        **CLAUDE_CODE_BODY,
        "messages": [*CLAUDE_CODE_BODY["messages"], {"role": "assistant", "content": [search]}, {"role": "user", "content": [loaded]}],
    }
    call = {"type": "function_call", "call_id": "c1", "name": "close_agent", "namespace": "multi_agent_v1", "arguments": "{}"}
    codex = {**CODEX_BODY, "input": [*CODEX_BODY["input"], call, {"type": "function_call_output", "call_id": "c1", "output": "closed"}]}
    for endpoint, body, module, wire_type in (("messages", claude, messages, wire.MessagesCreate), ("responses", codex, responses, wire.ResponsesCreate)):
        sent = module.chat_request(msgspec.convert(body, wire_type))
        read = read_bodies(endpoint, json.dumps(body).encode(), None)
        assert [t["function"]["name"] for t in read.tools or ()] == [t["function"]["name"] for t in sent["tools"]]
        assert [(m.role, m.content, [c.function.name for c in m.tool_calls]) for m in read.prompt] == [
            (m["role"], m["content"], [c["function"]["name"] for c in m.get("tool_calls", ())]) for m in sent["messages"]
        ]
