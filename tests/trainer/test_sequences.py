"""Recorded calls into training sequences: merge where prompts extend, split where not, and the
one rule for both (core/learning/continuity.py: Continuity)."""

from __future__ import annotations

from burnish_server.core.learning.continuity import Continuity
from burnish_server.core.learning.policies import TrainSettings
from burnish_server.core.protocols.packed import pack_floats, pack_ids
from burnish_server.core.protocols.records import CallRecord
from burnish_server.store.training import TrainingCall
from burnish_server.trainer.sequences import SampledCall, build_sequences, training_batch
from tests.records import chat_call


def test_multi_turn_calls_that_extend_merge_into_one_sequence() -> None:
    first = SampledCall(prompt=[1, 2, 3], completions=[[10, 11]], logprobs=[[-0.1, -0.2]])
    # the next prompt is everything so far, then a tool result (5, 6)
    second = SampledCall(prompt=[1, 2, 3, 10, 11, 5, 6], completions=[[12]], logprobs=[[-0.3]])
    merged = build_sequences([first, second])
    (seq,) = merged.sequences
    assert seq.tokens == [1, 2, 3, 10, 11, 5, 6, 12]
    assert seq.mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert seq.behaviour_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3]
    assert seq.calls == 2 and seq.sampled == 3
    assert merged.splits == 0


def test_a_prompt_that_does_not_extend_starts_a_new_sequence_and_counts_as_a_split() -> None:
    a = SampledCall(prompt=[1, 2], completions=[[10]], logprobs=[[-0.5]])
    b = SampledCall(prompt=[1, 2, 99, 7], completions=[[11]], logprobs=[[-0.6]])  # 99: re-tokenised reply
    merged = build_sequences([a, b])
    assert [s.tokens for s in merged.sequences] == [[1, 2, 10], [1, 2, 99, 7, 11]]
    assert [s.mask for s in merged.sequences] == [[0, 0, 1], [0, 0, 0, 0, 1]]
    assert merged.splits == 1


def test_each_choice_of_an_n_call_is_its_own_sequence_and_no_split() -> None:
    call = SampledCall(prompt=[1], completions=[[5, 6], [7]], logprobs=[[-1.0, -2.0], [-3.0]])
    merged = build_sequences([call])
    assert [(s.tokens, s.behaviour_logprobs) for s in merged.sequences] == [([1, 5, 6], [0, -1.0, -2.0]), ([1, 7], [0, -3.0])]
    assert merged.splits == 0


def test_an_n_call_between_single_calls_neither_splits_nor_moves_the_history() -> None:
    first = SampledCall(prompt=[1], completions=[[2]], logprobs=None)
    several = SampledCall(prompt=[1, 2, 3], completions=[[4], [5]], logprobs=None)  # not merged
    last = SampledCall(prompt=[1, 2, 6], completions=[[7]], logprobs=None)  # extends `first`, not `several`
    merged = build_sequences([first, several, last])
    assert merged.splits == 0
    assert [s.tokens for s in merged.sequences] == [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 7]]
    assert merged.sequences[2].mask == [0, 1, 0, 1] and merged.sequences[2].calls == 2


def test_calls_without_logprobs_or_samples() -> None:
    no_logprobs = SampledCall(prompt=[1, 2], completions=[[3]], logprobs=None)
    empty = SampledCall(prompt=[9], completions=[[]], logprobs=[[]])
    merged = build_sequences([empty, no_logprobs])
    assert len(merged.sequences) == 1 and not merged.sequences[0].has_behaviour_logprobs
    assert merged.splits == 1  # [1, 2] does not start with [9]


def test_continuity_says_per_call_whether_it_extends() -> None:
    walk = Continuity()
    verdicts = [
        walk.extends([1, 2], [[3]]),  # the first: extends the empty history
        walk.extends(None, None),  # no ids: not trained, not merged
        walk.extends([1, 2, 3, 4], [[5]]),  # extends [1, 2, 3]
        walk.extends([1, 2, 3, 4, 5, 6], [[7], [8]]),  # two choices: each its own sequence
        walk.extends([1, 2, 3, 4, 5, 6], [[9]]),  # extends [1, 2, 3, 4, 5]: the n call changed nothing
        walk.extends([1, 2, 4], [[0]]),  # history rewritten: a split
        walk.extends([1, 2, 4, 0, 1], []),  # no choice at all
        walk.extends([1, 2], [[1]]),  # shorter than the history: a split
    ]
    assert verdicts == [True, None, True, None, True, False, None, False]
    assert walk.splits == 2


