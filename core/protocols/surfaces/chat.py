"""OpenAI's chat completions: ``POST /v1/chat/completions``.

Served to vLLM as it is (vLLM returns token ids and logprobs on it), streamed as
``chat.completion.chunk`` events ending in ``data: [DONE]``; read as its messages are.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.conversation import Exchange, Message, text_of
from burnish_server.core.protocols.surfaces.base import OPENAI_ERRORS, Surface, append, extend, joined
from burnish_server.core.protocols.wire import tool_call


class ChatAssembler:
    """``chat.completion.chunk`` events into one ``chat.completion``."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}

    def add(self, chunk: answers.ChatChunk) -> None:
        for key in answers.CHUNK_HEAD:
            if key not in self.head and (value := getattr(chunk, key)) is not UNSET:
                self.head[key] = value
        if chunk.usage:
            self.extra["usage"] = chunk.usage
        if chunk.prompt_token_ids is not None:  # vLLM's return_token_ids
            self.extra["prompt_token_ids"] = chunk.prompt_token_ids
        for c in chunk.choices or ():
            choice = self.choices.setdefault(
                c.index,
                {"index": c.index, "message": {"role": "assistant", "content": None}, "finish_reason": None, "logprobs": None},
            )
            if c.delta is not None:
                self._delta(choice["message"], c.delta)
            if c.finish_reason is not None:
                choice["finish_reason"] = c.finish_reason
            if c.stop_reason is not None:
                choice["stop_reason"] = c.stop_reason
            if c.logprobs is not None:
                merged = choice["logprobs"] = choice["logprobs"] or {"content": None}
                extend(merged, "content", c.logprobs.content)
                extend(merged, "refusal", c.logprobs.refusal)
            extend(choice, "token_ids", c.token_ids)

    @staticmethod
    def _delta(message: dict[str, Any], delta: answers.ChatDelta) -> None:
        if delta.role:
            message["role"] = delta.role
        append(message, "content", delta.content)
        append(message, "reasoning_content", delta.reasoning_content)
        append(message, "reasoning", delta.reasoning)
        append(message, "refusal", delta.refusal)
        for call in delta.tool_calls or ():
            calls = message.setdefault("tool_calls", [])
            index = len(calls) if call.index is None else call.index
            while len(calls) <= index:
                calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            slot = calls[index]
            if call.id:
                slot["id"] = call.id
            if call.type:
                slot["type"] = call.type
            if call.function is not None:
                append(slot["function"], "name", call.function.name)
                append(slot["function"], "arguments", call.function.arguments)

    def result(self) -> dict[str, Any]:
        choices = [self.choices[i] for i in sorted(self.choices)]
        for choice in choices:
            joined(choice["message"])
            for call in choice["message"].get("tool_calls") or ():
                joined(call["function"])
        return {**self.head, "object": "chat.completion", "choices": choices, **self.extra}


def _chat_message(m: wire.ChatMessage) -> Message:
    calls = tuple(tool_call(c.function.name, c.function.arguments, c.id) for c in m.tool_calls or ())  # as any reader compares them: id, name, arguments
    return Message(m.role, text_of(m.content), calls, m.tool_call_id)


def read(request: wire.ChatRequest, response: wire.ChatResponse | None) -> Exchange:
    choices = sorted(response.choices, key=lambda c: c.index) if response else []
    answers = [_chat_message(c.message) for c in choices]
    return Exchange([_chat_message(m) for m in request.messages], request.tools, answers)


def terminal(name: str | None, data: bytes, event: Any) -> bool:
    return data == b"[DONE]"


CHAT = Surface(
    name="chat.completions",
    path="chat/completions",
    request=wire.ChatRequest,
    response=wire.ChatResponse,
    event=answers.ChatChunk,
    read=read,
    assembler=ChatAssembler,
    terminal=terminal,
    errors=OPENAI_ERRORS,
    has_choices=True,
    translator=None,
    schema_title="ChatCompletionRequest",
    schema_description="OpenAI's chat completion request (model, messages, tools, n, ...)",
)
