"""Any recorded call as one conversation in chat form: what the model was shown, what it answered.

RULER shows the judge these messages, the trainer renders them with the chat template
when a call has no recorded token ids, and the Langfuse export shows them as a
generation's input and output. Each protocol maps to chat messages the way the protocols
themselves line up:

    chat completions   messages as they are
    completions        the prompt as one user message, each choice's text as an answer
    Responses API      instructions -> system; message items -> messages;
                       function_call -> an assistant tool call; function_call_output -> a tool message
    Messages           system -> system; text blocks -> content; tool_use -> an assistant tool call;
                       tool_result -> a tool message (before the rest of that user turn)

Non-text content (images, files, audio) becomes a placeholder such as ``[image_url]``:
a conversation says something was there, not what.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from burnish_server.core import wire
from burnish_server.core.records import CHAT, COMPLETIONS, MESSAGES, RESPONSES, CallRecord


class UnreadableCall(ValueError):
    """A recorded body that is not the endpoint's shape (so no conversation can be read from it)."""


class ToolCall(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    arguments: str = ""
    id: str | None = None


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """A chat message reduced to what a reader needs; copies of one message compare equal."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def chat(self) -> dict[str, Any]:
        """As an OpenAI chat message (what chat templates take; tool arguments parsed where JSON)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def render(self) -> str:
        """As plain text, for a judge to read."""
        head = f"[{self.role}" + (f" {self.tool_call_id}" if self.tool_call_id else "") + "]"
        lines = [head]
        if self.content:
            lines.append(self.content)
        lines += [f"-> calls {c.name}({c.arguments})" for c in self.tool_calls]
        return "\n".join(lines)


class Exchange(msgspec.Struct, frozen=True):
    """One call: the conversation shown to the model, the tools it was offered (OpenAI chat
    form: ``{"type": "function", "function": {...}}``), and one answer per choice."""

    prompt: list[Message]
    tools: list[dict[str, Any]] | None
    answers: list[Message]


def exchange(call: CallRecord) -> Exchange:
    """Read a recorded call's conversation; ``UnreadableCall`` if its bodies are not its endpoint's shape."""
    try:
        request = wire.decode_request(call.endpoint, call.request)
        response = wire.decode_response(call.endpoint, call.response)
    except KeyError:
        raise UnreadableCall(f"no reader for endpoint {call.endpoint!r}") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise UnreadableCall(f"a {call.endpoint} call that is not one: {exc}") from None
    # The decoders above picked the request and response structs by endpoint: the reader matches.
    return _READERS[call.endpoint](request, response)


def conversation(calls: Iterable[CallRecord]) -> list[Message]:
    """A trajectory's calls, in order, as one conversation: a call whose prompt repeats the
    conversation so far adds only what is new; one that does not (the agent rewrote its
    history) adds all of its messages. A call that cannot be read adds a note saying so."""
    out: list[Message] = []
    for call in calls:
        try:
            turn = exchange(call)
        except UnreadableCall:
            out.append(Message("system", f"[a {call.endpoint} call that could not be read]"))
            continue
        out += turn.prompt[len(out) :] if turn.prompt[: len(out)] == out else turn.prompt
        out += turn.answers[:1]
    return out


# ---- per protocol ---------------------------------------------------------------------------


def _text(content: wire.Content | list[wire.Block]) -> str:
    """Content as text: strings as they are, text parts joined, other parts named."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.text is not None and part.type in ("text", "input_text", "output_text"):
            parts.append(part.text)
        else:
            parts.append(f"[{part.type}]")
    return "\n".join(parts)


def _chat_message(m: wire.ChatMessage) -> Message:
    calls = tuple(ToolCall(c.function.name, c.function.arguments, c.id) for c in m.tool_calls or ())
    return Message(m.role, _text(m.content), calls, m.tool_call_id)


def _chat(request: wire.ChatRequest, response: wire.ChatResponse | None) -> Exchange:
    choices = sorted(response.choices, key=lambda c: c.index) if response else []
    answers = [_chat_message(c.message) for c in choices]
    return Exchange([_chat_message(m) for m in request.messages], request.tools, answers)


def _completion(request: wire.CompletionRequest, response: wire.CompletionResponse | None) -> Exchange:
    prompt = request.prompt
    if isinstance(prompt, list):  # a batch of prompts: the first, if it is text
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else "[token ids]" if prompt else ""
    choices = sorted(response.choices, key=lambda c: c.index) if response else []
    return Exchange([Message("user", prompt or "")], None, [Message("assistant", c.text) for c in choices])


def _responses_items(items: list[wire.ResponsesItem]) -> list[Message]:
    out: list[Message] = []
    for item in items:
        match item.type:
            case "message":
                out.append(Message(item.role or "user", _text(item.content)))
            case "function_call":
                call = ToolCall(item.name or "", item.arguments or "", item.call_id)
                # Calls made in one turn belong to one assistant message.
                if out and out[-1].role == "assistant" and (out[-1].tool_calls or not out[-1].content):
                    last = out.pop()
                    out.append(Message("assistant", last.content, (*last.tool_calls, call)))
                else:
                    out.append(Message("assistant", "", (call,)))
            case "function_call_output":
                out.append(Message("tool", _text(item.output), (), item.call_id))
            case "reasoning":
                pass  # not part of the conversation a template renders or a judge scores
            case _:
                out.append(Message(item.role or "user", f"[{item.type}]"))
    return out


def _tool_from_responses(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses API function tool (flat) in the chat form; other tools as they are."""
    if tool.get("type") == "function" and "function" not in tool:
        spec = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        return {"type": "function", "function": spec}
    return tool


def _responses(request: wire.ResponsesRequest, response: wire.ResponsesResponse | None) -> Exchange:
    items = request.input
    prompt = [Message("user", items)] if isinstance(items, str) else _responses_items(items or [])
    if request.instructions:
        prompt.insert(0, Message("system", request.instructions))
    tools = [_tool_from_responses(t) for t in request.tools] if request.tools else None
    answer = _responses_items(response.output) if response else []
    merged = Message(
        "assistant",
        "\n".join(m.content for m in answer if m.content),
        tuple(c for m in answer for c in m.tool_calls),
    )
    return Exchange(prompt, tools, [merged] if response else [])


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
                out.append(Message("tool", result if isinstance(result, str) else _text(result), (), block.tool_use_id))
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


def _messages(request: wire.MessagesRequest, response: wire.MessagesResponse | None) -> Exchange:
    prompt: list[Message] = []
    if request.system:
        prompt.append(Message("system", _text(request.system)))
    for m in request.messages:
        prompt += _blocks_to_messages(m.role, m.content)
    tools = [_tool_from_anthropic(t) for t in request.tools] if request.tools else None
    answers = _blocks_to_messages("assistant", response.content)[-1:] if response else []
    return Exchange(prompt, tools, answers)


def _arguments(text: str) -> Any:
    """Tool-call arguments parsed from their JSON text (chat templates expect an object); the text if not JSON."""
    try:
        return msgspec.json.decode(text) if text else {}
    except msgspec.DecodeError:
        return text


_READERS: dict[str, Callable[[Any, Any], Exchange]] = {CHAT: _chat, COMPLETIONS: _completion, RESPONSES: _responses, MESSAGES: _messages}
