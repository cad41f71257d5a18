"""The task runner (burnish.tasks) against a real gateway and vLLM: a reasoning-gym task played
in groups, each reply scored by the task's own ``score_answer`` and posted as its reward, the
held-out questions answered by pinned versions and never trained on; a TextArena game played
as one trajectory of several calls; a user's own adapter run from the ``burnish-tasks``
command. (SmolLM2 through the default ``burnish up``: tests/e2e/test_default_model.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from burnish import AsyncClient
from burnish.tasks import Chat, Schedule, Score, evaluate, train
from burnish.tasks.cli import main as burnish_tasks
from burnish.tasks.cli import setting
from burnish.tasks.reasoning_gym import ReasoningGym
from burnish.tasks.textarena import TextArena
from burnish_server.serving.process import VLLMServer
from tests.conftest import ADMIN_TOKEN

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def listed(gw: Any, path: str, **params: Any) -> list[dict[str, Any]]:
    with gw.client() as c:
        r = c.get(path, params={"limit": 200, **params})
        assert r.status_code == 200, r.text
        return r.json()["data"]


def test_a_reasoning_gym_task_is_played_in_groups_scored_by_its_own_verifier_and_held_out_by_version(make_gateway, vllm: VLLMServer, tmp_path: Path) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    # No trainer here: the step the runner waits for is never due (8 groups a step, 4 played).
    gw.create_policy("agent", "tiny", train={"groups_per_step": 8})
    env = ReasoningGym("chain_sum", CHAIN_SUM, held_out=4)
    schedule = Schedule(rounds=2, eval_every=1, groups=2, size=3, max_tokens=8)

    async def run() -> Any:
        async with AsyncClient(gw.url, admin_token=ADMIN_TOKEN) as client:
            return await train(client, env, "agent", schedule, plot=tmp_path / "curve.png", log=lambda _: None)

    curve = asyncio.run(run())
    assert [(e.round, e.step) for e in curve.evals] == [(0, 0), (1, 0), (2, 0)] and len(curve.round_reward) == 2
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train_set, held_out = env.split()
    questions = {e["question"]: e for e in [*held_out, *train_set[:4]]}
    played = listed(gw, "/v1/trajectories", eval="false")
    assert len(played) == 2 * 2 * 3 and len({m["group_id"] for m in played}) == 4
    for group_id in {m["group_id"] for m in played}:
        with gw.client() as c:
            group = c.get(f"/v1/groups/{group_id}").json()
        assert group["state"] == "closed" and group["size"] == group["rewarded"] == 3, group
    for m in played:
        t = gw.trajectory(m["id"])
        (call,) = t["calls"]
        question = call["request"]["messages"][-1]["content"].removesuffix("\nGive only the final answer.")
        reply = call["response"]["choices"][0]["message"]["content"]
        assert call["request"]["model"] == "agent" and call["request"]["temperature"] == 0.7
        # The reward is reasoning-gym's own grade of the reply as recorded.
        assert t["reward"] == env.score(reply, questions[question]) and question not in {e["question"] for e in held_out}
    held = listed(gw, "/v1/trajectories", eval="true")
    assert len(held) == 3 * 4  # three evaluations of the four held-out questions
    for m in held[:4]:
        (call,) = gw.trajectory(m["id"])["calls"]
        assert call["request"]["model"] == "agent@0" and call["request"]["temperature"] == 0.0
        assert call["request"]["messages"][-1]["content"].removesuffix("\nGive only the final answer.") in {e["question"] for e in held_out}


def test_a_textarena_game_is_one_trajectory_of_moves_each_call_extending_the_last(make_gateway, vllm: VLLMServer) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny")
    env = TextArena("GuessTheNumber-v0", held_out=2, max_moves=4)

    async def run() -> tuple[float, dict[str, float], list[tuple[str, float]]]:
        async with AsyncClient(gw.url, admin_token=ADMIN_TOKEN) as client:
            return await evaluate(client, env, env.split()[1], "agent", 0, Schedule(rounds=0, max_tokens=8))

    score, components, replies = asyncio.run(run())
    assert 0.0 <= score <= 1.0 and 1 <= components["moves"] <= 4
    assert len(replies) == 2 and sum(r for _, r in replies) / 2 == pytest.approx(score)  # each game's last move, with its score
    episodes = [gw.trajectory(m["id"]) for m in listed(gw, "/v1/trajectories", eval="true")]
    assert len(episodes) == 2
    for t in episodes:
        calls = t["calls"]
        assert len(calls) == t["reward_components"]["moves"]
        assert "guess" in calls[0]["request"]["messages"][0]["content"].lower()
        for before, after in zip(calls, calls[1:]):
            sent, answered = before["request"]["messages"], before["response"]["choices"][0]["message"]["content"]
            # The next call sends the whole game so far: what was sent, the move, and the game's answer to it.
            assert after["request"]["messages"][: len(sent) + 1] == [*sent, {"role": "assistant", "content": answered}]
            assert after["request"]["messages"][-1]["role"] == "user"


def documented_adapter() -> str:
    """docs/environments.md's own suite, as a user copies it into my_suite.py."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    return doc.split("```python\n# my_suite.py\n", 1)[1].split("```", 1)[0]


