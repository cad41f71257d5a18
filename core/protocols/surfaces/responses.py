"""OpenAI's Responses API: ``POST /v1/responses``.

vLLM returns no token ids on it, so a policy's call is served through chat completions
(``core/protocols/translate/responses.py``). Streamed as typed events; the terminal one
(``response.completed``, ``.incomplete``, ``.failed``) carries the whole response. Read as:
instructions -> system; message items -> messages; function_call -> an assistant tool call;
function_call_output -> a tool message.
"""

from __future__ import annotations

from typing import Any

from burnish_server.core.platform.errors import Invalid
from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.conversation import Exchange, Message, text_of
from burnish_server.core.protocols.surfaces.base import RESPONSES_ERRORS, Surface
from burnish_server.core.protocols.translate import responses as translator
from burnish_server.core.protocols.wire import tool_call


class ResponsesAssembler:
    """Responses API events: the terminal event carries the whole response."""

    TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None
        self.partial_text: list[str] = []
        self.final = False

    def add(self, event: answers.ResponsesEvent) -> None:
        if event.response is not None:
            self.response = event.response
            self.final = event.type in self.TERMINAL
        elif event.type == "response.output_text.delta" and event.delta:
            self.partial_text.append(event.delta)

    def result(self) -> dict[str, Any]:
        if self.final and self.response is not None:
            return self.response
        # Cut short: keep what arrived, marked as partial.
        return {**(self.response or {"object": "response"}), "status": "incomplete", "partial_output_text": "".join(self.partial_text)}


def _responses_items(items: list[wire.ResponsesItem]) -> list[Message]:
    out: list[Message] = []
    for item in items:
        match item.type:
            case "message":  # a developer message is the system message the model was shown
                out.append(Message("system" if item.role == "developer" else item.role or "user", text_of(item.content)))
            case "function_call":
                call = tool_call(translator.flat_name(item.namespace, item.name or ""), item.arguments or "", item.call_id)
                # Calls made in one turn belong to one assistant message.
                if out and out[-1].role == "assistant" and (out[-1].tool_calls or not out[-1].content):
                    last = out.pop()
                    out.append(Message("assistant", last.content, (*last.tool_calls, call)))
                else:
                    out.append(Message("assistant", "", (call,)))
            case "function_call_output":
                out.append(Message("tool", text_of(item.output), (), item.call_id))
            case "reasoning":
                pass  # not part of the conversation a template renders or a judge scores
            case _:
                out.append(Message(item.role or "user", f"[{item.type}]"))
    return out


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as a policy's model is offered them (core/protocols/translate/responses.py: a namespace's
    functions under their flat names, hosted tools left out); as they are where that fails."""
    try:
        return translator.offer_tools(tools).tools
    except Invalid:
        return tools


def read(request: wire.ResponsesRequest, response: wire.ResponsesResponse | None) -> Exchange:
    items = request.input
    prompt = [Message("user", items)] if isinstance(items, str) else _responses_items(items or [])
    if request.instructions:
        prompt.insert(0, Message("system", request.instructions))
    tools = _tools(request.tools) if request.tools else None
    answer = _responses_items(response.output) if response else []
    merged = Message(
        "assistant",
        "\n".join(m.content for m in answer if m.content),
        tuple(c for m in answer for c in m.tool_calls),
    )
    return Exchange(prompt, tools, [merged] if response else [])


def terminal(name: str | None, data: bytes, event: answers.ResponsesEvent | None) -> bool:
    kind = event.type if event is not None else name
    return kind in ResponsesAssembler.TERMINAL


RESPONSES = Surface(
    name="responses",
    path="responses",
    request=wire.ResponsesRequest,
    response=wire.ResponsesResponse,
    event=answers.ResponsesEvent,
    read=read,
    assembler=ResponsesAssembler,
    terminal=terminal,
    errors=RESPONSES_ERRORS,
    has_choices=False,
    translator=translator,
    schema_title="ResponsesRequest",
    schema_description="OpenAI's Responses API request (model, input, previous_response_id, ...)",
)
