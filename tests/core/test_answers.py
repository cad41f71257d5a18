"""An upstream's answer of any shape: read, or refused as the upstream's malformed answer.

core/protocols/answers.py types what the gateway reads in an answer; capture converts each stream
event (and a plain answer's token fields, and the chat completion a translator reads)
before reading it. Here every surface's capture, the token extraction and both translators
are fed JSON of every shape hypothesis can make, shaped like the real events so that the
values it puts in the fields the gateway reads are of every type. Nothing may raise: a wrong
shape is a recorded upstream error. And the other side of the rule: an error in the
gateway's own code is not taken for the upstream's, it surfaces.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.records import OK, UPSTREAM_ERROR
from burnish_server.core.protocols.surfaces import CHAT, COMPLETIONS, MESSAGES, RESPONSES, SURFACES, Surface
from burnish_server.core.protocols.translate import messages, responses
from burnish_server.gateway.proxy.call import read_answer
from burnish_server.gateway.proxy.capture import StreamCapture, extract_tokens

_encode = msgspec.json.encode

scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)


def shaped(keys: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with some of ``keys``, each either its strategy (a plausible value) or any JSON."""
    return st.fixed_dictionaries({}, optional={k: v | json_values for k, v in keys.items()})


index = st.integers(-2, 12_000)
text = st.text(max_size=6)
ids = st.lists(st.integers(-5, 2**32), max_size=4)
function = shaped({"name": text, "arguments": text})
tool_call = shaped({"index": index, "id": text, "type": text, "function": function})
chat_logprobs = shaped({"content": st.lists(shaped({"logprob": st.floats(-50, 1), "token": text}), max_size=3), "refusal": json_values})
chat_choice = shaped(
    {
        "index": index,
        "delta": shaped({"role": text, "content": text, "reasoning_content": text, "tool_calls": st.lists(tool_call, max_size=2)}),
        "message": shaped({"content": text, "tool_calls": st.lists(tool_call, max_size=2)}),
        "finish_reason": text,
        "stop_reason": text | st.integers(),
        "logprobs": chat_logprobs,
        "token_ids": ids,
    }
)
usage = shaped({"prompt_tokens": st.integers(), "completion_tokens": st.integers(), "prompt_tokens_details": shaped({"cached_tokens": st.integers()})})
chat_chunk = shaped({"id": text, "choices": st.lists(chat_choice, max_size=2), "usage": usage, "prompt_token_ids": ids})
completion_choice = shaped(
    {
        "index": index,
        "text": text,
        "token_ids": ids,
        "prompt_token_ids": ids,
        "logprobs": shaped({"tokens": st.lists(text), "token_logprobs": st.lists(st.floats(-50, 0) | st.none(), max_size=3)}),
    }
)
completion_chunk = shaped({"id": text, "choices": st.lists(completion_choice, max_size=2), "usage": usage})
responses_event = shaped(
    {
        "type": st.sampled_from(["response.created", "response.output_text.delta", "response.completed", "response.failed"]),
        "response": json_values,
        "delta": text,
    }
)
block = shaped({"type": st.sampled_from(["text", "thinking", "tool_use"]), "text": text, "thinking": text})
content_delta = shaped({"type": st.sampled_from(["text_delta", "thinking_delta", "signature_delta", "input_json_delta", "citations_delta"]), "text": text})
messages_event = shaped(
    {
        "type": st.sampled_from(["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]),
        "index": index,
        "message": shaped({"usage": usage, "id": text}),
        "content_block": block,
        "delta": content_delta | shaped({"stop_reason": text}),
        "usage": usage,
    }
)
EVENTS = {CHAT.name: chat_chunk, COMPLETIONS.name: completion_chunk, RESPONSES.name: responses_event, MESSAGES.name: messages_event}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def stream_of(events: list[Any], surface: Surface) -> bytes:
    out = b"".join(b"data: " + _encode(e) + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if surface.has_choices else b"")


@pytest.mark.parametrize("surface", SURFACES, ids=lambda s: s.name)
def test_a_stream_of_any_shape_is_folded_or_refused_as_the_upstreams(surface: Surface) -> None:
    @FUZZ
    @given(st.lists(EVENTS[surface.name] | json_values, max_size=6))
    def check(events: list[Any]) -> None:
        capture = StreamCapture(surface)
        capture.feed(stream_of(events, surface))
        status, error = capture.outcome()
        if status == UPSTREAM_ERROR:
            assert error
        _encode(capture.result())  # what is recorded is JSON
        extract_tokens(surface, capture.result())

    check()


@FUZZ
@given(st.lists(chat_chunk | json_values, max_size=6))
def test_a_translated_stream_of_any_shape_is_translated_or_refused(chunks: list[Any]) -> None:
    for translator in (responses_translator(), messages_translator()):
        capture = StreamCapture(CHAT, listener=translator.feed)
        capture.feed(stream_of(chunks, CHAT))
        if capture.outcome()[0] != UPSTREAM_ERROR:
            closing, terminal = translator.finish()
            assert terminal
        msgspec.to_builtins(translator.result())


@FUZZ
@given(shaped({"choices": st.lists(chat_choice | completion_choice | json_values, max_size=3), "usage": usage, "prompt_token_ids": ids}) | json_values)
def test_a_plain_answer_of_any_shape_is_read_or_refused(answer: Any) -> None:
    for surface in (CHAT, COMPLETIONS):
        tokens = extract_tokens(surface, answer)
        assert tokens is None or tokens.prompt_token_ids is not None or tokens.completion_lengths is not None
    for translator in (responses_translator(), messages_translator()):
        read = read_answer(translator.answer, answer)
        assert read is None or msgspec.to_builtins(read)


def test_the_pieces_read_are_checked_where_they_are_read() -> None:
    """The events the hand-written hostile cases send, one per piece the gateway reads."""
    wrong = {
        CHAT: [{"choices": [{"index": "a"}]}, {"choices": [{"delta": {"tool_calls": [{"index": 10**8}]}}]}, {"choices": [{"token_ids": [-1]}]}],
        COMPLETIONS: [{"choices": [{"text": 5}]}, {"choices": [{"logprobs": {"tokens": "abc"}}]}],
        RESPONSES: [{"type": "response.output_text.delta", "delta": 5}, {"type": "response.completed", "response": [1]}],
        MESSAGES: [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
            {"type": "message_start", "message": {"usage": 5}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": 5}},
            {"type": "content_block_start", "index": -1, "content_block": {}},
        ],
    }
    for surface, events in wrong.items():
        for event in events:
            capture = StreamCapture(surface)
            capture.feed(stream_of([event], surface))
            status, error = capture.outcome()
            assert status == UPSTREAM_ERROR and "wrong shape" in str(error), (surface.name, event)
    # And the same pieces well formed are read.
    capture = StreamCapture(MESSAGES)
    good = [
        {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 3}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]
    capture.feed(stream_of(good, MESSAGES))
    assert capture.outcome() == (OK, None)
    result = capture.result()
    assert (result["content"], result["stop_reason"], result["usage"]) == (
        [{"type": "text", "text": "hi"}],
        "end_turn",
        {"input_tokens": 3, "output_tokens": 1},
    )


class BrokenAssembler:
    """An assembler with a bug of the gateway's own (not a wrong answer)."""

    def add(self, event: Any) -> None:
        event.no_such_field  # noqa: B018 - the bug

    def result(self) -> dict[str, Any]:
        return {}


def test_a_bug_of_the_gateways_own_is_not_taken_for_the_upstreams() -> None:
    capture = StreamCapture(dataclasses.replace(CHAT, assembler=BrokenAssembler))
    with pytest.raises(AttributeError):
        capture.feed(stream_of([{"choices": []}], CHAT))


def responses_translator() -> responses.ResponsesTranslator:
    request = msgspec.convert({"model": "agent", "input": "hi"}, wire.ResponsesCreate)
    return responses.ResponsesTranslator(request, response_id="resp_1", created_at=1, model="agent")


def messages_translator() -> messages.MessagesTranslator:
    request = msgspec.convert({"model": "agent", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, wire.MessagesCreate)
    return messages.MessagesTranslator(request, message_id="msg_1", model="agent")


def test_answers_declare_only_what_is_read() -> None:
    """Unknown fields are ignored (each vLLM release adds some): a newer answer still reads."""
    chunk = msgspec.convert({"choices": [{"index": 0, "delta": {"content": "x", "new_field": [1]}, "new": {}}], "later": 1}, answers.ChatChunk)
    assert chunk.choices is not None and chunk.choices[0].delta is not None and chunk.choices[0].delta.content == "x"