def _record(trajectory: str, prompt: list[int], completion: list[int], step: int = 0) -> CallRecord:
    """A policy call of group "g" with its ids (each sampled token at logprob -0.5)."""
    return chat_call(
        {"model": "agent", "messages": []},
        None,
        trajectory_id=trajectory,
        group_id="g",
        policy="agent",
        policy_step=step,
        prompt_token_ids=pack_ids(prompt),
        completion_token_ids=pack_ids(completion),
        completion_logprobs=pack_floats([-0.5] * len(completion)),
        completion_lengths=pack_ids([len(completion)]),
    )


def _sampled(trajectory: str, reward: float, step: int) -> TrainingCall:
    return TrainingCall("g", trajectory, reward, _record(trajectory, [1, 2], [3], step))


def test_staleness_is_measured_from_the_step_trained_and_bounded_by_max_staleness() -> None:
    # sampled by agent@1, @3 and @4; the step trains from head 4
    rows = [_sampled("a", 0.0, 1), _sampled("b", 1.0, 3), _sampled("c", 0.5, 4)]
    batch = training_batch(rows, TrainSettings(), head=4)
    assert sorted(batch.staleness) == [0, 1, 3] and batch.stale == 0 and len(batch.items) == 3

    bounded = training_batch(rows, TrainSettings(max_staleness=2), head=4)
    assert sorted(bounded.staleness) == [0, 1] and bounded.stale == 1 and len(bounded.items) == 2
    # the stale call's reward still counts in its group's baseline: the others' advantages are unchanged
    assert [a for _, a in bounded.items] == [a for _, a in batch.items][1:]


# ---- credit per turn --------------------------------------------------------------------------


def _turns(trajectory: str, reward: float, call_rewards: list[float | None]) -> list[TrainingCall]:
    """A trajectory of single-choice calls that each extend the last: call k samples token 100+k
    after a tool result (50+k), so the calls merge into one sequence."""
    rows, history = [], [1, 2]
    for k, call_reward in enumerate(call_rewards):
        prompt = history + ([50 + k] if k else [])
        rows.append(TrainingCall("g", trajectory, reward, _record(trajectory, prompt, [100 + k]), call_reward))
        history = prompt + [100 + k]
    return rows


def _per_call(batch: object, trajectory_index: int) -> list[float]:
    """The advantage each sampled token of one trajectory gets, as make_micro_batch builds it."""
    import torch

    from burnish_server.trainer.policy_model import make_micro_batch

    items = batch.items  # type: ignore[attr-defined]
    built = make_micro_batch(items, 0, 4096, torch.device("cpu"))
    row = built.advantages[trajectory_index]
    return [round(v, 6) for v, m in zip(row.tolist(), built.sampled[trajectory_index].tolist()) if m]


def test_a_calls_reward_moves_its_own_and_earlier_calls_advantages_and_nothing_else() -> None:
    """Two trajectories of three calls (each merged into one sequence). Rewarding call 1 of "a"
    with 0.5 adds 0.5 to a's calls 0 and 1 (discount 1) and changes no other advantage: not a's
    call 2, not b's, not the group-relative part."""
    plain = training_batch(_turns("a", 1.0, [None, None, None]) + _turns("b", 0.0, [None, None, None]), TrainSettings())
    credited = training_batch(_turns("a", 1.0, [None, 0.5, None]) + _turns("b", 0.0, [None, None, None]), TrainSettings())
    assert [s.calls for s, _ in credited.items] == [3, 3] and credited.splits == 0 and credited.call_rewards == 1
    a_plain, b_plain = _per_call(plain, 0), _per_call(plain, 1)
    assert len(set(a_plain)) == 1 and a_plain[0] > 0 > b_plain[0]  # GRPO alone: one advantage per trajectory
    assert _per_call(credited, 0) == [round(a_plain[0] + 0.5, 6), round(a_plain[0] + 0.5, 6), a_plain[2]]
    assert _per_call(credited, 1) == b_plain


