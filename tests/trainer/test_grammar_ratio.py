"""A token sampled under a grammar takes its ratio against the trainer's own logprob
(``core/protocols/grammar.py``, trainer/sequences.py; docs/trainer.md, "The ratio").

vLLM records the logprobs of the distribution the grammar left (renormalised over the
tokens it allowed); the trainer computes the model's own. Against vLLM's, the ratio of a
forced tool call's argument tokens starts far below 1 before the policy has moved, and the
clipped loss gives a token whose ratio is below 1 - eps and whose advantage is negative no
gradient: a tool call that scored badly is not pushed down.

The real test: two policies on the tiny model, one per setting of ``held_ratio``, each
given the same four forced tool calls (the same seed per trajectory, so the same tokens)
and the same rewards, and one step each through the trainer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from burnish_server.core.platform.settings import Settings
from burnish_server.core.protocols.grammar import held
from burnish_server.gateway.app import create_app
from burnish_server.serving.process import VLLMServer
from burnish_server.serving.scoring import prompt_logprobs
from tests.conftest import ADMIN_TOKEN, Gateway
from tests.servers import ServerThread

NUMBER = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
CHAT_TOOL = {"type": "function", "function": {"name": "calculator", "description": "evaluate", "parameters": NUMBER}}
STRICT_TOOL = {"type": "function", "function": {"name": "calculator", "parameters": NUMBER, "strict": True}}
RESPONSES_TOOL = {"type": "function", "name": "calculator", "parameters": NUMBER, "strict": True}
ANTHROPIC_TOOL = {"name": "calculator", "input_schema": NUMBER}
FORCED = {"type": "function", "function": {"name": "calculator"}}
MESSAGES = [{"role": "system", "content": "Answer with digits."}, {"role": "user", "content": "What is 12*7?"}]


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        ({"messages": MESSAGES}, False),
        # auto: the call the model writes is held by the structural tag `burnish up` asks for (or a strict tool's)
        ({"messages": MESSAGES, "tools": [CHAT_TOOL]}, True),
        ({"messages": MESSAGES, "tools": [CHAT_TOOL], "tool_choice": "auto"}, True),
        ({"messages": MESSAGES, "tools": [CHAT_TOOL], "tool_choice": "none"}, False),
        ({"messages": MESSAGES, "tools": [CHAT_TOOL], "tool_choice": "required"}, True),
        ({"messages": MESSAGES, "tools": [CHAT_TOOL], "tool_choice": FORCED}, True),
        ({"messages": MESSAGES, "tools": [STRICT_TOOL]}, True),
        ({"messages": MESSAGES, "tools": [STRICT_TOOL], "tool_choice": "none"}, False),
        ({"messages": MESSAGES, "tool_choice": "required"}, False),  # no tools: nothing to force
        ({"messages": MESSAGES, "response_format": {"type": "json_object"}}, True),
        ({"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": NUMBER}}}, True),
        ({"messages": MESSAGES, "response_format": {"type": "text"}}, False),
        ({"prompt": "1+1=", "structured_outputs": {"regex": "[0-9]+"}}, True),
        ({"prompt": "1+1=", "guided_choice": ["2", "3"]}, True),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "a", "schema": NUMBER}}}, True),
        ({"input": "hi", "tools": [RESPONSES_TOOL]}, True),
        ({"input": "hi", "tools": [{**RESPONSES_TOOL, "strict": False}], "tool_choice": {"type": "function", "name": "calculator"}}, True),
        ({"messages": MESSAGES[1:], "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any"}}, True),
        ({"messages": MESSAGES[1:], "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "calculator"}}, True),
        ({"messages": MESSAGES[1:], "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "auto"}}, True),
        ({"messages": MESSAGES[1:], "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "none"}}, False),
        ({"messages": MESSAGES[1:], "tools": []}, False),
    ],
)
def test_which_calls_were_sampled_under_a_grammar(request_body: dict, expected: bool) -> None:
    assert held(json.dumps(request_body).encode()) is expected


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'"text"'])
def test_an_unreadable_request_counts_as_held(raw: bytes) -> None:
    # Wrongly held costs a correction for the engines' numerics; wrongly free, the grammar's bias.
    assert held(raw)


# ---- the step, on the tiny model through real vLLM --------------------------------------------

MEMBERS = 4
TOOL_MAX = 24


@pytest.fixture(scope="module")
def gw(vllm: VLLMServer, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    settings = Settings.load(
        {}, upstream=vllm.url, data_dir=str(tmp_path_factory.mktemp("grammar")), database_url="", upstream_timeout=120, admin_token=ADMIN_TOKEN
    )
    with ServerThread(create_app(settings)) as server:
        gateway = Gateway(server.url, settings)
        for name, mode in (("held", "trainer"), ("recorded", "recorded")):
            train = {"learning_rate": 2e-2, "groups_per_step": 1, "held_ratio": mode}
            gateway.create_policy(name, "tiny", model_path=str(tiny_model), lora={"rank": 8, "alpha": 16}, train=train)
        yield gateway


def sample(gw: Gateway, policy: str) -> tuple[int, list[list[int]]]:
    """The group: MEMBERS forced tool calls, the same seeds whatever the policy; rewarded by
    index (the last member scores lowest) and closed. The prompt's length, and each call's
    prompt and completion ids."""
    sequences, prompt = [], 0
    with httpx.Client(base_url=gw.url, timeout=120) as c:
        for i in range(MEMBERS):
            body = {"model": policy, "messages": MESSAGES, "tools": [CHAT_TOOL], "tool_choice": FORCED, "max_tokens": TOOL_MAX, "temperature": 1.0, "seed": i}
            r = c.post(f"/g/{policy}-g/t/{policy}-{i}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            [call] = gw.trajectory(f"{policy}-{i}")["calls"]
            tokens = call["tokens"]
            prompt = len(tokens["prompt_token_ids"])
            sequences.append(tokens["prompt_token_ids"] + tokens["completion_token_ids"][0])
            assert c.post(f"/v1/trajectories/{policy}-{i}/reward", json={"reward": float(MEMBERS - 1 - i)}).status_code == 200
        assert c.post(f"/v1/groups/{policy}-g/close").status_code == 200
    return prompt, sequences


async def train_both(gw: Gateway, vllm: VLLMServer) -> dict[str, dict]:
    """One step for each policy, by one trainer (in this process): each step's metrics."""
    from burnish_server.trainer.worker import TrainerWorker, WorkerSettings

    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url)
    worker = TrainerWorker(settings, WorkerSettings(worker_id="grammar"))
    await worker.recover()
    try:
        assert await worker.run_once()  # a pass over every policy: both steps
    finally:
        await worker.close()
    statuses = {policy: await asyncio.to_thread(gw.policy, policy) for policy in ("held", "recorded")}
    assert all(status["step"] == 1 for status in statuses.values()), statuses
    return {policy: status["last_step"]["metrics"] for policy, status in statuses.items()}


