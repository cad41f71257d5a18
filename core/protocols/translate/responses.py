"""The Responses API served through chat completions (see ``core/protocols/translate/__init__.py``).

Request, item by item::

    instructions                      -> a system message (first)
    input: "text"                     -> a user message
    message item (user/assistant/...) -> a chat message; input_text/output_text parts -> text
                                         parts, input_image -> image_url; developer -> system
    function_call items of one turn   -> one assistant message with those tool_calls
    function_call_output              -> a tool message
    reasoning items                   -> dropped (chat templates render no reasoning input)
    function tools (flat)             -> chat tools ({"type": "function", "function": {...}})
    namespace tools                   -> each of their functions a chat tool named
                                         ``<namespace>__<name>`` (the Codex CLI's flat form);
                                         its calls answered as ``function_call`` items with
                                         ``name`` and ``namespace`` as the client gave them
    hosted tools (web_search, ...)    -> left out of what the model sees (``offer_tools``: the
                                         policy's ``serving.hosted_tools``, or refused)
    reasoning, include, store, prompt_cache_key, client_metadata, truncation
                                      -> read and left (no reasoning is asked of the model;
                                         nothing is stored upstream)
    max_output_tokens, text.format    -> max_tokens, response_format

``previous_response_id`` is resolved by the caller: it passes the earlier exchange's items
(``history``) and they come before ``input``, as the API defines (the earlier
``instructions`` are not carried over).

Answer: reasoning -> a ``reasoning`` item, text -> a ``message`` item with one
``output_text`` part, each tool call -> a ``function_call`` item; ``finish_reason`` length
-> status ``incomplete`` (``max_output_tokens``). Streamed, the events are the ones OpenAI
sends: ``response.created``, ``response.in_progress``, per item ``output_item.added``,
its deltas and ``.done`` events, ``output_item.done``, and last ``response.completed``
(or ``response.incomplete``), which carries the whole response.
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
    ToolName,
    Translator,
    check_tool,
    delta_of,
    hosted,
    sse,
    unsupported,
    usage_of,
)

# ---- the answer's shapes ------------------------------------------------------------------


class OutputText(msgspec.Struct):
    text: str
    type: str = "output_text"
    annotations: list[Any] = []
    logprobs: list[Any] = []


class ReasoningText(msgspec.Struct):
    text: str
    type: str = "reasoning_text"


class MessageItem(msgspec.Struct):
    id: str
    status: str
    content: list[OutputText]
    type: str = "message"
    role: str = "assistant"


class FunctionCallItem(msgspec.Struct):
    id: str
    status: str
    call_id: str
    name: str
    arguments: str
    type: str = "function_call"
    namespace: str | msgspec.UnsetType = msgspec.UNSET  # written only for a namespace's function


class ReasoningItem(msgspec.Struct):
    id: str
    status: str
    content: list[ReasoningText]
    summary: list[Any] = []
    type: str = "reasoning"


Item = MessageItem | FunctionCallItem | ReasoningItem


class InputDetails(msgspec.Struct):
    cached_tokens: int = 0


class OutputDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputDetails = msgspec.field(default_factory=InputDetails)
    output_tokens_details: OutputDetails = msgspec.field(default_factory=OutputDetails)


class Response(msgspec.Struct):
    """The ``response`` object, every field OpenAI writes (null where burnish has no value)."""

    id: str
    created_at: int
    model: str
    status: str
    output: list[Item]
    usage: Usage | None
    instructions: str | None
    max_output_tokens: int | None
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    user: str | None
    metadata: dict[str, str]
    incomplete_details: dict[str, str] | None = None
    error: dict[str, Any] | None = None
    object: str = "response"
    truncation: str = "disabled"
    reasoning: dict[str, Any] = msgspec.field(default_factory=lambda: {"effort": None, "summary": None})


# ---- request -> chat ----------------------------------------------------------------------

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _parts(content: wire.Content, param: str) -> str | list[dict[str, Any]]:
    """A message item's content as chat content: a string stays one; text-only parts join into
    one string (what every chat template takes); with an image, chat's parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.type in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.text or ""})
        elif part.type == "input_image" and part.image_url:
            url = part.image_url if isinstance(part.image_url, str) else part.image_url.get("url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise unsupported(f"a {part.type!r} content part", param)
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def flat_name(namespace: str | None, name: str) -> str:
    """A namespace's function as one chat tool name: ``<namespace>__<name>``, the form the
    Codex CLI itself flattens them to (underscores at the seam trimmed)."""
    return f"{namespace.rstrip('_')}__{name.lstrip('_')}" if namespace else name


def chat_messages(items: list[wire.ResponsesItem]) -> list[dict[str, Any]]:
    """Input items as chat messages (``Invalid`` for an item chat cannot carry)."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        match item.type:
            case "message":
                role = _ROLES.get(item.role or "user")
                if role is None:
                    raise Invalid(f"unknown role {item.role!r}", "invalid_request", f"{param}.role")
                out.append({"role": role, "content": _parts(item.content, f"{param}.content")})
            case "function_call":
                name = flat_name(item.namespace, item.name or "")
                call = {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": item.arguments or ""}}
                last = out[-1] if out else None
                # The calls of one turn belong to one assistant message.
                if last is not None and last["role"] == "assistant" and (last.get("tool_calls") or not last["content"]):
                    last.setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            case "function_call_output":
                output = item.output if isinstance(item.output, str) else _parts(item.output, f"{param}.output")
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
            case "reasoning":
                pass
            case other:
                raise unsupported(f"an input item of type {other!r}", param)
    return out


def _function(tool: dict[str, Any], param: str, name: str | None = None) -> dict[str, Any]:
    check_tool(tool.get("name"), tool.get("parameters"), param)
    spec = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    if name is not None:
        spec["name"] = name
    return {"type": "function", "function": spec}


def offer_tools(tools: list[dict[str, Any]] | None, hosted_tools: HostedTools = "omit") -> Offered:
    """The request's tools as the model is offered them: functions as they are, a namespace's
    functions each under its flat name, hosted tools left out (or refused)."""
    chat: list[dict[str, Any]] = []
    omitted: list[str] = []
    names: dict[str, ToolName] = {}
    for i, tool in enumerate(tools or ()):
        param = f"tools[{i}]"
        kind = tool.get("type")
        if kind == "function":
            chat.append(_function(tool, param))
        elif kind == "namespace":
            namespace = tool.get("name")
            if not isinstance(namespace, str) or not namespace:
                raise Invalid("a namespace tool needs a name", "invalid_request", f"{param}.name")
            members = tool.get("tools")
            if not isinstance(members, list):
                raise Invalid("a namespace tool needs a list of tools", "invalid_request", f"{param}.tools")
            for j, member in enumerate(members):
                at = f"{param}.tools[{j}]"
                if not isinstance(member, dict) or member.get("type") != "function":
                    kind_of = member.get("type") if isinstance(member, dict) else None
                    omitted.append(hosted(f"{namespace}.{kind_of}", hosted_tools, at))
                    continue
                flat = flat_name(namespace, str(member.get("name") or ""))
                chat.append(_function(member, at, flat))
                names[flat] = ToolName(member["name"], namespace)
        else:
            omitted.append(hosted(str(kind), hosted_tools, param))
    return Offered(tools=chat, omitted=tuple(omitted), names=names)


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # auto, none, required: the same words in chat
    if choice.get("type") == "function" and choice.get("name"):
        name = flat_name(choice.get("namespace"), choice["name"])
        return {"type": "function", "function": {"name": name}}
    raise unsupported(f"tool_choice {choice!r}", "tool_choice")


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") or {"type": "text"}
    match fmt.get("type"):
        case "text":
            return None
        case "json_object":
            return {"type": "json_object"}
        case "json_schema":
            schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
            return {"type": "json_schema", "json_schema": schema}
    raise unsupported(f"text.format {fmt.get('type')!r}", "text.format")


def input_items(request: wire.ResponsesCreate) -> list[wire.ResponsesItem]:
    """The request's ``input`` as items (a string is one user message)."""
    if isinstance(request.input, str):
        return [wire.ResponsesItem(type="message", role="user", content=request.input)]
    return list(request.input or [])


def chat_request(request: wire.ResponsesCreate, history: list[wire.ResponsesItem] | None = None, offered: Offered | None = None) -> dict[str, Any]:
    """The chat completions body that serves this request (without ``model``: the caller
    routes), offering the model ``offered`` tools (``offer_tools``: by default every tool, hosted
    ones left out)."""
    offered = offered if offered is not None else offer_tools(request.tools)
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    messages += chat_messages([*(history or []), *input_items(request)])
    if not messages:
        raise Invalid("input is empty: give a string or at least one item", "invalid_request", "input")
    body: dict[str, Any] = {"messages": messages}
    if offered.tools:
        body["tools"] = offered.tools
    # A choice among tools that were all left out (hosted ones) is no choice.
    if request.tool_choice is not None and (offered.tools or not request.tools):
        body["tool_choice"] = _tool_choice(request.tool_choice)
    if request.parallel_tool_calls is not None and offered.tools:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    for key in ("temperature", "top_p", "user"):
        if (value := getattr(request, key)) is not None:
            body[key] = value
    if (fmt := _response_format(request.text)) is not None:
        body["response_format"] = fmt
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# ---- chat -> answer and events ------------------------------------------------------------


class ResponsesTranslator(Translator[Response]):
    """Chat completion chunks in, Responses events out.

    Item ids derive from the response id and the item's place in ``output``, so the streamed
    events and the final response agree by construction.
    """

    def __init__(self, request: wire.ResponsesCreate, *, response_id: str, created_at: int, model: str, offered: Offered | None = None) -> None:
        self.request = request
        self.offered = offered if offered is not None else Offered()
        self.id = response_id
        self.created_at = created_at
        self.model = model
        self.items: list[Item] = []
        self.text: MessageItem | None = None  # the message item being written
        self.reasoning: ReasoningItem | None = None
        self.calls: dict[int, FunctionCallItem] = {}  # chat tool call index -> its item
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.sequence = 0
        self.started = False
        self.pieces = StreamedFields()  # the text and arguments being written

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(kind, msgspec.to_builtins(event))

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.id.removeprefix('resp_')}_{len(self.items)}"

    def _add(self, item: Item) -> bytes:
        self.items.append(item)
        return self._event("response.output_item.added", output_index=len(self.items) - 1, item=item)

    # -- the stream

    def feed(self, chunk: answers.ChatChunk) -> list[bytes]:
        out: list[bytes] = []
        if not self.started:
            self.started = True
            skeleton = self._response(status="in_progress")
            out += [self._event("response.created", response=skeleton), self._event("response.in_progress", response=skeleton)]
        if (usage := usage_of(chunk)) is not None:
            self.usage = _usage(usage)
        delta = delta_of(chunk)
        if delta.reasoning:
            out += self._reasoning(delta.reasoning)
        if delta.content:
            out += self._close_reasoning()
            out += self._text(delta.content)
        for call in delta.tool_calls:
            out += self._close_reasoning() + self._close_text()
            out += self._call(call)
        self.finish_reason = delta.finish_reason or self.finish_reason
        return out

    def _reasoning(self, piece: str) -> list[bytes]:
        out = []
        if self.reasoning is None:
            self.reasoning = ReasoningItem(self._item_id("rs"), "in_progress", [ReasoningText("")])
            out.append(self._add(self.reasoning))
        index = self.items.index(self.reasoning)
        self.pieces.add(self.reasoning.content[0], "text", piece)
        out.append(self._event("response.reasoning_text.delta", item_id=self.reasoning.id, output_index=index, content_index=0, delta=piece))
        return out

    def _close_reasoning(self) -> list[bytes]:
        if self.reasoning is None:
            return []
        item, self.reasoning = self.reasoning, None
        self.pieces.settle(item.content[0])
        index = self.items.index(item)
        item.status = "completed"
        done = self._event("response.reasoning_text.done", item_id=item.id, output_index=index, content_index=0, text=item.content[0].text)
        return [done, self._event("response.output_item.done", output_index=index, item=item)]

    def _text(self, piece: str) -> list[bytes]:
        out = []
        if self.text is None:
            self.text = MessageItem(self._item_id("msg"), "in_progress", [])
            out.append(self._add(self.text))
            self.text.content.append(OutputText(""))
            out.append(self._event("response.content_part.added", item_id=self.text.id, output_index=len(self.items) - 1, content_index=0, part=OutputText("")))
        index = self.items.index(self.text)
        self.pieces.add(self.text.content[0], "text", piece)
        out.append(self._event("response.output_text.delta", item_id=self.text.id, output_index=index, content_index=0, delta=piece, logprobs=[]))
        return out

    def _close_text(self) -> list[bytes]:
        if self.text is None:
            return []
        item, self.text = self.text, None
        index = self.items.index(item)
        item.status = self._done_status()
        part = item.content[0]
        self.pieces.settle(part)
        return [
            self._event("response.output_text.done", item_id=item.id, output_index=index, content_index=0, text=part.text, logprobs=[]),
            self._event("response.content_part.done", item_id=item.id, output_index=index, content_index=0, part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _call(self, piece: ToolCallPiece) -> list[bytes]:
        out = []
        item = self.calls.get(piece.index)
        if item is None:
            tool = self.offered.client_name(piece.name or "")
            item = FunctionCallItem(self._item_id("fc"), "in_progress", piece.id or self._item_id("call"), tool.name, "")
            if tool.namespace is not None:
                item.namespace = tool.namespace
            self.calls[piece.index] = item
            out.append(self._add(item))
        if piece.arguments:
            self.pieces.add(item, "arguments", piece.arguments)
            out.append(self._event("response.function_call_arguments.delta", item_id=item.id, output_index=self.items.index(item), delta=piece.arguments))
        return out

    def _done_status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def finish(self) -> tuple[list[bytes], bytes]:
        if not self.started:
            self.feed(answers.ChatChunk())
        out = self._close_reasoning() + self._close_text()
        self.pieces.settle()
        for item in self.calls.values():
            index = self.items.index(item)
            item.status = self._done_status()
            out.append(self._event("response.function_call_arguments.done", item_id=item.id, output_index=index, arguments=item.arguments, name=item.name))
            out.append(self._event("response.output_item.done", output_index=index, item=item))
        self.calls = {}
        final = self._response()
        return out, self._event(f"response.{final.status}", response=final)

    # -- the answer

    def result(self) -> Response:
        return self._response()

    def _response(self, status: str | None = None) -> Response:
        """The response object as it stands (``status`` given: a snapshot while streaming)."""
        r = self.request
        if status is None:  # the whole answer so far
            self.pieces.settle()
        incomplete = status is None and self.finish_reason == "length"
        return Response(
            id=self.id,
            created_at=self.created_at,
            model=self.model,
            status=status or ("incomplete" if incomplete else "completed"),
            output=list(self.items) if status is None else [],
            usage=self.usage if status is None else None,
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            instructions=r.instructions,
            max_output_tokens=r.max_output_tokens,
            parallel_tool_calls=r.parallel_tool_calls if r.parallel_tool_calls is not None else True,
            previous_response_id=r.previous_response_id,
            store=r.store if r.store is not None else True,
            temperature=r.temperature,
            top_p=r.top_p,
            text=r.text or {"format": {"type": "text"}},
            tool_choice=r.tool_choice if r.tool_choice is not None else "auto",
            tools=r.tools or [],
            user=r.user,
            metadata=r.metadata or {},
        )


def _usage(usage: answers.Usage) -> Usage:
    prompt, completion = usage.prompt_tokens or 0, usage.completion_tokens or 0
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
    return Usage(prompt, completion, prompt + completion, InputDetails(cached or 0))


def input_json(value: Any) -> list[Any]:
    """A request's ``input`` JSON as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value or [])


# Items of an answer that go back in as input when a later request continues it.
_CARRIED = frozenset({"message", "function_call", "reasoning"})


def continued(earlier_request: Any, earlier_answer: Any) -> list[Any]:
    """The conversation ``previous_response_id`` continues, as JSON items: the earlier
    request's input, then its answer's output (its ``instructions`` are not carried over)."""
    before = earlier_request.get("input") if isinstance(earlier_request, dict) else None
    output = earlier_answer.get("output") if isinstance(earlier_answer, dict) else None
    return input_json(before) + [i for i in output or () if isinstance(i, dict) and i.get("type") in _CARRIED]
