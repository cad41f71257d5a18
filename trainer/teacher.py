"""The teacher of on-policy distillation: its prompt for each recorded call.

The teacher is the policy's own base model with its adapter off, shown the policy's teacher
context (core/learning/policies.py: Teacher) before each conversation: context distillation. It scores
the very tokens the policy sampled, after its own prompt:

    recorded call ──(core/protocols/transcript.py: its conversation and tools)──▶ messages
    messages ──(the chat template)──▶ must equal the prompt ids vLLM recorded, else skipped
    [leading system messages] + context + [the rest] ──(the chat template)──▶ the teacher's prompt
    ... + a hint of what followed, on the last turn ──(with hindsight)──▶ the teacher's prompt for a lone attempt's answer

The check is what makes the teacher's prompt faithful: the render without the context must
give exactly the ids the policy saw, so the same render with the context in differs by the
context alone. A call it fails (vLLM served another chat template than the tokenizer's, a
surface whose request does not read back into the same conversation) is not distilled and is
counted (``teacher_unrendered_calls`` in the step's metrics), never guessed.

With hindsight (``Teacher.hindsight``), a lone attempt whose answer was followed by something
(core/learning/followups.py: the user's next turn, a tool's result) is scored by the teacher
shown that, as a note after the conversation's last turn (``hint``): the answer then moves
toward what the reply shows was wanted (OpenClaw-RL's hindsight-guided distillation). A call
with nothing after it is taught by the context alone, or not at all where there is none.
"""

from __future__ import annotations

from typing import Any

from burnish_server.core.learning.messages import Turn, with_context
from burnish_server.core.learning.policies import Teacher
from burnish_server.core.protocols.conversation import Message
from burnish_server.core.protocols.records import CallRecord
from burnish_server.core.protocols.transcript import UnreadableCall, exchange
from burnish_server.core.protocols.wire import tool_call
from burnish_server.serving.scoring import VLLMScorer
from burnish_server.trainer.sequences import Sequence


class ContextTeacher:
    """The teacher's prompts for one step's calls (a cache keyed by the recorded request: a
    group's members mostly share their first prompt). Without a context, a call's prompt is
    the one the policy saw, as recorded."""

    def __init__(self, tokenizer: Any, teacher: Teacher, template: str | None = None) -> None:
        self.tokenizer, self.template = tokenizer, template  # template: vLLM's where not the tokenizer's (serving/tool_calling.py: served_template)
        self.context = [chat(turn) for turn in teacher.context]
        self.hindsight = teacher.hindsight
        self.made: dict[tuple[bytes, tuple[int, ...], str], list[int] | None] = {}

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, chat_template=self.template
        )
        return list(ids)

    def prompt(self, call: CallRecord, recorded: list[int], followed: list[dict[str, Any]] | None = None) -> list[int] | None:
        """The teacher's prompt for a call whose prompt ids were ``recorded`` (and, with hindsight,
        the messages that ``followed`` its answer); None where it cannot be made faithfully, or
        where the teacher has nothing to show it."""
        hint = hint_of(followed) if self.hindsight and followed else None
        if hint is None and not self.context:
            return None if self.hindsight else recorded
        key = (call.request, tuple(recorded), hint or "")
        if key not in self.made:
            self.made[key] = self._prompt(call, recorded, hint)
        return self.made[key]

    def _prompt(self, call: CallRecord, recorded: list[int], hint: str | None) -> list[int] | None:
        try:
            turn = exchange(call)
        except UnreadableCall:
            return None
        messages = [m.chat() for m in turn.prompt]
        try:
            if self.render(messages, turn.tools) != recorded:
                return None
            shown = with_context(messages, self.context)
            if hint is not None:
                shown = [*shown[:-1], {**shown[-1], "content": f"{shown[-1].get('content') or ''}\n\n{hint}"}] if shown else shown
            return self.render(shown, turn.tools)
        except Exception:  # a template that refuses the conversation (jinja's own errors): not distilled
            return None


# How what followed an answer is shown to the teacher, after the conversation's last turn.
HINT = "(A note on the reply to this: the next message in the conversation was\n{followed}\nGive the reply that message shows was wanted.)"


def hint_of(followed: list[dict[str, Any]]) -> str | None:
    """What followed an answer, as the note the teacher reads; None where it holds no text."""
    text = "\n".join(
        f"[{m.get('role', '')}] {m['content'].strip()}" for m in followed if isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"].strip()
    )
    return HINT.format(followed=text) if text else None


def chat(turn: Turn) -> dict[str, Any]:
    """A context turn as the chat template takes a recorded conversation's (core/protocols/conversation.py:
    ``Message.chat``), so a worked episode's tool calls render as the policy's own would."""
    calls = tuple(tool_call(c.function.name, c.function.arguments, c.id) for c in turn.tool_calls or ())
    return Message(turn.role, turn.content or "", calls, turn.tool_call_id).chat()


def served_scores(items: list[tuple[Sequence, float]], scorer: VLLMScorer, model: str, max_len: int) -> None:
    """A teacher vLLM serves (``Teacher.model``): its logprob of each sampled token it can score,
    into ``Sequence.teacher_logprobs`` and ``taught``, as ``PolicyModel.teach`` fills them for the
    base. One request scores many calls (serving/scoring.py); a call's tokens past ``max_len``
    in the teacher's sequence are not taught, as in the trainer."""
    asked: list[tuple[list[int], int]] = []
    where: list[tuple[Sequence, int, int]] = []
    for seq, _ in items:
        seq.teacher_logprobs, seq.taught = [0.0] * len(seq.tokens), [0] * len(seq.tokens)
        for span in seq.spans:
            if span.teacher_prompt is None or span.length == 0:
                continue
            ids = [*span.teacher_prompt, *seq.tokens[span.start : span.start + span.length]][:max_len]
            if len(ids) <= len(span.teacher_prompt):
                continue
            asked.append((ids, len(span.teacher_prompt)))
            where.append((seq, span.start, len(ids) - len(span.teacher_prompt)))
    for (seq, start, length), scores in zip(where, scorer.logprobs(model, asked)):
        known, taught = seq.teacher_logprobs, seq.taught
        assert known is not None and taught is not None  # made above
        known[start : start + length] = scores
        taught[start : start + length] = [1] * length


def teacher_against_rewards(items: list[tuple[Sequence, float]]) -> tuple[int, int]:
    """Does the teacher agree with the rewards? Over the sequences that both trained on a
    reward's advantage and had tokens the teacher scored (a lone attempt with a verdict and a
    next turn, under hindsight; any group, with a context): each pair of one above its baseline
    and one below, and how many of those pairs the teacher ranks the other way, by its mean
    logprob of the sampled tokens less vLLM's (a lift, so that a teacher flatter than the policy
    everywhere ranks as well as a sharper one). About half against is a teacher that knows
    nothing of what was rewarded; most against, one that teaches the opposite (health warns)."""
    lifts: list[tuple[float, float]] = []  # (advantage, the teacher's lift)
    for seq, advantage in items:
        if not seq.grpo or advantage == 0 or seq.taught is None or seq.teacher_logprobs is None or not seq.has_behaviour_logprobs:
            continue
        taught = [i for i, t in enumerate(seq.taught) if t]
        if taught:
            lifts.append((advantage, sum(seq.teacher_logprobs[i] - seq.behaviour_logprobs[i] for i in taught) / len(taught)))
    above = [lift for advantage, lift in lifts if advantage > 0]
    below = [lift for advantage, lift in lifts if advantage < 0]
    return len(above) * len(below), sum(a < b for a in above for b in below)
