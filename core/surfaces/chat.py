"""OpenAI's chat completions: ``POST /v1/chat/completions``.

Served to vLLM as it is (vLLM returns token ids and logprobs on it), streamed as
``chat.completion.chunk`` events ending in ``data: [DONE]``; read as its messages are.
"""

from __future__ import annotations

from typing import Any

from burnish_server.core import wire
from burnish_server.core.conversation import Exchange, Message, ToolCall, text_of
from burnish_server.core.surfaces.base import OPENAI_ERRORS, Surface, append, extend, index_of, joined


class ChatAssembler:
    """``chat.completion.chunk`` events into one ``chat.completion``."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if key in chunk and key not in self.head:
                self.head[key] = chunk[key]
        if chunk.get("usage"):
            self.extra["usage"] = chunk["usage"]
        if chunk.get("prompt_token_ids") is not None:  # vLLM's return_token_ids
            self.extra["prompt_token_ids"] = chunk["prompt_token_ids"]
        for c in chunk.get("choices") or ():
            index = index_of(c.get("index"))
            choice = self.choices.setdefault(
                index,
                {"index": index, "message": {"role": "assistant", "content": None}, "finish_reason": None, "logprobs": None},
            )
            message = choice["message"]
            delta = c.get("delta") or {}
            if delta.get("role"):
                message["role"] = delta["role"]
            for key in ("content", "reasoning_content", "reasoning", "refusal"):
                append(message, key, delta.get(key))
            for call in delta.get("tool_calls") or ():
                calls = message.setdefault("tool_calls", [])
                index = index_of(call.get("index"), len(calls))
                while len(calls) <= index:
                    calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                slot = calls[index]
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                function = call.get("function") or {}
                append(slot["function"], "name", function.get("name"))
                append(slot["function"], "arguments", function.get("arguments"))
            if c.get("finish_reason") is not None:
                choice["finish_reason"] = c["finish_reason"]
            if c.get("stop_reason") is not None:
                choice["stop_reason"] = c["stop_reason"]
            if logprobs := c.get("logprobs"):
                merged = choice["logprobs"] = choice["logprobs"] or {"content": None}
                for key in ("content", "refusal"):
                    if logprobs.get(key) is not None:
                        extend(merged, key, logprobs[key])
            if c.get("token_ids") is not None:
                extend(choice, "token_ids", c["token_ids"])

    def result(self) -> dict[str, Any]:
        choices = [self.choices[i] for i in sorted(self.choices)]
        for choice in choices:
            joined(choice["message"])
            for call in choice["message"].get("tool_calls") or ():
                joined(call["function"])
        return {**self.head, "object": "chat.completion", "choices": choices, **self.extra}


def _chat_message(m: wire.ChatMessage) -> Message:
    calls = tuple(ToolCall(c.function.name, c.function.arguments, c.id) for c in m.tool_calls or ())
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
    read=read,
    assembler=ChatAssembler,
    terminal=terminal,
    errors=OPENAI_ERRORS,
    has_choices=True,
    translator=None,
    schema_title="ChatCompletionRequest",
    schema_description="OpenAI's chat completion request (model, messages, tools, n, ...)",
)
