"""Anthropic's Messages API: ``POST /v1/messages``, with Anthropic's error format.

vLLM returns no token ids on it, so a policy's call is served through chat completions
(``core/translate/messages.py``). Streamed as typed events ending in ``message_stop``. Read
as: system -> system; text blocks -> content; tool_use -> an assistant tool call;
tool_result -> a tool message (before the rest of that user turn).
"""

from __future__ import annotations

from typing import Any

import msgspec

from burnish_server.core import wire
from burnish_server.core.conversation import Exchange, Message, ToolCall, text_of
from burnish_server.core.surfaces.base import ANTHROPIC_ERRORS, Surface, append, index_of, joined
from burnish_server.core.translate import messages as translator

_decode = msgspec.json.Decoder().decode
# What msgspec raises for bytes that are no JSON: malformed, not UTF-8, nested too deeply.
_UNDECODABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class MessagesAssembler:
    """Anthropic Messages events into one ``message``."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = {**event.get("message", {}), "content": []}
        elif kind == "content_block_start":
            self.blocks[index_of(event.get("index"))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = index_of(event.get("index"))
            block = self.blocks.setdefault(index, {})
            delta = event.get("delta") or {}
            match delta.get("type"):
                case "text_delta":
                    append(block, "text", delta.get("text"))
                case "thinking_delta":
                    append(block, "thinking", delta.get("thinking"))
                case "signature_delta":
                    block["signature"] = delta.get("signature")
                case "input_json_delta":
                    self.partial_json.setdefault(index, []).append(delta.get("partial_json") or "")
                case "citations_delta":
                    block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "content_block_stop":
            index = index_of(event.get("index"))
            if index in self.partial_json:
                text = "".join(self.partial_json.pop(index))
                try:
                    self.blocks.setdefault(index, {})["input"] = _decode(text) if text else {}
                except _UNDECODABLE:
                    self.blocks.setdefault(index, {})["input"] = text
        elif kind == "message_delta":
            self.message.update(event.get("delta") or {})
            if event.get("usage"):
                self.message["usage"] = {**(self.message.get("usage") or {}), **event["usage"]}

    def result(self) -> dict[str, Any]:
        for index, pieces in self.partial_json.items():  # a stream cut inside a tool_use block
            self.blocks.setdefault(index, {})["input"] = "".join(pieces)
        return {**self.message, "content": [joined(self.blocks[i]) for i in sorted(self.blocks)]}


def _blocks_to_messages(role: str, content: str | list[wire.Block]) -> list[Message]:
    if isinstance(content, str):
        return [Message(role, content)]
    out: list[Message] = []
    text: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        match block.type:
            case "text":
                text.append(block.text or "")
            case "tool_use":
                calls.append(ToolCall(block.name or "", msgspec.json.encode(block.input).decode(), block.id))
            case "tool_result":
                result = block.content if block.content is not None else ""
                out.append(Message("tool", result if isinstance(result, str) else text_of(result), (), block.tool_use_id))
            case "thinking" | "redacted_thinking":
                pass
            case _:
                text.append(f"[{block.type}]")
    if text or calls or not out:
        out.append(Message(role, "\n".join(text), tuple(calls)))
    return out


def _tool_from_anthropic(tool: dict[str, Any]) -> dict[str, Any]:
    if "input_schema" in tool:
        spec = {"name": tool.get("name", ""), "description": tool.get("description", ""), "parameters": tool["input_schema"]}
        return {"type": "function", "function": spec}
    return tool


def read(request: wire.MessagesRequest, response: wire.MessagesResponse | None) -> Exchange:
    prompt: list[Message] = []
    if request.system:
        prompt.append(Message("system", text_of(request.system)))
    for m in request.messages:
        prompt += _blocks_to_messages(m.role, m.content)
    tools = [_tool_from_anthropic(t) for t in request.tools] if request.tools else None
    answers = _blocks_to_messages("assistant", response.content)[-1:] if response else []
    return Exchange(prompt, tools, answers)


def terminal(name: str | None, data: bytes, event: Any) -> bool:
    kind = event.get("type") if isinstance(event, dict) else name
    return kind == "message_stop"


MESSAGES = Surface(
    name="messages",
    path="messages",
    request=wire.MessagesRequest,
    response=wire.MessagesResponse,
    read=read,
    assembler=MessagesAssembler,
    terminal=terminal,
    errors=ANTHROPIC_ERRORS,
    has_choices=False,
    translator=translator,
    schema_title="MessagesRequest",
    schema_description="Anthropic's Messages API request (model, max_tokens, messages, ...)",
)
