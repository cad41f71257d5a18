"""Demonstrations: conversations a user posts for a policy to imitate (supervised fine-tuning).

A demonstration is a chat conversation whose assistant turns are what the policy should say,
tool calls included. The gateway records each as one call of a trajectory of its own, in a
group of its own closed at once (``close_reason`` "demonstration"): a chat.completions call
with the status ``demonstration`` (posted, never served), the conversation before its last
assistant turn as the request, that turn as the answer. Every reader sees it as any other call
(the trajectory page, the export, Langfuse), marked by its status; the trainer renders it with
the chat template (trainer/demonstrations.py) and trains its assistant turns alone, for a
policy whose objective has ``sft``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from burnish_server.core.learning import messages
from burnish_server.core.learning.messages import Turn
from burnish_server.core.protocols.records import DEMONSTRATION, CallRecord

__all__ = ["DEMONSTRATION", "Demonstration", "DemonstrationsIn", "record"]

MAX_DEMONSTRATIONS = 1000  # a request's


class Demonstration(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One conversation; every assistant turn is trained, the last one at least."""

    messages: Annotated[list[Turn], Meta(min_length=2, max_length=1000)]
    tools: Annotated[list[dict[str, Any]], Meta(max_length=256)] | None = None

    def problem(self) -> str | None:
        """What makes it no demonstration, in words; None where it is one."""
        if self.messages[-1].role != "assistant":
            return "its last message must be the assistant's (what the policy should say)"
        return messages.problem(self.messages)


class DemonstrationsIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /v1/demonstrations``: conversations for ``policy`` to imitate."""

    policy: Annotated[str, Meta(min_length=1, max_length=128)]
    data: Annotated[list[Demonstration], Meta(min_length=1, max_length=MAX_DEMONSTRATIONS)]


def record(demonstration: Demonstration, policy: str, trajectory_id: str, now: datetime) -> CallRecord:
    """A demonstration as the call the store keeps: its own trajectory and group (both
    ``trajectory_id``), the last assistant turn as the answer."""
    *before, last = demonstration.messages
    request: dict[str, Any] = {"model": policy, "messages": msgspec.to_builtins(before)}
    if demonstration.tools is not None:
        request["tools"] = demonstration.tools
    answer = {"object": "chat.completion", "model": policy, "choices": [{"index": 0, "message": msgspec.to_builtins(last), "finish_reason": "stop"}]}
    return CallRecord(
        trajectory_id=trajectory_id,
        group_id=trajectory_id,
        group_size=1,
        endpoint="chat.completions",
        model=policy,
        stream=False,
        status=DEMONSTRATION,
        http_status=None,
        request=msgspec.json.encode(request),
        response=msgspec.json.encode(answer),
        started_at=now,
        finished_at=now,
        policy=policy,
    )
