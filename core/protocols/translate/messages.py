"""Anthropic Messages served through chat completions (see ``core/protocols/translate/__init__.py``).

Request::

    system (a string or text blocks)   -> a system message (first)
    a system message in ``messages``   -> a system message in its place (Claude Code sends one
                                          after the first user turn); every template burnish up
                                          writes renders it there
    user text / image blocks           -> a user message (text joined; images as image_url parts)
    user tool_result blocks            -> tool messages, before the rest of that user turn
                                          (chat wants a tool message right after the call)
    assistant text + tool_use blocks   -> one assistant message with content and tool_calls
    thinking blocks                    -> dropped (chat templates render no reasoning input)
    tools {name, description, input_schema} -> chat function tools
    tools with defer_loading           -> offered once a tool_reference block in the
                                          conversation loads them (Claude Code's ToolSearch)
    a tool_reference block             -> the tool's definition as text, one
                                          ``<function>{...}</function>`` line in a
                                          ``<functions>`` block (what ToolSearch promises)
    server tools (web_search_..., ...) -> left out of what the model sees (``offer_tools``: the
                                          policy's ``serving.hosted_tools``, or refused)
    thinking, context_management, output_config, cache_control, the beta query and headers
                                       -> read and left (no reasoning is asked of the model)
    tool_choice auto/any/tool/none     -> auto/required/{function}/none
    max_tokens, stop_sequences, temperature, top_p, top_k -> the same knobs
    metadata.user_id                   -> user

Answer: reasoning -> a ``thinking`` block, text -> a ``text`` block, each tool call -> a
``tool_use`` block (its arguments parsed into ``input``; streamed as one
``input_json_delta`` when the block closes, since a model's arguments may not be a JSON
object and SDKs parse each piece as part of one). ``finish_reason`` stop -> ``end_turn``
(``stop_sequence`` when one of the request's stop sequences ended it), length ->
``max_tokens``, a tool call -> ``tool_use``. Streamed, the events are Anthropic's:
``message_start``, per block ``content_block_start``/``_delta``/``_stop``, ``message_delta``
(stop reason and usage), and last ``message_stop``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from burnish_server.core.platform.errors import Invalid
from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.translate.common import (
    HostedTools,
    Offered,
    StreamedFields,
    ToolCallPiece,
    Translator,
    check_tool,
    delta_of,
    hosted,
    sse,
    unsupported,
    usage_of,
)

# ---- the answer's shapes ------------------------------------------------------------------


class TextBlock(msgspec.Struct):
    text: str
    type: str = "text"


class ThinkingBlock(msgspec.Struct):
    thinking: str
    signature: str = ""
    type: str = "thinking"


class ToolUseBlock(msgspec.Struct):
    id: str
    name: str
    input: Any
    type: str = "tool_use"


Block = TextBlock | ThinkingBlock | ToolUseBlock


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(msgspec.Struct):
    """The ``message`` object, every field Anthropic writes."""

    id: str
    model: str
    content: list[Block]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
    type: str = "message"
    role: str = "assistant"


# ---- request -> chat ----------------------------------------------------------------------


def text(content: str | list[wire.Block] | None, tools: dict[str, dict[str, Any]] | None = None) -> str:
    """Text blocks joined; tool_reference blocks (in a tool result) as the definitions of the
    tools they load, in the ``<functions>`` form Claude Code's ToolSearch describes."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    joined = "\n".join(b.text or "" for b in content if b.type == "text")
    loaded = [(tools or {}).get(b.tool_name or "") or {"name": b.tool_name} for b in content if b.type == "tool_reference"]
    if loaded:
        lines = "".join(f"<function>{_encode_str(_definition(t))}</function>\n" for t in loaded)
        joined = (joined + "\n" if joined else "") + f"<functions>\n{lines}</functions>"
    return joined


def definitions(request: wire.MessagesRequest) -> dict[str, dict[str, Any]]:
    """The request's tools by name: what a tool_reference block loads."""
    return {t["name"]: t for t in request.tools or () if isinstance(t.get("name"), str)}


def _definition(tool: dict[str, Any]) -> dict[str, Any]:
    return {"description": tool.get("description", ""), "name": tool.get("name", ""), "parameters": tool.get("input_schema", {})}


