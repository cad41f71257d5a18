"""Recorded calls into training sequences: merge where prompts extend, split where not."""

from __future__ import annotations

from burnish_server.trainer.sequences import SampledCall, build_sequences


def test_multi_turn_calls_that_extend_merge_into_one_sequence() -> None:
    first = SampledCall(prompt=[1, 2, 3], completions=[[10, 11]], logprobs=[[-0.1, -0.2]])
    # the next prompt is everything so far, then a tool result (5, 6)
    second = SampledCall(prompt=[1, 2, 3, 10, 11, 5, 6], completions=[[12]], logprobs=[[-0.3]])
    (seq,) = build_sequences([first, second])
    assert seq.tokens == [1, 2, 3, 10, 11, 5, 6, 12]
    assert seq.mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert seq.behaviour_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3]
    assert seq.calls == 2 and seq.sampled == 3


def test_a_prompt_that_does_not_extend_starts_a_new_sequence() -> None:
    a = SampledCall(prompt=[1, 2], completions=[[10]], logprobs=[[-0.5]])
    b = SampledCall(prompt=[1, 2, 99, 7], completions=[[11]], logprobs=[[-0.6]])  # 99: re-tokenised reply
    seqs = build_sequences([a, b])
    assert [s.tokens for s in seqs] == [[1, 2, 10], [1, 2, 99, 7, 11]]
    assert [s.mask for s in seqs] == [[0, 0, 1], [0, 0, 0, 0, 1]]


def test_each_choice_of_an_n_call_is_its_own_sequence() -> None:
    call = SampledCall(prompt=[1], completions=[[5, 6], [7]], logprobs=[[-1.0, -2.0], [-3.0]])
    seqs = build_sequences([call])
    assert [(s.tokens, s.behaviour_logprobs) for s in seqs] == [([1, 5, 6], [0, -1.0, -2.0]), ([1, 7], [0, -3.0])]


def test_calls_without_logprobs_or_samples() -> None:
    rebuilt = SampledCall(prompt=[1, 2], completions=[[3]], logprobs=None, from_template=True)
    empty = SampledCall(prompt=[9], completions=[[]], logprobs=[[]])
    seqs = build_sequences([empty, rebuilt])
    assert len(seqs) == 1 and seqs[0].from_template and not seqs[0].has_behaviour_logprobs
