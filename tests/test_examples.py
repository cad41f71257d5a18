"""examples/ against a real gateway and vLLM: the tool-using agent plays a round, and the
demo's plot is written. (The digits example's learning is tests/test_learning.py.)"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from burnish import AsyncClient
from burnish_server.serving.process import VLLMServer
from tests.conftest import ADMIN_TOKEN

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import calculator  # noqa: E402
import digits  # noqa: E402


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
