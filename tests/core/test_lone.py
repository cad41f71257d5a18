"""Lone attempts' arithmetic (core/learning/lone.py): the kind of a request, the kept baseline, the advantages."""

from __future__ import annotations

import json
import statistics

import pytest

from burnish_server.core.learning.lone import LONE_ADVANTAGE_LIMIT, LONE_MIN_KEPT, LONE_WINDOW, Attempt, Baseline, kind_of, lone_advantages, moved_baselines
from tests.store.test_store import record


def chat(system: str | None, user: str, tools: list[str] = ()) -> bytes:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    body = {"model": "agent", "messages": messages}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": t, "parameters": {}}} for t in tools]
    return json.dumps(body).encode()


def test_a_kind_is_the_system_prompt_and_the_tools_not_the_question() -> None:
    def kind(request: bytes) -> str:
        return kind_of(record("t", request=request))

    assert kind(chat("You add.", "1 + 1?")) == kind(chat("You add.", "2 + 5?"))
    assert kind(chat("You add.", "1 + 1?")) != kind(chat("You multiply.", "1 + 1?"))
    assert kind(chat(None, "hi", ["lookup"])) == kind(chat(None, "other", ["lookup"])) != kind(chat(None, "hi", ["search"]))
    assert kind(b"not json") == ""


def test_the_kept_baseline_is_the_mean_and_variance_then_a_moving_average() -> None:
    rewards = [0.0, 1.0, 0.5, 0.25]
    kept = Baseline().moved(rewards)
    assert kept.count == 4 and kept.mean == pytest.approx(statistics.fmean(rewards)) and kept.variance == pytest.approx(statistics.pvariance(rewards))
    # Long past the window, old rewards fade: a policy that got better moves its baseline up.
    kept = Baseline().moved([0.0] * 1000 + [1.0] * LONE_WINDOW * 4)
    assert kept.mean > 0.95


def test_advantages_against_the_kept_baseline_else_the_steps_own() -> None:
    attempts = {"a": Attempt("k", 1.0), "b": Attempt("k", 0.0), "c": Attempt("solo", 1.0)}
    # No kept baseline: the step's own attempts of a kind; a kind alone in the step learns nothing.
    got = lone_advantages(attempts, None)
    assert got["a"] == pytest.approx(-got["b"]) and got["a"] > 0 and got["c"] == 0.0
    # A kept baseline, once it has enough rewards, is the one used, for a kind alone in the step too.
    kept = {"solo": Baseline().moved([0.0, 0.5] * (LONE_MIN_KEPT // 2)), "k": Baseline().moved([0.0])}
    got = lone_advantages(attempts, kept)
    assert got["c"] == pytest.approx((1.0 - 0.25) / (0.25 + 1e-4)) and got["a"] == pytest.approx(-got["b"])
    # A spread near 0 does not make one reward weigh thousands.
    flat = {"k": Baseline(count=100, mean=0.0, variance=0.0)}
    assert lone_advantages({"a": Attempt("k", 1.0)}, flat)["a"] == LONE_ADVANTAGE_LIMIT
    assert lone_advantages({"a": Attempt("k", 1.0)}, flat, scale=False)["a"] == 1.0


def test_a_step_moves_each_kinds_baseline_by_its_rewards() -> None:
    moved = moved_baselines({"k": Baseline().moved([0.0, 0.0])}, {"a": Attempt("k", 1.0), "b": Attempt("new", 0.5)})
    assert moved["k"].count == 3 and moved["k"].mean == pytest.approx(1 / 3) and moved["new"] == Baseline().moved([0.5])
