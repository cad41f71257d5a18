"""Why a trajectory's call did not extend the one before it (core/learning/drift.py), per call and per
step: each reason from a pair of recorded calls made by hand, then through the trainer's batch."""

from __future__ import annotations

from typing import Any

import pytest

from burnish_server.core.learning.drift import REASONS, split_reason
from burnish_server.core.learning.policies import TrainSettings
from burnish_server.core.protocols.packed import pack_floats, pack_ids
from burnish_server.core.protocols.records import CallRecord
from burnish_server.store.training import TrainingCall
from burnish_server.trainer.sequences import training_batch
from tests.records import chat_call

SYSTEM = {"role": "system", "content": "Be brief."}
ASK = {"role": "user", "content": "What is the secret of apple?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "apple"}'}}
# Token ids: the first prompt [1, 2, 3] (system, user), its completion [10, 11].
FIRST_PROMPT, FIRST_COMPLETION = [1, 2, 3], [10, 11]


def record(messages: list[dict[str, Any]], answer: dict[str, Any], prompt: list[int], completion: list[int]) -> CallRecord:
    return chat_call(
        {"model": "agent", "messages": messages},
        {"id": "x", "object": "chat.completion", "created": 0, "model": "agent", "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]},
        trajectory_id="t",
        group_id="g",
        policy="agent",
        policy_step=0,
        prompt_token_ids=pack_ids(prompt),
        completion_token_ids=pack_ids(completion),
        completion_logprobs=pack_floats([-0.1] * len(completion)),
        completion_lengths=pack_ids([len(completion)]),
    )


def first(answer: dict[str, Any]) -> CallRecord:
    return record([SYSTEM, ASK], answer, FIRST_PROMPT, FIRST_COMPLETION)


TOOL_ANSWER = {"role": "assistant", "content": None, "tool_calls": [CALL]}
TEXT_ANSWER = {"role": "assistant", "content": "It is 41."}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "41"}
THEN = {"role": "user", "content": "And pear?"}

CASES = {
    # The previous answer came back (same call, same text), but in other tokens than sampled.
    "tool_call_rerendered": (TOOL_ANSWER, [SYSTEM, ASK, TOOL_ANSWER, RESULT], [1, 2, 3, 10, 12, 20]),
    "retokenized": (TEXT_ANSWER, [SYSTEM, ASK, TEXT_ANSWER, THEN], [1, 2, 3, 10, 12, 21]),
    "reasoning_dropped": (
        {"role": "assistant", "content": "It is 41.", "reasoning_content": "apple maps to 41"},
        [SYSTEM, ASK, TEXT_ANSWER, THEN],
        [1, 2, 3, 12, 21],
    ),
    # The agent showed another answer in its place.
    "another_model": (TEXT_ANSWER, [SYSTEM, ASK, {"role": "assistant", "content": "Forty-one."}, THEN], [1, 2, 3, 13, 21]),
    # Earlier context changed.
    "system_changed": (TEXT_ANSWER, [{"role": "system", "content": "Be verbose."}, ASK, TEXT_ANSWER, THEN], [1, 9, 3, 10, 11, 21]),
    "prompt_cut": (TEXT_ANSWER, [SYSTEM, THEN], [1, 21]),
    "history_rewritten": (TEXT_ANSWER, [SYSTEM, {"role": "user", "content": "What is the secret of APPLE?"}, TEXT_ANSWER, THEN], [1, 2, 4, 10, 11, 21]),
}


@pytest.mark.parametrize("reason", list(CASES))
def test_each_reason(reason: str) -> None:
    answer, messages, prompt = CASES[reason]
    assert split_reason(first(answer), record(messages, {"role": "assistant", "content": "ok"}, prompt, [30])) == reason
    assert reason in REASONS


def test_the_trainer_counts_each_steps_splits_by_reason() -> None:
    rows = []
    for i, reason in enumerate(["tool_call_rerendered", "tool_call_rerendered", "prompt_cut"]):
        answer, messages, prompt = CASES[reason]
        before = first(answer)
        after = record(messages, {"role": "assistant", "content": "ok"}, prompt, [30])
        rows += [TrainingCall("g", f"t{i}", float(i), before), TrainingCall("g", f"t{i}", float(i), after)]
    batch = training_batch(rows, TrainSettings())
    assert batch.splits == 3 and batch.split_reasons == {"tool_call_rerendered": 2, "prompt_cut": 1}
