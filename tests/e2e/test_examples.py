"""examples/ against a real gateway and vLLM: the tool-using agent plays a round, the demo's
task is split and scored as its docs say, and its plots are written. (The digits example's
learning is tests/e2e/test_learning.py; the demo's real model through the product, tests/e2e/test_default_model.py.)"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from burnish import AsyncClient
from burnish.tasks import Curve, Eval, train, write_plot
from burnish_server.serving.process import VLLMServer
from tests.conftest import ADMIN_TOKEN

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import arithmetic  # noqa: E402
import calculator  # noqa: E402
import digits  # noqa: E402
import lookup_agent  # noqa: E402
import sweep  # noqa: E402


def test_calculator_agent_plays_two_turns_with_a_tool(make_gateway, vllm: VLLMServer) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny")

    async def play() -> list[tuple[float, str]]:
        async with AsyncClient(gw.url, admin_token=ADMIN_TOKEN) as client:
            return await calculator.play_round(client, 0, groups=1, size=3)

    results = asyncio.run(play())
    assert [v for _, v in results] == ["agent@0"] * 3 and all(0 <= r <= 1 for r, _ in results)
    with gw.client() as c:
        members = c.get("/v1/trajectories", params={"limit": 3}).json()["data"]
    trajectories = [gw.trajectory(m["id"]) for m in members]
    assert all(len(t["calls"]) == 2 and set(t["reward_components"]) == {"expression", "answer"} for t in trajectories)
    assert all(c["tokens"]["completion_token_ids"] for t in trajectories for c in t["calls"])  # trainable: token ids recorded
    # At least one episode made a real tool call (vLLM's guided decoding) and sent its result back.
    used_tool = [t for t in trajectories if t["calls"][1]["request"]["messages"][-1]["role"] == "tool"]
    assert used_tool, [t["calls"][0]["response"] for t in trajectories]
    assert used_tool[0]["calls"][0]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    assert used_tool[0]["calls"][0]["request"]["tool_choice"] == calculator.CALL_CALCULATOR


def test_the_demo_plays_its_sums_on_the_task_runner(make_gateway, vllm: VLLMServer) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", train={"groups_per_step": 8})  # no trainer here: no step is due
    schedule = arithmetic.SUMS.schedule(rounds=1, groups=2, size=2, eval_every=1)

    async def run() -> Curve:
        async with AsyncClient(gw.url, admin_token=ADMIN_TOKEN) as client:
            return await train(client, arithmetic.SUMS, "agent", schedule, log=lambda _: None)

    curve = asyncio.run(run())
    assert [(e.round, e.step) for e in curve.evals] == [(0, 0), (1, 0)] and set(curve.evals[0].components) == {"exact", "shaped"}
    with gw.client() as c:
        played = c.get("/v1/trajectories", params={"eval": "false", "limit": 10}).json()["data"]
    assert len(played) == 4
    for m in played:
        (call,) = gw.trajectory(m["id"])["calls"]
        request = call["request"]
        assert (request["max_tokens"], request["temperature"]) == (16, 0.7) and request["messages"][0]["content"].startswith("What is ")
        text = call["response"]["choices"][0]["message"]["content"]
        a, b = (int(n) for n in arithmetic.NUMBER.findall(request["messages"][0]["content"])[:2])
        assert gw.trajectory(m["id"])["reward"] == arithmetic.shaped(text, a, b)  # train: the shaped reward


def test_calculator_never_evaluates_anything_but_arithmetic() -> None:
    assert calculator.calculate("12 + 30 * 2") == 72
    for bad in ("__import__('os')", "2 ** 99999999", "x + 1"):
        try:
            calculator.calculate(bad)
            raise AssertionError(bad)
        except (ValueError, SyntaxError):
            pass
    assert calculator.expression_score("12 + 30") == 1.0 and calculator.expression_score("ab12") == 0.5


def test_the_demo_writes_its_plot(tmp_path: Path) -> None:
    digits.write_plot([0.1, 0.2, 0.5], tmp_path / "reward.png")
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_demo_plots_both_curves(tmp_path: Path) -> None:
    write_plot(Curve("sums", "agent", [0.1, 0.3, 0.6], [Eval(0, 0.0, 0, 0.0), Eval(3, 1.5, 3, 0.5)]), tmp_path / "arithmetic.png")
    assert (tmp_path / "arithmetic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_demo_holds_out_sums_it_never_trains_on_and_scores_them_exactly() -> None:
    train, held_out = arithmetic.sums()
    assert len(held_out) == arithmetic.HELD_OUT and len(train) + len(held_out) == 400
    assert not set(train) & set(held_out) and arithmetic.sums() == (train, held_out)  # fixed by the seed
    assert arithmetic.exact(" 27.", 13, 14) == 1.0 and arithmetic.exact("13 + 14 = 27", 13, 14) == 0.0
    assert arithmetic.right("13 + 14 = 27", 13, 14) == 1.0 and arithmetic.right("13 + 14 = 27, as 2 + 5 = 7", 13, 14) == 0.0
    # train reward: right and short > right and long > wrong and short > wrong and long
    scores = [arithmetic.shaped(t, 13, 14) for t in ("27", "13 + 14 = 27", "26", "13 + 14 = 26, a classic")]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0


def test_the_sweeps_tasks_hold_out_problems_and_score_as_their_docs_say() -> None:
    for task in sweep.TASKS.values():
        train, held_out = task.split()
        assert len(held_out) == arithmetic.HELD_OUT and not set(train) & set(held_out) and task.split() == (train, held_out)
    larger, parity = sweep.LARGER, sweep.PARITY
    assert larger.right("52 is the larger number.", (47, 52)) == 1.0 and larger.right("52 is larger than 47", (47, 52)) == 0.0
    assert larger.exact("52.", (47, 52)) == 1.0 and larger.exact("52 is the larger number.", (47, 52)) == 0.0
    assert parity.right("The answer is neither even nor odd.", 633) == 0.0 and parity.right("Odd.", 633) == 1.0
    for task, problem, texts in (
        (larger, (47, 52), ("52", "52 is the larger number.", "47", "47 is the larger one, as it is")),
        (parity, 10, ("even", "It is even.", "odd", "It is odd, I think")),
    ):
        scores = [task.shaped(t, problem) for t in texts]  # right and short > right and long > wrong and short > wrong and long
        assert scores == sorted(scores, reverse=True) and scores[0] == 1.0


def test_the_agent_demo_holds_out_words_and_scores_an_episode_as_its_docs_say(tmp_path: Path) -> None:
    train, held_out = lookup_agent.words()
    assert len(held_out) == lookup_agent.HELD_OUT and not set(train) & set(held_out) and lookup_agent.words() == (train, held_out)
    Episode, Question = lookup_agent.Episode, lookup_agent.Question
    right = Episode(Question("violin", "412"), [("lookup", "violin")], "412")
    found = Episode(Question("violin", "412"), [("lookup", "violin")], "<tool_response>\n412\n</tool_response>")
    wrong_word = Episode(Question("violin", "412"), [("lookup", "viola")], "It is 412, I think, or 7")
    assert (right.right, right.found, right.tool, right.reward) == (1.0, 1.0, 1.0, 1.0)
    assert (found.right, found.found, found.tool) == (0.0, 1.0, 1.0) and found.reward == 0.6000000000000001
    assert (wrong_word.right, wrong_word.found, wrong_word.tool, wrong_word.reward) == (0.0, 0.0, 0.0, 0.0)
    # --task choose: the tool the question names, and a colour as the secret
    wrong_tool = Episode(Question("violin", "blue", "colour"), [("lookup_a", "violin")], "Blue.")
    assert (wrong_tool.right, wrong_tool.found, wrong_tool.tool) == (1.0, 1.0, 0.0)
    q = lookup_agent.question("choose", "violin", random.Random(0))
    assert (
        q.wanted == {"number": "lookup_a", "colour": "lookup_b"}[q.kind]
        and f"secret {q.kind}" in q.prompt
        and lookup_agent.question("lookup", "violin", random.Random(0)).secret.isdigit()
    )
    worked = lookup_agent.worked_episode("lookup")
    assert [m["role"] for m in worked] == ["user", "assistant", "tool", "assistant"] and worked[1]["tool_calls"][0]["function"]["name"] == "lookup"
    lookup_agent.write_plot({"round_reward": [0.3, 0.6], "eval": [(0, 0, 0.0, 1.0), (2, 2, 0.9, 1.0)]}, tmp_path / "lookup.png")
    assert (tmp_path / "lookup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_production_traffics_users_say_thanks_or_what_was_wanted() -> None:
    """examples/production.py: what a user says after an answer, per task (docs/production.md's runs)."""
    import production

    sums = production.asked("sums", [])
    assert sums.reply("27", (13, 14)) == "Thanks." and sums.reply("26", (13, 14)) == "No, 13 + 14 is 27. Reply with only the number."
    gym = production.asked("word_sorting", ["min_words=2", "max_words=2"])
    entry = gym.env.split()[1][0]
    assert gym.reply(str(entry["answer"]), entry) == "Thanks." and gym.reply("?", entry).startswith(f"No, the answer is {entry['answer']}.")
    q = lookup_agent.Question("violin", "737")
    assert lookup_agent.next_turn(lookup_agent.Episode(q, [], "737")) == "Thanks."
    assert lookup_agent.next_turn(lookup_agent.Episode(q, [], "<tool_response>737</tool_response>")) == "Right, but reply with only the number: 737"
    assert lookup_agent.next_turn(lookup_agent.Episode(q, [], "12")) == 'No, the secret number of "violin" is 737. Reply with only the number.'
    held_out = production.asked("lookup", []).env.split()[1]
    assert all(isinstance(h, lookup_agent.Question) for h in held_out) and len(held_out) == lookup_agent.HELD_OUT
