"""One reading of any recorded call (core/protocols/transcript.py): the four protocols as one chat conversation."""

from __future__ import annotations

from burnish_server.core.protocols.transcript import Message, UnreadableCall, conversation, exchange
from burnish_server.core.protocols.wire import tool_call
from tests.records import call, chat_call

WEATHER = {"type": "function", "function": {"name": "weather", "description": "", "parameters": {"type": "object"}}}


def test_chat_keeps_messages_tools_and_every_choice() -> None:
    request = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        ],
        "tools": [WEATHER],
    }
    response = {
        "choices": [
            {"index": 1, "message": {"role": "assistant", "content": "b"}},
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
                },
            },
        ]
    }
    turn = exchange(chat_call(request, response))
    assert turn.prompt == [Message("system", "be brief"), Message("user", "hi\n[image_url]")]
    assert turn.tools == [WEATHER]
    assert turn.answers == [Message("assistant", "", (tool_call("weather", "{}", "c"),)), Message("assistant", "b")]
    assert turn.answers[0].chat()["tool_calls"][0]["function"] == {"name": "weather", "arguments": {}}


def test_completions_read_the_prompt_and_each_text() -> None:
    turn = exchange(call("completions", {"prompt": "2+2="}, {"choices": [{"index": 0, "text": "4"}]}))
    assert (turn.prompt, turn.answers, turn.tools) == ([Message("user", "2+2=")], [Message("assistant", "4")], None)


def test_responses_api_instructions_function_calls_and_outputs() -> None:
    request = {
        "instructions": "You add.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "1+2?"}]},
            {"type": "function_call", "name": "add", "arguments": '{"a": 1, "b": 2}', "call_id": "k1"},
            {"type": "function_call_output", "call_id": "k1", "output": "3"},
        ],
        "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}],
    }
    response = {"output": [{"type": "reasoning", "summary": []}, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "3"}]}]}
    turn = exchange(call("responses", request, response))
    assert turn.prompt == [
        Message("system", "You add."),
        Message("user", "1+2?"),
        Message("assistant", "", (tool_call("add", '{"a": 1, "b": 2}', "k1"),)),
        Message("tool", "3", (), "k1"),
    ]
    assert turn.tools == [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    assert turn.answers == [Message("assistant", "3")]
    plain = exchange(call("responses", {"input": "hello"}, {"output": [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "z"}]}))
    assert plain.prompt == [Message("user", "hello")] and plain.answers == [Message("assistant", "", (tool_call("f", "{}", "z"),))]


def test_anthropic_messages_system_tool_use_and_tool_results() -> None:
    request = {
        "system": [{"type": "text", "text": "You add."}],
        "messages": [
            {"role": "user", "content": "1+2?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Adding."}, {"type": "tool_use", "id": "u1", "name": "add", "input": {"a": 1}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "u1", "content": [{"type": "text", "text": "3"}]}, {"type": "text", "text": "so?"}],
            },
        ],
        "tools": [{"name": "add", "description": "adds", "input_schema": {"type": "object"}}],
    }
    response = {"role": "assistant", "content": [{"type": "thinking", "thinking": "easy"}, {"type": "text", "text": "3"}]}
    turn = exchange(call("messages", request, response))
    assert turn.prompt == [
        Message("system", "You add."),
        Message("user", "1+2?"),
        Message("assistant", "Adding.", (tool_call("add", '{"a":1}', "u1"),)),
        Message("tool", "3", (), "u1"),
        Message("user", "so?"),
    ]
    assert turn.tools == [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {"type": "object"}}}]
    assert turn.answers == [Message("assistant", "3")]


def test_a_body_that_is_not_its_endpoints_shape_is_unreadable_not_guessed() -> None:
    bad = chat_call({"messages": "not a list"}, None)
    try:
        exchange(bad)
    except UnreadableCall:
        pass
    else:
        raise AssertionError("read a chat call whose messages are a string")
    assert conversation([bad]) == [Message("system", "[a chat.completions call that could not be read]")]
