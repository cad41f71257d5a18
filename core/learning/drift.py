"""Why a call's prompt did not extend its trajectory so far: the drift report.

Where a call's prompt ids start with the previous call's prompt and completion, the trainer
merges the two into one sequence (``core/learning/continuity.py: Continuity``). Where they do not, a new
sequence starts: nothing is lost (each sequence trains on exactly what was sampled, in the
context it was sampled in), but the shared context is computed twice, and a user may want
to know why. The first token where the prompt leaves the history, and the two calls' bodies,
tell:

    another_model         the previous answer is not the one this prompt shows in its place:
                          another model answered that turn, or the agent edited the answer
    system_changed        the system prompt (or instructions) is not the one before
    prompt_cut            earlier turns were dropped or shortened (a context window, a summary)
    history_rewritten     earlier turns were changed some other way
    tool_call_rerendered  the previous answer was a tool call, which the chat template wrote
                          back in tokens other than the ones the model sampled
    reasoning_dropped     the previous answer had reasoning, which the template left out
    retokenized           the previous answer came back as text, tokenized otherwise

The first four name something the agent did; the last three, the chat template
(docs/health.md lists what a user can change for each).
"""

from __future__ import annotations

from typing import Any

import msgspec

from burnish_server.core.protocols.records import CallRecord
from burnish_server.core.protocols.transcript import Exchange, UnreadableCall, exchange

REASONS = (
    "another_model",
    "system_changed",
    "prompt_cut",
    "history_rewritten",
    "tool_call_rerendered",
    "reasoning_dropped",
    "retokenized",
)


def split_reason(before: CallRecord, call: CallRecord) -> str:
    """Why ``call``'s prompt does not extend ``before``'s prompt and completion (two
    single-choice calls of one trajectory, with token ids, ``before`` the one merged last)."""
    tokens, previous = call.tokens(), before.tokens()
    assert tokens is not None and previous is not None and tokens.prompt is not None and previous.prompt is not None and previous.completions
    history = previous.prompt + previous.completions[0]
    prompt = tokens.prompt
    leaves = next((i for i, (a, b) in enumerate(zip(prompt, history)) if a != b), min(len(prompt), len(history)))
    now, then = _read(call), _read(before)
    if now is None or then is None or not then.answers:
        return "retokenized" if leaves >= len(previous.prompt) else "history_rewritten"
    if leaves < len(previous.prompt):  # the context before the previous answer changed
        if _system(then) != _system(now):
            return "system_changed"
        if len(prompt) < len(previous.prompt) or len(now.prompt) < len(then.prompt):
            return "prompt_cut"
        return "history_rewritten"
    # The previous answer, as this prompt shows it (where it should be).
    answer = then.answers[0]
    shown = now.prompt[len(then.prompt)] if len(now.prompt) > len(then.prompt) else None
    if shown is None or shown.role != "assistant":
        return "history_rewritten"
    if [(c.function.name, _parsed(c.function.arguments)) for c in shown.tool_calls] != [
        (c.function.name, _parsed(c.function.arguments)) for c in answer.tool_calls
    ]:
        return "another_model"
    # Reasoning first: a template that drops it leaves the rest of the answer, calls included, as it was.
    if _has_reasoning(_answer(before)):
        return "reasoning_dropped"
    if answer.tool_calls:
        return "tool_call_rerendered"
    if shown.content.strip() != answer.content.strip():
        return "another_model"
    return "retokenized"


def _parsed(arguments: str) -> Any:
    try:
        return msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        return arguments


def _read(call: CallRecord) -> Exchange | None:
    try:
        return exchange(call)
    except UnreadableCall:
        return None


def _system(turn: Exchange) -> str | None:
    first = turn.prompt[0] if turn.prompt else None
    return first.content if first is not None and first.role in ("system", "developer") else None


def _answer(call: CallRecord) -> Any:
    try:
        return msgspec.json.decode(call.response) if call.response else None
    except msgspec.DecodeError:
        return None


def _has_reasoning(answer: Any) -> bool:
    """Reasoning in an answer, on any surface: chat's ``reasoning_content``/``reasoning`` or a
    ``<think>`` block left in the text, a Responses ``reasoning`` item, a Messages ``thinking`` block."""
    if not isinstance(answer, dict):
        return False
    for choice in answer.get("choices") or []:
        message = (choice.get("message") or {}) if isinstance(choice, dict) else {}
        if message.get("reasoning_content") or message.get("reasoning") or "<think>" in str(message.get("content") or ""):
            return True
    items = [*(answer.get("output") or []), *(answer.get("content") or [])]
    return any(isinstance(item, dict) and item.get("type") in ("reasoning", "thinking") for item in items)
