"""The teacher of on-policy distillation: its prompt for each recorded call.

The teacher is the policy's own base model with its adapter off, shown the policy's teacher
context (core/policies.py: Teacher) before each conversation: context distillation. It scores
the very tokens the policy sampled, after its own prompt:

    recorded call ──(core/transcript.py: its conversation and tools)──▶ messages
    messages ──(the chat template)──▶ must equal the prompt ids vLLM recorded, else skipped
    [leading system messages] + context + [the rest] ──(the chat template)──▶ the teacher's prompt

The check is what makes the teacher's prompt faithful: the render without the context must
give exactly the ids the policy saw, so the same render with the context in differs by the
context alone. A call it fails (vLLM served another chat template than the tokenizer's, a
surface whose request does not read back into the same conversation) is not distilled and is
counted (``teacher_unrendered_calls`` in the step's metrics), never guessed.
"""

from __future__ import annotations

from typing import Any

from burnish_server.core.policies import Teacher
from burnish_server.core.records import CallRecord
from burnish_server.core.transcript import UnreadableCall, exchange


class ContextTeacher:
    """The teacher's prompts for one step's calls (a cache keyed by the recorded request: a
    group's members mostly share their first prompt)."""

    def __init__(self, tokenizer: Any, teacher: Teacher) -> None:
        self.tokenizer = tokenizer
        self.context = [{"role": turn.role, "content": turn.content} for turn in teacher.context]
        self.made: dict[tuple[bytes, tuple[int, ...]], list[int] | None] = {}

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)

    def prompt(self, call: CallRecord, recorded: list[int]) -> list[int] | None:
        """The teacher's prompt for a call whose prompt ids were ``recorded``; None where it cannot be made faithfully."""
        key = (call.request, tuple(recorded))
        if key not in self.made:
            self.made[key] = self._prompt(call, recorded)
        return self.made[key]

    def _prompt(self, call: CallRecord, recorded: list[int]) -> list[int] | None:
        try:
            turn = exchange(call)
        except UnreadableCall:
            return None
        messages = [m.chat() for m in turn.prompt]
        try:
            if self.render(messages, turn.tools) != recorded:
                return None
            lead = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
            return self.render(messages[:lead] + self.context + messages[lead:], turn.tools)
        except Exception:  # a template that refuses the conversation (jinja's own errors): not distilled
            return None
