"""A tool-using agent's calls, recorded as vLLM tokenises them, into training sequences.

Three turns with the tiny model's tokenizer and its Qwen2.5-style template: the user asks,
the assistant calls the calculator, reads the result, calls it again, reads that and
answers. Each call's prompt ids are the template's rendering of the conversation so far
(what vLLM feeds the model) and its completion ids are the assistant turn up to and
including ``<|im_end|>`` (what vLLM samples). Such calls merge into one sequence. A
template that drops earlier reasoning (as Qwen3's does) rewrites history: the calls split,
and the trainer's step and the trajectory view count the same splits. A call recorded
without ids is skipped and counted, never trained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from burnish_server.core.api.listing import Filters
from burnish_server.core.learning.policies import LoraSettings, Policy, TrainSettings
from burnish_server.core.platform.settings import Settings
from burnish_server.core.protocols.packed import pack_floats, pack_ids
from burnish_server.core.protocols.records import CallRecord
from burnish_server.store.database import Database
from burnish_server.store.reads import export_jsonl, get_trajectory
from burnish_server.store.training import TrainingCall, group_calls
from burnish_server.store.writer import Writer
from burnish_server.store.writes import PostReward
from burnish_server.trainer.sequences import SampledCall, build_sequences, training_batch
from burnish_server.trainer.tiny_model import CHAT_TEMPLATE, TinyModelSpec, build_tokenizer
from burnish_server.trainer.worker import TrainerWorker
from tests.records import chat_call

TOOLS = [
    {
        "type": "function",
        "function": {"name": "calculator", "description": "evaluate", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}},
    }
]
END_OF_TURN = "<|im_end|>"

# The tiny template, but every earlier assistant turn loses its reasoning (Qwen3 drops it from
# the assistant turns before the latest user message): a template that rewrites history.
_KEEPS = "{%- if message.content %}{{- message.content }}{%- endif %}"
_DROPS = "{%- if message.content %}{{- message.content.split('</think>')[-1].lstrip('\\n') }}{%- endif %}"
assert CHAT_TEMPLATE.count(_KEEPS) == 1
DROPS_REASONING = CHAT_TEMPLATE.replace(_KEEPS, _DROPS)


def calculator(call_id: str, expression: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}


def agent(think: bool = False) -> list[dict[str, Any]]:
    """The whole conversation: user, then (assistant, tool result) twice, then the answer."""
    reasoning = ["<think>Multiply first.</think>\n\n", "<think>Then add 5.</think>\n\n", "<think>That is all.</think>\n\n"] if think else ["", "", ""]
    return [
        {"role": "user", "content": "What is 12 * 7, plus 5?"},
        {"role": "assistant", "content": reasoning[0] + "Let me compute.", "tool_calls": [calculator("c1", "12 * 7")]},
        {"role": "tool", "tool_call_id": "c1", "content": "84"},
        {"role": "assistant", "content": reasoning[1] + "Now add 5.", "tool_calls": [calculator("c2", "84 + 5")]},
        {"role": "tool", "tool_call_id": "c2", "content": "89"},
        {"role": "assistant", "content": reasoning[2] + "The answer is 89."},
    ]


@dataclass
class Turn:
    """One call as the gateway records it from vLLM."""

    messages: list[dict[str, Any]]  # the request's conversation
    reply: dict[str, Any]
    prompt: list[int]
    completion: list[int]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(TinyModelSpec().vocab_size)  # the tiny model's (trainer/tiny_model.py)


def turns(tokenizer: Any, conversation: list[dict[str, Any]], template: str = CHAT_TEMPLATE) -> list[Turn]:
    """Each assistant turn as one call: the prompt as ``template`` renders the conversation so
    far; the completion as the model writes it (the tiny template's rendering of the turn, up to
    and including its end-of-turn token: what vLLM samples, whatever the serving template)."""
    out = []
    for i, reply in enumerate(conversation):
        if reply["role"] != "assistant":
            continue
        history = conversation[:i]
        prompt = tokenizer.apply_chat_template(history, tools=TOOLS, chat_template=template, add_generation_prompt=True, return_dict=False)
        before = tokenizer.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        whole = tokenizer.apply_chat_template([*history, reply], tools=TOOLS, tokenize=False)
        assert whole.startswith(before)
        written = whole[len(before) :]
        written = written[: written.index(END_OF_TURN) + len(END_OF_TURN)]
        out.append(Turn(history, reply, prompt, tokenizer.encode(written, add_special_tokens=False)))
    return out


def sampled(turns: list[Turn]) -> list[SampledCall]:
    return [SampledCall(t.prompt, [t.completion], [[-0.5] * len(t.completion)]) for t in turns]


def record(turn: Turn, trajectory: str, group: str | None, tokens: bool = True) -> CallRecord:
    """The call as the store keeps it; without ids where ``tokens`` is false."""
    ids: dict[str, Any] = {}
    if tokens:
        ids = {
            "prompt_token_ids": pack_ids(turn.prompt),
            "completion_token_ids": pack_ids(turn.completion),
            "completion_lengths": pack_ids([len(turn.completion)]),
            "completion_logprobs": pack_floats([-0.5] * len(turn.completion)),
        }
    request = {"model": "agent", "messages": turn.messages, "tools": TOOLS}
    response = {"object": "chat.completion", "choices": [{"index": 0, "message": turn.reply, "finish_reason": "stop"}]}
    return chat_call(request, response, trajectory_id=trajectory, group_id=group, group_size=2 if group else None, policy="agent", policy_step=0, **ids)


def test_a_three_turn_tool_agent_trains_as_one_sequence(tokenizer: Any) -> None:
    calls = turns(tokenizer, agent())
    assert len(calls) == 3
    for t in calls:  # each completion is a whole assistant turn, ended as vLLM ends it
        assert t.completion[-1] == tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert "<tool_call>" in tokenizer.decode(calls[0].completion) and "<tool_call>" in tokenizer.decode(calls[1].completion)

    merged = build_sequences(sampled(calls))
    assert merged.splits == 0
    (seq,) = merged.sequences
    assert seq.calls == 3
    assert seq.tokens == calls[-1].prompt + calls[-1].completion  # the last prompt holds every earlier turn
    # Mask 1 exactly on the three completions, where each sits in the last prompt; 0 on the
    # system prompt with the tools, the user's question and both tool results.
    spans = [range(len(t.prompt), len(t.prompt) + len(t.completion)) for t in calls]
    assert seq.mask == [int(any(p in span for span in spans)) for p in range(len(seq.tokens))]
    assert [tokenizer.decode(seq.tokens[s.start : s.stop]) for s in spans] == [tokenizer.decode(t.completion) for t in calls]
    assert seq.sampled == sum(len(t.completion) for t in calls)
    context = tokenizer.decode([tok for tok, m in zip(seq.tokens, seq.mask) if not m])
    assert "What is 12 * 7" in context and "84" in context and "89" in context and "Let me compute" not in context


def test_a_template_that_drops_earlier_reasoning_splits_every_later_call(tokenizer: Any) -> None:
    calls = turns(tokenizer, agent(think=True), DROPS_REASONING)
    assert "Multiply first" in tokenizer.decode(calls[0].completion)  # sampled...
    assert "Multiply first" not in tokenizer.decode(calls[1].prompt)  # ...and gone from the next prompt
    merged = build_sequences(sampled(calls))
    assert merged.splits == 2
    assert [s.tokens for s in merged.sequences] == [t.prompt + t.completion for t in calls]
    assert [s.mask for s in merged.sequences] == [[0] * len(t.prompt) + [1] * len(t.completion) for t in calls]
    # The same reasoning under the tiny template, which keeps it: no split.
    assert build_sequences(sampled(turns(tokenizer, agent(think=True)))).splits == 0


def test_splits_and_untokenized_calls_are_counted_in_the_batch(tokenizer: Any) -> None:
    kept = turns(tokenizer, agent(think=True))
    rewritten = turns(tokenizer, agent(think=True), DROPS_REASONING)
    rows = [TrainingCall("g", "kept", 1.0, record(t, "kept", "g")) for t in kept]
    rows += [TrainingCall("g", "rewritten", 0.0, record(t, "rewritten", "g", tokens=i != 1)) for i, t in enumerate(rewritten)]
    batch = training_batch(rows, TrainSettings())
    assert batch.untokenized == 1 and batch.splits == 1  # the third call does not extend the first
    assert [s.calls for s, _ in batch.items] == [3, 1, 1]
    assert sorted(a for _, a in batch.items) == pytest.approx([-0.7071, -0.7071, 0.7071], abs=1e-3)


def test_a_call_without_ids_is_skipped_and_counted_never_trained(tokenizer: Any) -> None:
    calls = turns(tokenizer, agent())
    rows = [TrainingCall("g", "t", 1.0, record(t, "t", "g", tokens=i != 1)) for i, t in enumerate(calls)]
    rows.append(TrainingCall("g", "other", 0.0, record(calls[0], "other", "g")))
    batch = training_batch(rows, TrainSettings())
    assert batch.untokenized == 1 and batch.splits == 0
    (seq, _), _other = batch.items
    # The third call's prompt extends the first call's turn: one sequence, where the second call's
    # reply is context (mask 0), not trained.
    assert seq.calls == 2 and seq.tokens == calls[2].prompt + calls[2].completion
    trained = [tok for tok, m in zip(seq.tokens, seq.mask) if m]
    assert trained == calls[0].completion + calls[2].completion
    assert "Now add 5" not in tokenizer.decode(trained) and "Now add 5" in tokenizer.decode(seq.tokens)

    # With only untokenized calls, a trajectory has a reward but nothing to train.
    alone = training_batch([TrainingCall("g", "t", 1.0, record(t, "t", "g", tokens=False)) for t in calls], TrainSettings())
    assert alone.items == [] and alone.untokenized == 3 and alone.rewards == [1.0]


async def test_the_trajectory_view_shows_the_same_splits_as_the_trainer(tokenizer: Any, sqlite_url: str) -> None:
    db = Database(sqlite_url)
    await db.migrate()
    writer = Writer(db)
    writer.start()
    try:
        for t in turns(tokenizer, agent(think=True)):
            await writer.write(record(t, "kept", "g"))
        for i, t in enumerate(turns(tokenizer, agent(think=True), DROPS_REASONING)):
            await writer.write(record(t, "rewritten", "g"))
            if i == 0:  # between the first and second turns, calls the trainer does not read:
                await writer.write(record(t, "rewritten", "g", tokens=False))  # no ids
                await writer.write(msgspec.structs.replace(record(t, "rewritten", "g"), status="upstream_error", http_status=500))
                judge = msgspec.structs.replace(record(t, "rewritten", "g"), model="judge", policy=None, policy_step=None)
                await writer.write(msgspec.structs.replace(judge, prompt_token_ids=pack_ids([1, 2, 3])))  # another model's
        for t in turns(tokenizer, agent(think=True), DROPS_REASONING):
            await writer.write(record(t, "alone", None))  # no group: read as its first policy's
        await writer.write(PostReward("kept", 1.0))
        await writer.write(PostReward("rewritten", 0.0))
        kept = await db.read(get_trajectory, "kept")
        rewritten = await db.read(get_trajectory, "rewritten")
        alone = await db.read(get_trajectory, "alone")
        rows = await db.read(group_calls, ["g"])
        exported = [json.loads(line) for chunk in [c async for c in export_jsonl(db.reader, Filters(project="default"))] for line in chunk.splitlines()]
    finally:
        await writer.close()
        await db.dispose()
    assert kept is not None and rewritten is not None and alone is not None
    assert [c.extends_previous for c in kept.calls] == [True, True, True] and kept.sequence_splits == 0
    assert [c.extends_previous for c in rewritten.calls] == [True, None, None, None, False, False] and rewritten.sequence_splits == 2
    # Why, per call: the template dropped the reasoning of each earlier answer (core/learning/drift.py).
    assert [c.split_reason for c in rewritten.calls] == [None, None, None, None, "reasoning_dropped", "reasoning_dropped"]
    batch = training_batch(rows, TrainSettings())
    assert batch.splits == kept.sequence_splits + rewritten.sequence_splits
    assert batch.split_reasons == {"reasoning_dropped": 2}
    assert batch.untokenized == 1  # the failed call and the judge's are not read for training at all
    assert [c.extends_previous for c in alone.calls] == [True, False, False] and alone.sequence_splits == 2
    # The export says the same of each call.
    assert {line["id"]: [(c["extends_previous"], c["split_reason"]) for c in line["calls"]] for line in exported} == {
        view.id: [(c.extends_previous, c.split_reason) for c in view.calls] for view in (kept, rewritten, alone)
    }


def test_the_step_metrics_count_splits_and_untokenized_calls(tokenizer: Any, tiny_model: Path, tmp_path: Path) -> None:
    kept = turns(tokenizer, agent(think=True))
    rewritten = turns(tokenizer, agent(think=True), DROPS_REASONING)
    rows = [TrainingCall("g", "kept", 1.0, record(t, "kept", "g")) for t in kept]
    rows += [TrainingCall("g", "rewritten", 0.0, record(t, "rewritten", "g")) for t in rewritten]
    rows.append(TrainingCall("g", "rewritten", 0.0, record(rewritten[-1], "rewritten", "g", tokens=False)))
    settings = Settings.load({}, database_url=f"sqlite+aiosqlite:///{tmp_path / 'b.db'}", data_dir=str(tmp_path / "data"), upstream="http://127.0.0.1:9")
    worker = TrainerWorker(settings)
    policy = Policy(name="agent", base_model="tiny", model_path=str(tiny_model), lora=LoraSettings(rank=8, alpha=16))
    metrics = worker.held.step(policy, rows, 1)
    worker.fleet.close()
    assert metrics.sequence_splits == 2 and metrics.untokenized_calls == 1
    assert metrics.split_reasoning_dropped == 2 and metrics.split_tool_call_rerendered == 0
    assert metrics.sequences == 4
    assert json.loads((tmp_path / "data" / "policies" / "agent" / "checkpoints" / "1" / "metrics.json").read_text())["sequence_splits"] == 2
