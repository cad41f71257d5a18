"""A conversation in chat form, whatever protocol it was spoken in: what a reader needs of it.

Each protocol (``core/protocols/surfaces/``) reads its requests and answers into an ``Exchange`` of
``Message``s; ``core/protocols/transcript.py`` reads a recorded call, and a trajectory, that way.
"""

from __future__ import annotations

from typing import Any

import msgspec

from burnish_server.core.platform.errors import Invalid
from burnish_server.core.protocols import wire
from burnish_server.core.protocols.wire import ToolCall


class UnreadableCall(Invalid, ValueError):
    """A recorded body that is not the endpoint's shape (so no conversation can be read from it)."""

    default_code = "unreadable_call"


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
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": arguments_of(c.function.arguments)}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def render(self) -> str:
        """As plain text, for a judge to read."""
        head = f"[{self.role}" + (f" {self.tool_call_id}" if self.tool_call_id else "") + "]"
        lines = [head]
        if self.content:
            lines.append(self.content)
        lines += [f"-> calls {c.function.name}({c.function.arguments})" for c in self.tool_calls]
        return "\n".join(lines)


class Exchange(msgspec.Struct, frozen=True):
    """One call: the conversation shown to the model, the tools it was offered (OpenAI chat
    form: ``{"type": "function", "function": {...}}``), and one answer per choice."""

    prompt: list[Message]
    tools: list[dict[str, Any]] | None
    answers: list[Message]


def text_of(content: wire.Content | list[wire.Block]) -> str:
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


def arguments_of(text: str) -> Any:
    """Tool-call arguments parsed from their JSON text (chat templates expect an object); the text if not JSON."""
    try:
        return msgspec.json.decode(text) if text else {}
    except msgspec.DecodeError:
        return text
