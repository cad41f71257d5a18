"""A chat message as a user writes one for burnish to keep: a demonstration's turns, a teacher's
context. The chat completions API's shape, text content only, tool calls and results included.

    {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "lookup", "arguments": "{\"word\": \"cat\"}"}}]}
    {"role": "tool", "tool_call_id": "c1", "content": "a small domesticated carnivore"}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from burnish_server.core.platform.access import NO_NUL

Text = Annotated[str, Meta(max_length=200_000, pattern=NO_NUL)]


class TurnFunction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(min_length=1, max_length=256, pattern=NO_NUL)]
    arguments: Text = "{}"  # JSON text, as the chat API writes it


class TurnToolCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool call as a user posts it, checked strictly (the API's schema). Once checked it is
    read as the protocols' one ``ToolCall`` (``core/protocols/wire.py``), which reads whatever
    a recorded call holds."""

    function: TurnFunction
    id: Annotated[str, Meta(max_length=256, pattern=NO_NUL)] | None = None
    type: Literal["function"] = "function"


class Turn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A chat message, as the chat completions API writes it (text content only)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Text | None = None
    tool_calls: Annotated[list[TurnToolCall], Meta(max_length=64)] | None = None
    tool_call_id: Annotated[str, Meta(max_length=256, pattern=NO_NUL)] | None = None

    def problem(self) -> str | None:
        """What makes it no chat message, in words; None where it is one."""
        if self.role == "tool" and self.tool_call_id is None:
            return "a tool result needs its tool_call_id"
        if self.tool_calls and self.role != "assistant":
            return "only an assistant message makes tool calls"
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            return "an assistant message needs content or tool_calls"
        return None


def problem(turns: tuple[Turn, ...] | list[Turn]) -> str | None:
    """The first turn that is no chat message, in words; None where all are."""
    for i, turn in enumerate(turns):
        if (why := turn.problem()) is not None:
            return f"message {i}: {why}"
    return None


def with_context(messages: list[dict[str, Any]], context: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's chat messages with a teacher's ``context`` shown after its leading
    system messages (core/learning/policies.py: Teacher), where the trainer's teacher and its written
    answers (teacher-answers) both put it."""
    lead = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    return messages[:lead] + context + messages[lead:]
