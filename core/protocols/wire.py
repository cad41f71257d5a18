"""The four recorded protocols, mirrored once as typed structs: the fields burnish reads.

Chat completions, completions (OpenAI), the Responses API (OpenAI) and Messages
(Anthropic). These are *readers*, not validators: every field is optional or defaulted and
unknown fields are ignored, because a recorded body is whatever the client sent and the
upstream accepted. Tool definitions are kept as the JSON objects they are (a JSON schema
each): burnish forwards them, it never interprets them.

Each surface (``core/protocols/surfaces/``) names its request and answer structs here and reads them
into one conversation.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Wire(msgspec.Struct, omit_defaults=True):
    """Base of the mirrored shapes: unknown fields are ignored, defaults are not written back."""


# ---- shared by the OpenAI shapes ----------------------------------------------------------


class ContentPart(Wire):
    """A part of a message's content: text (``text``, ``input_text``, ``output_text``), an
    image (chat's ``image_url`` object, the Responses API's ``input_image`` URL string), or
    something else (a file, audio), which burnish names but does not read."""

    type: str = "text"
    text: str | None = None
    image_url: str | dict[str, Any] | None = None


Content = str | list[ContentPart] | None


class Function(msgspec.Struct, frozen=True, omit_defaults=True):  # as Wire, and frozen
    name: str = ""
    arguments: str = ""  # JSON text, as the chat API writes it


class ToolCall(msgspec.Struct, frozen=True, omit_defaults=True):  # as Wire, and frozen
    """A tool call, in the chat API's shape: the one definition every protocol's reader and the
    conversation in chat form (``conversation.py``) use. Frozen, so messages that hold it compare
    and hash as values."""

    id: str | None = None
    type: str = "function"
    function: Function = msgspec.field(default_factory=Function)


def tool_call(name: str, arguments: str = "", id: str | None = None) -> ToolCall:
    return ToolCall(id=id, function=Function(name=name, arguments=arguments))


# ---- chat completions ---------------------------------------------------------------------


class ChatMessage(Wire):
    role: str = "user"
    content: Content = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # vLLM's reasoning parsers (both names are in use).
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatRequest(Wire):
    messages: list[ChatMessage] = []
    tools: list[dict[str, Any]] | None = None


class ChatChoice(Wire):
    index: int = 0
    message: ChatMessage = msgspec.field(default_factory=lambda: ChatMessage(role="assistant"))
    finish_reason: str | None = None


class ChatResponse(Wire):
    choices: list[ChatChoice] = []


# ---- completions --------------------------------------------------------------------------


class CompletionRequest(Wire):
    # A string, a list of strings, or token ids: the first two are read as text.
    prompt: str | list[Any] | None = None


class CompletionChoice(Wire):
    index: int = 0
    text: str = ""
    finish_reason: str | None = None


class CompletionResponse(Wire):
    choices: list[CompletionChoice] = []


# ---- the Responses API --------------------------------------------------------------------


class ResponsesItem(Wire):
    """An input or output item. ``message`` items have a role and content; ``function_call``
    items a name, arguments and call_id; ``function_call_output`` items a call_id and output;
    ``reasoning`` items a summary. Other types are named, not read."""

    type: str = "message"
    role: str | None = None
    content: Content = None
    name: str | None = None
    arguments: str | None = None
    call_id: str | None = None
    output: Content = None
    summary: list[ContentPart] | None = None
    namespace: str | None = None  # a function_call of a namespace's function (the Codex CLI's)


class ResponsesRequest(Wire):
    input: str | list[ResponsesItem] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None


class ResponsesCreate(ResponsesRequest):
    """A Responses request as the gateway serves it for a policy (``core/protocols/translate``): the
    reader's fields, plus the knobs that become the chat request's."""

    model: str | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    user: str | None = None
    metadata: dict[str, str] | None = None


class ResponsesResponse(Wire):
    output: list[ResponsesItem] = []
    status: str | None = None


# ---- Anthropic Messages -------------------------------------------------------------------


class Block(Wire):
    """A content block: ``text``, ``thinking``, ``tool_use`` (id, name, input) or
    ``tool_result`` (tool_use_id, content). Other types are named, not read."""

    type: str = "text"
    text: str | None = None
    thinking: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    tool_name: str | None = None  # a tool_reference's: the deferred tool it loads
    source: dict[str, Any] | None = None  # an image's: {"type": "base64", "media_type", "data"} or {"type": "url", "url"}


class AnthropicMessage(Wire):
    role: str = "user"
    content: str | list[Block] = ""


class MessagesRequest(Wire):
    system: str | list[Block] | None = None
    messages: list[AnthropicMessage] = []
    tools: list[dict[str, Any]] | None = None


class MessagesCreate(MessagesRequest):
    """A Messages request as the gateway serves it for a policy (``core/protocols/translate``)."""

    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class MessagesResponse(Wire):
    role: str = "assistant"
    content: list[Block] = []
    stop_reason: str | None = None


Request = ChatRequest | CompletionRequest | ResponsesRequest | MessagesRequest
Response = ChatResponse | CompletionResponse | ResponsesResponse | MessagesResponse