def _encode_str(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _references(messages: list[wire.AnthropicMessage]) -> set[str]:
    """The tools the conversation's tool_reference blocks loaded."""
    out: set[str] = set()
    for m in messages:
        for block in m.content if isinstance(m.content, list) else ():
            for inner in block.content if block.type == "tool_result" and isinstance(block.content, list) else ():
                if inner.type == "tool_reference" and inner.tool_name:
                    out.add(inner.tool_name)
    return out


def _image(block: wire.Block, param: str) -> dict[str, Any]:
    source = block.source or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = source.get("url", "")
    else:
        raise unsupported(f"an image source of type {source.get('type')!r}", param)
    return {"type": "image_url", "image_url": {"url": url}}


def _turn(role: str, content: str | list[wire.Block], param: str, definitions: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results first, then the rest."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{param}.content[{i}]"
        match block.type:
            case "text":
                parts.append({"type": "text", "text": block.text or ""})
            case "image" if role == "user":
                parts.append(_image(block, at))
            case "tool_use" if role == "assistant":
                arguments = msgspec.json.encode(block.input if block.input is not None else {}).decode()
                calls.append({"id": block.id, "type": "function", "function": {"name": block.name or "", "arguments": arguments}})
            case "tool_result" if role == "user":
                result = text(block.content, definitions)
                tools.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": f"Error: {result}" if block.is_error else result})
            case "thinking" | "redacted_thinking":
                pass
            case other:
                raise unsupported(f"a {other!r} block in a {role} message", at)
    out = list(tools)
    if parts or calls or not tools:
        text_only = all(p["type"] == "text" for p in parts)
        message: dict[str, Any] = {"role": role, "content": "\n".join(p["text"] for p in parts) if text_only else parts}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def offer_tools(request: wire.MessagesRequest, hosted_tools: HostedTools = "omit") -> Offered:
    """The request's tools as the model is offered them: client tools as they are (a deferred
    one once loaded), server tools left out (or refused)."""
    loaded = _references(request.messages)
    chat: list[dict[str, Any]] = []
    omitted: list[str] = []
    for i, tool in enumerate(request.tools or ()):
        if tool.get("type") not in (None, "custom"):
            omitted.append(hosted(str(tool.get("type")), hosted_tools, f"tools[{i}]"))
        elif "input_schema" not in tool:
            raise Invalid("a client tool needs an input_schema", "invalid_request", f"tools[{i}].input_schema")
        elif not tool.get("defer_loading") or tool.get("name") in loaded:
            chat.append(_tool(tool, i))
    return Offered(tools=chat, omitted=tuple(omitted))


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    check_tool(tool.get("name"), tool["input_schema"], f"tools[{i}]")
    spec = {"name": tool.get("name", ""), "parameters": tool["input_schema"]}
    for key in ("description", "strict"):  # strict: vLLM constrains the arguments to the schema
        if tool.get(key) is not None:
            spec[key] = tool[key]
    return {"type": "function", "function": spec}


def _tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    match choice.get("type"):
        case "auto":
            return "auto"
        case "none":
            return "none"
        case "any":
            return "required"
        case "tool" if choice.get("name"):
            return {"type": "function", "function": {"name": choice["name"]}}
    raise Invalid(f"unknown tool_choice {choice!r}", "invalid_request", "tool_choice")


def chat_request(request: wire.MessagesCreate, offered: Offered | None = None) -> dict[str, Any]:
    """The chat completions body that serves this request (without ``model``: the caller
    routes), offering the model ``offered`` tools (``offer_tools``: by default every client
    tool, server tools left out)."""
    if request.max_tokens is None:
        raise Invalid("Field required", "invalid_request", "max_tokens")
    if not request.messages:
        raise Invalid("at least one message is required", "invalid_request", "messages")
    offered = offered if offered is not None else offer_tools(request)
    loadable = definitions(request)
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": text(request.system)})
    for i, m in enumerate(request.messages):
        if m.role == "system":
            messages.append({"role": "system", "content": text(m.content)})
            continue
        if m.role not in ("user", "assistant"):
            raise Invalid(f"expected 'user', 'assistant' or 'system', got {m.role!r}", "invalid_request", f"messages[{i}].role")
        messages += _turn(m.role, m.content, f"messages[{i}]", loadable)
    body: dict[str, Any] = {"messages": messages, "max_tokens": request.max_tokens}
    if offered.tools:
        body["tools"] = offered.tools
    # A choice among tools that were all left out (server tools) is no choice.
    if request.tool_choice is not None and (offered.tools or not request.tools):
        body["tool_choice"] = _tool_choice(request.tool_choice)
        if request.tool_choice.get("disable_parallel_tool_use") and offered.tools:
            body["parallel_tool_calls"] = False
    if request.stop_sequences:
        body["stop"] = request.stop_sequences
    for key in ("temperature", "top_p", "top_k"):
        if (value := getattr(request, key)) is not None:
            body[key] = value
    if request.metadata and isinstance(request.metadata.get("user_id"), str):
        body["user"] = request.metadata["user_id"]
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# ---- chat -> answer and events ------------------------------------------------------------


class MessagesTranslator(Translator[Message]):
    """Chat completion chunks in, Messages events out."""

    def __init__(self, request: wire.MessagesCreate, *, message_id: str, model: str) -> None:
        self.request = request
        self.id = message_id
        self.model = model
        self.blocks: list[Block] = []
        self.open: Block | None = None  # the block being written (Anthropic streams one at a time)
        self.arguments: dict[int, list[str]] = {}  # tool_use block index -> its arguments so far, in pieces
        self.pieces = StreamedFields()  # the text and thinking being written
        self.calls: dict[int, int] = {}  # chat tool call index -> block index
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.started = False

    # -- the stream

    def feed(self, chunk: answers.ChatChunk) -> list[bytes]:
        out: list[bytes] = []
        if chunk.prompt_token_ids is not None:  # vLLM sends the prompt with the first chunk
            self.input_tokens = len(chunk.prompt_token_ids)
        if (usage := usage_of(chunk)) is not None:
            self.input_tokens = usage.prompt_tokens or self.input_tokens
            self.output_tokens = usage.completion_tokens or 0
        if not self.started:
            self.started = True
            start = Message(self.id, self.model, [], None, None, Usage(self.input_tokens, self.output_tokens))
            out.append(sse("message_start", {"type": "message_start", "message": msgspec.to_builtins(start)}))
        delta = delta_of(chunk)
        if delta.reasoning:
            out += self._write(ThinkingBlock, "thinking_delta", "thinking", delta.reasoning)
        if delta.content:
            out += self._write(TextBlock, "text_delta", "text", delta.content)
        for call in delta.tool_calls:
            out += self._call(call)
        self.finish_reason = delta.finish_reason or self.finish_reason
        if delta.stop_reason is not None:
            self.stop_reason = delta.stop_reason
        return out

    def _start(self, block: Block) -> list[bytes]:
        out = self._stop()
        self.blocks.append(block)
        self.open = block
        index = len(self.blocks) - 1
        # A block starts empty; its content arrives as deltas.
        empty: dict[str, Any]
        if isinstance(block, ToolUseBlock):
            empty = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        elif isinstance(block, ThinkingBlock):
            empty = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            empty = {"type": "text", "text": ""}
        return [*out, sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty})]

    def _stop(self) -> list[bytes]:
        if self.open is None:
            return []
        index = self.blocks.index(self.open)
        out = []
        if isinstance(self.open, ToolUseBlock):
            # The arguments go out whole, as the object the answer holds: a model's arguments
            # may be no JSON object at all (a number, text cut by max_tokens), and the SDKs
            # parse every partial_json piece as the start of one.
            self.open.input = _input("".join(self.arguments.get(index, ())))
            if self.open.input:
                partial = msgspec.json.encode(self.open.input).decode()
                delta = {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}}
                out.append(sse("content_block_delta", delta))
        self.open = None
        return [*out, sse("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _write(self, kind: type[TextBlock] | type[ThinkingBlock], delta_type: str, field: str, piece: str) -> list[bytes]:
        out = [] if isinstance(self.open, kind) else self._start(kind(""))
        block = self.open
        self.pieces.add(block, field, piece)
        delta = {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": {"type": delta_type, field: piece}}
        return [*out, sse("content_block_delta", delta)]

    def _call(self, piece: ToolCallPiece) -> list[bytes]:
        out: list[bytes] = []
        if piece.index not in self.calls:
            out += self._start(ToolUseBlock(piece.id or f"toolu_{self.id}_{len(self.blocks)}", piece.name or "", {}))
            self.calls[piece.index] = len(self.blocks) - 1
        index = self.calls[piece.index]
        self.arguments.setdefault(index, []).append(piece.arguments)  # sent when the block closes
        return out

    def _reason(self) -> tuple[str, str | None]:
        if any(isinstance(b, ToolUseBlock) for b in self.blocks):
            return "tool_use", None
        if self.finish_reason == "length":
            return "max_tokens", None
        if isinstance(self.stop_reason, str) and self.stop_reason in (self.request.stop_sequences or ()):
            return "stop_sequence", self.stop_reason
        return "end_turn", None

    def finish(self) -> tuple[list[bytes], bytes]:
        if not self.started:
            self.feed(answers.ChatChunk())
        out = self._stop()
        reason, sequence = self._reason()
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }
        out.append(sse("message_delta", delta))
        return out, sse("message_stop", {"type": "message_stop"})

    def result(self) -> Message:
        self.pieces.settle()
        if isinstance(self.open, ToolUseBlock):  # a stream cut inside a tool_use block
            self.open.input = _input("".join(self.arguments.get(self.blocks.index(self.open), ())))
        reason, sequence = self._reason()
        return Message(self.id, self.model, list(self.blocks), reason, sequence, Usage(self.input_tokens, self.output_tokens))


def _input(arguments: str) -> Any:
    """A tool call's arguments as ``input`` (an object); the text under ``_raw`` if not JSON."""
    try:
        value = msgspec.json.decode(arguments) if arguments.strip() else {}
    except msgspec.DecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}