async def test_a_forced_tool_call_is_pushed_down_by_a_ratio_that_starts_at_1(gw: Gateway, vllm: VLLMServer) -> None:
    prompt, samples = await asyncio.to_thread(sample, gw, "held")
    assert (prompt, samples) == await asyncio.to_thread(sample, gw, "recorded")  # the same tokens for both settings
    metrics = await train_both(gw, vllm)
    # Against vLLM's renormalised logprobs, the ratio of the call's trained tokens starts far
    # from 1 before anything moved; against the trainer's own, it is 1 and nothing is clipped.
    assert metrics["recorded"]["held_tokens"] == 0 and metrics["recorded"]["outside_clip_fraction"] > 0.1, metrics["recorded"]
    assert metrics["held"]["held_tokens"] == metrics["held"]["tokens"] == metrics["recorded"]["tokens"] > 0, metrics["held"]
    assert metrics["held"]["clip_fraction"] == 0 and metrics["recorded"]["clip_fraction"] > 0.1, metrics

    # The lowest-scored call: how far each step pushed its tokens down, as vLLM now serves it.
    # Clipped, its narrowed tokens got no gradient, and the others' push up carried it along.
    worst = samples[-1]
    try:
        with httpx.Client(base_url=vllm.url, timeout=120) as http:
            before, held_after, recorded_after = (prompt_logprobs(http, model, [(worst, prompt)])[0] for model in ("tiny", "held@1", "recorded@1"))
    finally:
        for name in ("held@1", "recorded@1"):
            httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    pushed = {name: sum(b - a for b, a in zip(before, after)) for name, after in (("held", held_after), ("recorded", recorded_after))}
    print(
        {
            name: {key: m[key] for key in ("tokens", "held_tokens", "clip_fraction", "outside_clip_fraction", "logprob_diff_mean")}
            for name, m in metrics.items()
        },
        pushed,
    )
    assert pushed["held"] > 0 and pushed["held"] > pushed["recorded"], pushed