def test_the_discount_spreads_a_later_calls_reward_back_geometrically() -> None:
    rows = _turns("a", 1.0, [None, None, 1.0]) + _turns("b", 0.0, [-1.0, None, None])
    batch = training_batch(rows, TrainSettings(turn_discount=0.5))
    base_a = [a for s, a in batch.items][0]
    base_b = [a for s, a in batch.items][1]
    assert _per_call(batch, 0) == [round(base_a + 0.25, 6), round(base_a + 0.5, 6), round(base_a + 1.0, 6)]
    assert _per_call(batch, 1) == [round(base_b - 1.0, 6), round(base_b, 6), round(base_b, 6)]


def test_a_later_calls_reward_counts_even_where_that_call_is_not_trained() -> None:
    """The last call was recorded without token ids (untokenized): it trains nothing, but its
    reward still credits the calls before it."""
    rows = _turns("a", 0.0, [None, 2.0])
    rows[1] = rows[1]._replace(call=msgspec_replace(rows[1].call, prompt_token_ids=None))
    batch = training_batch(rows, TrainSettings())
    assert batch.untokenized == 1 and _per_call(batch, 0) == [2.0]


def msgspec_replace(record: object, **fields: object) -> object:
    import msgspec

    return msgspec.structs.replace(record, **fields)  # type: ignore[type-var]


def test_tokens_a_grammar_forced_stay_as_context_and_are_not_trained() -> None:
    """A recorded logprob of 0 (vLLM's, after a grammar's mask: "<tool_call>" under a forced
    call) had no alternative: no ratio can be taken against it, and it is not trained on."""
    forced = SampledCall(prompt=[1, 2], completions=[[7, 8, 9]], logprobs=[[0.0, -0.7, -0.0]])
    (seq,) = build_sequences([forced]).sequences
    assert seq.mask == [0, 0, 1, 1, 1] and seq.trained() == [0, 0, 0, 1, 0]
    unknown = SampledCall(prompt=[1, 2], completions=[[7, 8]], logprobs=None)  # nothing recorded: all trained
    (seq,) = build_sequences([unknown]).sequences
    assert seq.trained() == seq.mask == [0, 0, 1, 1]


def test_lone_attempts_take_the_advantage_given_and_groups_keep_theirs() -> None:
    """A group of one (a lone attempt) trains on the advantage its kind's baseline gave it
    (core/learning/lone.py); a group of several keeps GRPO's; a lone attempt at its baseline
    (advantage 0) is left out of the GRPO term, as a tied group is."""
    from burnish_server.core.learning.policies import TrainSettings
    from burnish_server.core.protocols.packed import pack_floats, pack_ids
    from burnish_server.store.training import TrainingCall
    from burnish_server.trainer.sequences import lone_attempts, training_batch
    from tests.records import chat_call

    def row(group: str, trajectory: str, reward: float | None, system: str = "You add.") -> TrainingCall:
        call = chat_call(
            {"model": "agent", "messages": [{"role": "system", "content": system}, {"role": "user", "content": trajectory}]},
            None,
            trajectory_id=trajectory,
            group_id=group,
            policy="agent",
            policy_step=0,
            prompt_token_ids=pack_ids([1, 2]),
            completion_token_ids=pack_ids([3, 4]),
            completion_logprobs=pack_floats([-0.5, -0.5]),
            completion_lengths=pack_ids([2]),
        )
        return TrainingCall(group, trajectory, reward, call)

    rows = [row("a", "a", 1.0), row("b", "b", 0.0), row("c", "c", 0.5, system="Other."), row("g", "g1", 1.0), row("g", "g2", 0.0)]
    attempts = lone_attempts(rows)
    assert sorted(attempts) == ["a", "b", "c"] and attempts["a"].kind == attempts["b"].kind != attempts["c"].kind
    batch = training_batch(rows, TrainSettings(), lone={"a": 0.8, "b": -0.8, "c": 0.0})
    by_reward = {round(adv, 3): seq.grpo for seq, adv in batch.items}
    assert by_reward[0.8] and by_reward[-0.8] and not by_reward[0.0]
    assert sorted(round(adv, 3) for seq, adv in batch.items) == [-0.8, -0.707, 0.0, 0.707, 0.8]
    assert batch.lone == 2
    # Without advantages given (train.lone_baseline null), a group of one has nothing to differ from.
    assert training_batch(rows, TrainSettings()).lone == 0