def test_a_users_own_adapter_runs_from_the_command(make_gateway, vllm: VLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", train={"groups_per_step": 8})  # no trainer here: no step is ever due
    (tmp_path / "my_suite.py").write_text(documented_adapter())
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scores.json"
    command = [
        "my_suite:Minutes",
        "minutes",
        "--set",
        "max_hours=200",
        "--held-out",
        "3",
        "--gateway",
        gw.url,
        "--admin-token",
        ADMIN_TOKEN,
        "--max-tokens",
        "6",
    ]
    burnish_tasks(["eval", *command, "--out", str(out)])
    figures = json.loads(out.read_text())
    assert figures["task"] == "minutes" and figures["config"] == {"max_hours": 200} and figures["held_out"] == 3
    assert set(figures["scores"]) == {"0"} and set(figures["scores"]["0"]["components"]) == {"answered"}
    held = [gw.trajectory(m["id"]) for m in listed(gw, "/v1/trajectories", eval="true")]
    assert len(held) == 3 and all(t["calls"][0]["request"]["messages"][0]["content"].startswith("How many minutes are in ") for t in held)
    assert figures["scores"]["0"]["score"] == sum(t["reward"] for t in held) / 3
    # And trained: a round of 4 groups, each problem answered 8 times.
    burnish_tasks(["train", *command, "--rounds", "1", "--groups", "4", "--out", str(out)])
    curve = json.loads(out.read_text())
    assert len(curve["round_reward"]) == 1 and [e["round"] for e in curve["evals"]] == [0, 1]
    assert len(listed(gw, "/v1/trajectories", eval="false")) == 4 * 8


def test_the_teacher_is_scored_before_the_lever_is_pulled_and_no_versions_held_out_score_moves(make_gateway, vllm: VLLMServer, tmp_path: Path) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", train={"groups_per_step": 8})  # no trainer here: no step is ever due
    out = tmp_path / "scores.json"
    sets = [a for k, v in CHAIN_SUM.items() for a in ("--set", f"{k}={v}")]
    command = ["eval", "reasoning-gym", "chain_sum", *sets, "--held-out", "3", "--system", "Be brief.", "--max-tokens", "6"]
    burnish_tasks([*command, "--gateway", gw.url, "--admin-token", ADMIN_TOKEN, "--teacher", "2", "--out", str(out)])
    figures = json.loads(out.read_text())
    env = ReasoningGym("chain_sum", CHAIN_SUM, held_out=3, system="Be brief.")
    held_out = {e["question"]: e for e in env.split()[1]}
    # The teacher's calls: the base, greedy, shown the worked examples after the system message,
    # as the trainer shows them; neither held out nor rewarded.
    taught = [gw.trajectory(m["id"]) for m in listed(gw, "/v1/trajectories", eval="false")]
    assert len(taught) == 3 and figures["teacher"]["examples"] == 2
    scores = []
    for t in taught:
        (call,) = t["calls"]
        messages = call["request"]["messages"]
        assert call["request"]["model"] == "agent@0" and call["request"]["temperature"] == 0.0 and t.get("reward") is None
        assert messages[0] == {"role": "system", "content": "Be brief."} and messages[1:5] == env.worked_examples(2)
        entry = held_out[messages[5]["content"].removesuffix("\nGive only the final answer.")]
        scores.append(env.score(call["response"]["choices"][0]["message"]["content"], entry))
    assert figures["teacher"]["score"] == sum(scores) / 3
    # The version's own held-out score is its three evaluations alone.
    held = [gw.trajectory(m["id"]) for m in listed(gw, "/v1/trajectories", eval="true")]
    assert len(held) == 3 and all(len(t["calls"][0]["request"]["messages"]) == 2 for t in held)
    assert figures["scores"]["0"]["score"] == sum(t["reward"] for t in held) / 3


def test_held_out_questions_never_come_up_in_training_and_the_split_is_the_same_every_time() -> None:
    env = ReasoningGym("gcd", {"max_value": 12}, held_out=16)  # a small space: the two seeds share questions
    train_set, held_out = env.split()
    held = {e["question"] for e in held_out}
    drawn = [train_set[i]["question"] for i in range(400)]
    assert not held & set(drawn) and len(set(drawn)) > 20
    assert [e["question"] for e in ReasoningGym("gcd", {"max_value": 12}, held_out=16).split()[1]] == [e["question"] for e in held_out]
    entry = held_out[0]
    assert env.score(f" {entry['answer']} ", entry) == 1.0 and env.score("no idea", entry) == 0.0


def test_binary_rewards_train_on_right_or_wrong_and_hold_out_the_tasks_own_grade() -> None:
    env = ReasoningGym("spell_backward", {"min_word_len": 5, "max_word_len": 5}, held_out=1, binary=True)
    entry = env.split()[1][0]
    near = entry["answer"][:-1] + ("a" if entry["answer"][-1] != "a" else "b")  # one letter off: part marks
    assert 0.0 < env.score(near, entry) < 1.0

    def played(held_out: bool) -> Score:
        return asyncio.run(env.play(Fixed(near, held_out), entry))

    assert played(held_out=False).reward == 0.0 and played(held_out=False).components == {"graded": env.score(near, entry)}
    assert played(held_out=True).reward == env.score(near, entry)


class Fixed(Chat):
    """A chat that always replies ``text``: the environment's scoring alone."""

    def __init__(self, text: str, held_out: bool) -> None:
        super().__init__(client=None, model="agent", sampling=None, held_out=held_out)  # type: ignore[arg-type]
        self.text = text

    async def __call__(self, messages: list[dict[str, Any]], **options: Any) -> str:
        return self.text


def test_the_commands_settings_read_json_where_they_are_json() -> None:
    assert setting("max_value=50") == ("max_value", 50) and setting('styles=["plain"]') == ("styles", ["plain"])
    assert setting("word=maybe") == ("word", "maybe") and setting("x=") == ("x", "")
    with pytest.raises(Exception, match="name=value"):
        setting("nothing")
    with pytest.raises(ValueError, match="rounds or minutes"):
        Schedule()


def test_a_games_worked_examples_are_whole_won_games_from_train_seeds() -> None:
    env = TextArena("GuessTheNumber-v0", held_out=2)
    turns = env.worked_examples(2)
    starts = [i for i, t in enumerate(turns) if t["role"] == "user" and "Guess The Number" in t["content"]]
    assert len(starts) == 2 and [t["role"] for t in turns] == ["user", "assistant"] * (len(turns) // 2)
    assert all(t["content"].startswith("[") and t["content"].endswith("]") for t in turns if t["role"] == "assistant")
    # Halving 1-20 finds any number within 5 guesses: each game ends in the move that won it.
    assert all(2 <= len(game) // 2 <= 5 for game in (turns[: starts[1]], turns[starts[1] :]))
    with pytest.raises(ValueError, match="no demonstrator"):
        TextArena("Mastermind-v0").worked_examples(1)
