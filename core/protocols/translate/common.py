"""What both translated surfaces share: server-sent events, a chat delta, tool arguments."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import msgspec

from burnish_server.core.platform.errors import Invalid
from burnish_server.core.protocols import answers

_encode = msgspec.json.Encoder().encode

# What a policy does with a tool the client offers that only the client's own provider runs (a
# hosted tool: the Responses API's web_search or image_generation, Anthropic's server tools;
# a policy's serving.hosted_tools): "omit" leaves it out of what the model sees and says so
# (X-Burnish-Omitted-Tools, the recorded call's adjustments); "refuse" answers 400.
HostedTools = Literal["omit", "refuse"]


def sse(kind: str, data: Any) -> bytes:
    """One server-sent event with a name, as both the Responses API and Anthropic write them."""
    return b"event: " + kind.encode() + b"\ndata: " + _encode(data) + b"\n\n"


@dataclass
class ToolCallPiece:
    """A piece of a streamed tool call: the first piece of each call carries its id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class Delta:
    """What one chat completion chunk adds to choice 0 (the translated surfaces have one choice)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallPiece] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


def delta_of(chunk: answers.ChatChunk) -> Delta:
    """The choice-0 delta of a chat completion chunk (vLLM's field names)."""
    out = Delta()
    for choice in chunk.choices or ():
        if choice.index != 0:
            continue
        if (delta := choice.delta) is not None:
            out.reasoning += delta.reasoning_content or delta.reasoning or ""
            out.content += delta.content or ""
            for call in delta.tool_calls or ():
                name, arguments = (call.function.name, call.function.arguments) if call.function else (None, None)
                out.tool_calls.append(ToolCallPiece(call.index or 0, call.id, name, arguments or ""))
        out.finish_reason = choice.finish_reason or out.finish_reason
        out.stop_reason = choice.stop_reason if choice.stop_reason is not None else out.stop_reason
    return out


def usage_of(chunk: answers.ChatChunk) -> answers.Usage | None:
    """The chunk's token counts, where it carries them (the last chunk of a stream)."""
    return msgspec.convert(chunk.usage, answers.Usage) if chunk.usage is not None else None


def completion_as_chunk(completion: answers.ChatCompletion) -> answers.ChatChunk:
    """A whole chat completion as one chunk, so a plain answer takes the stream's code path."""
    choices = []
    for choice in completion.choices:
        message = choice.message or answers.ChatMessage()
        calls = [answers.ToolCallDelta(i, c.id, c.type, c.function) for i, c in enumerate(message.tool_calls or ())]
        delta = answers.ChatDelta(content=message.content, reasoning_content=message.reasoning_content, reasoning=message.reasoning, tool_calls=calls)
        choices.append(answers.ChatChunkChoice(choice.index, delta, choice.finish_reason, choice.stop_reason))
    return answers.ChatChunk(usage=completion.usage, prompt_token_ids=completion.prompt_token_ids, choices=choices)


Answer = TypeVar("Answer")


class StreamedFields:
    """Text a stream writes in pieces into a field of an answer's struct: each piece is
    appended, and the field is written once, by ``settle``. (Adding each piece to the field's
    string copies the whole string every time: quadratic in a long answer, 1.5 s of the
    event loop's time for 32,000 pieces.)"""

    def __init__(self) -> None:
        self._open: dict[tuple[int, str], tuple[Any, list[str]]] = {}

    def add(self, owner: Any, name: str, piece: str) -> None:
        entry = self._open.get((id(owner), name))
        if entry is None:
            entry = self._open[(id(owner), name)] = (owner, [getattr(owner, name)])
        entry[1].append(piece)

    def settle(self, owner: Any = None) -> None:
        """Write the pieces so far into their fields: ``owner``'s, or every one."""
        for key, (held, pieces) in list(self._open.items()):
            if owner is None or held is owner:
                setattr(held, key[1], "".join(pieces))
                del self._open[key]


class Translator(ABC, Generic[Answer]):
    """Chat completion chunks in, a surface's events out; ``result()`` is what they add up to."""

    @abstractmethod
    def feed(self, chunk: answers.ChatChunk) -> list[bytes]:
        """The events one chat completion chunk makes (the first call also opens the answer)."""

    @abstractmethod
    def finish(self) -> tuple[list[bytes], bytes]:
        """The events that close the answer, then its terminal event (which the gateway holds
        until the call is recorded)."""

    @abstractmethod
    def result(self) -> Answer:
        """What the stream added up to so far (all of it once ``finish`` ran)."""

    def answer(self, completion: dict[str, Any]) -> Answer:
        """A plain (non-streamed) chat completion, through the stream's code path as one chunk;
        ``msgspec.ValidationError`` if it is not one."""
        self.feed(completion_as_chunk(msgspec.convert(completion, answers.ChatCompletion)))
        self.finish()
        return self.result()


class ToolName(msgspec.Struct, frozen=True):
    """A tool as the client named it: a name, in a namespace or none."""

    name: str
    namespace: str | None = None


class Offered(msgspec.Struct, frozen=True, kw_only=True):
    """The client's tools as the model is offered them: chat function tools, the ones left out
    (hosted tools a policy cannot run, by the policy's ``serving.hosted_tools``), and the
    client's name of each chat tool whose name differs (a namespace's function)."""

    tools: list[dict[str, Any]] = []
    omitted: tuple[str, ...] = ()
    names: dict[str, ToolName] = {}

    def client_name(self, chat_name: str) -> ToolName:
        return self.names.get(chat_name) or ToolName(chat_name)


def hosted(kind: str, hosted_tools: HostedTools, param: str) -> str:
    """A hosted tool's name for ``Offered.omitted``; ``Invalid`` where the policy refuses them."""
    if hosted_tools == "refuse":
        raise Invalid(
            f"the hosted tool {kind!r} is not supported for a policy (its serving.hosted_tools is 'refuse'): burnish serves policies through chat completions",
            "unsupported",
            param,
        )
    return kind


def unsupported(what: str, param: str) -> Invalid:
    return Invalid(f"{what} is not supported for a policy: burnish serves policies through chat completions", "unsupported", param)


def check_tool(name: Any, schema: Any, param: str) -> None:
    """A function tool needs a name and, if it has one, a JSON schema object for its input."""
    if not isinstance(name, str) or not name:
        raise Invalid("a function tool needs a name", "invalid_request", f"{param}.name")
    if schema is not None and not isinstance(schema, dict):
        raise Invalid("a tool's parameters must be a JSON schema object", "invalid_request", param)
