"""Anthropic's Messages API: ``POST /v1/messages``, with Anthropic's error format.

vLLM returns no token ids on it, so a policy's call is served through chat completions
(``core/protocols/translate/messages.py``). Streamed as typed events ending in ``message_stop``. Read
as: system -> system; text blocks -> content; tool_use -> an assistant tool call;
tool_result -> a tool message (before the rest of that user turn).
"""

from __future__ import annotations

from typing import Any

import msgspec

from burnish_server.core.platform.errors import Invalid
from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.conversation import Exchange, Message, text_of
from burnish_server.core.protocols.surfaces.base import ANTHROPIC_ERRORS, Surface, append, joined
from burnish_server.core.protocols.translate import messages as translator
from burnish_server.core.protocols.wire import ToolCall, tool_call

_decode = msgspec.json.Decoder().decode
# What msgspec raises for bytes that are no JSON: malformed, not UTF-8, nested too deeply.
_UNDECODABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class MessagesAssembler:
    """Anthropic Messages events into one ``message``."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
        self.usage: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}

    def add(self, event: answers.MessagesEvent) -> None:
        match event.type:
            case "message_start":
                started = msgspec.convert(event.message or {}, answers.MessageStart)  # its usage is merged into
                self.message = {**(event.message or {}), "content": []}
                self.usage = started.usage
            case "content_block_start":
                msgspec.convert(event.content_block or {}, answers.ContentBlock)  # its text is added to
                self.blocks[event.index] = dict(event.content_block or {})
            case "content_block_delta":
                self._delta(self.blocks.setdefault(event.index, {}), event.index, msgspec.convert(event.delta or {}, answers.ContentDelta))
            case "content_block_stop" if event.index in self.partial_json:
                text = "".join(self.partial_json.pop(event.index))
                try:
                    self.blocks.setdefault(event.index, {})["input"] = _decode(text) if text else {}
                except _UNDECODABLE:
                    self.blocks.setdefault(event.index, {})["input"] = text
            case "message_delta":
                self.message.update(event.delta or {})
                if event.usage:
                    self.usage = {**(self.usage or {}), **event.usage}

    def _delta(self, block: dict[str, Any], index: int, delta: answers.ContentDelta) -> None:
        match delta.type:
            case "text_delta":
                append(block, "text", delta.text)
            case "thinking_delta":
                append(block, "thinking", delta.thinking)
            case "signature_delta":
                block["signature"] = delta.signature
            case "input_json_delta":
                self.partial_json.setdefault(index, []).append(delta.partial_json or "")
            case "citations_delta":
                block.setdefault("citations", []).append(delta.citation)

    def result(self) -> dict[str, Any]:
        for index, pieces in self.partial_json.items():  # a stream cut inside a tool_use block
            self.blocks.setdefault(index, {})["input"] = "".join(pieces)
        message = {**self.message, "content": [joined(self.blocks[i]) for i in sorted(self.blocks)]}
        if self.usage is not None:
            message["usage"] = self.usage
        return message


def _blocks_to_messages(role: str, content: str | list[wire.Block], definitions: dict[str, dict[str, Any]] | None = None) -> list[Message]:
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
                calls.append(tool_call(block.name or "", msgspec.json.encode(block.input).decode(), block.id))
            case "tool_result":
                # As the model was shown it (core/protocols/translate/messages.py): tool_reference blocks as
                # the definitions they load, an error marked.
                result = translator.text(block.content, definitions)
                out.append(Message("tool", f"Error: {result}" if block.is_error else result, (), block.tool_use_id))
            case "thinking" | "redacted_thinking":
                pass
            case _:
                text.append(f"[{block.type}]")
    if text or calls or not out:
        out.append(Message(role, "\n".join(text), tuple(calls)))
    return out


def _tools(request: wire.MessagesRequest) -> list[dict[str, Any]]:
    """The tools as a policy's model is offered them (core/protocols/translate/messages.py: server tools
    left out, a deferred one once loaded); as they are where that fails."""
    try:
        return translator.offer_tools(request).tools
    except Invalid:
        return list(request.tools or ())


def read(request: wire.MessagesRequest, response: wire.MessagesResponse | None) -> Exchange:
    prompt: list[Message] = []
    if request.system:
        prompt.append(Message("system", text_of(request.system)))
    definitions = translator.definitions(request)
    for m in request.messages:
        prompt += _blocks_to_messages(m.role, m.content, definitions)
    tools = _tools(request) if request.tools else None
    answers = _blocks_to_messages("assistant", response.content)[-1:] if response else []
    return Exchange(prompt, tools, answers)


def terminal(name: str | None, data: bytes, event: answers.MessagesEvent | None) -> bool:
    kind = event.type if event is not None else name
    return kind == "message_stop"


MESSAGES = Surface(
    name="messages",
    path="messages",
    request=wire.MessagesRequest,
    response=wire.MessagesResponse,
    event=answers.MessagesEvent,
    read=read,
    assembler=MessagesAssembler,
    terminal=terminal,
    errors=ANTHROPIC_ERRORS,
    has_choices=False,
    translator=translator,
    schema_title="MessagesRequest",
    schema_description="Anthropic's Messages API request (model, max_tokens, messages, ...)",
)
