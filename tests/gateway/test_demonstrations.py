"""Posted demonstrations (core/learning/demonstrations.py, POST /v1/demonstrations, `burnish sft`): recorded
as trajectories of their own, ready where the policy trains on SFT, rendered by the trainer to
the very tokens vLLM reads, and trained on their assistant turns alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from burnish_server.core.protocols.records import DEMONSTRATION
from tests.conftest import Gateway

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]
WITH_TOOL: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "5"},
    ],
    "tools": TOOLS,
}
PLAIN = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]


@pytest.fixture
def gw(make_gateway, upstream, database_url: str) -> Gateway:
    gateway = make_gateway(database_url)
    gateway.create_policy("agent")
    return gateway


def post(gw: Gateway, body: Any) -> httpx.Response:
    with gw.client() as c:
        return c.post("/v1/demonstrations", json=body)


def test_posted_demonstrations_are_trajectories_of_their_own_ready_only_for_sft(gw: Gateway) -> None:
    r = post(gw, {"policy": "agent", "data": [WITH_TOOL, {"messages": PLAIN}]})
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["policy"] == "agent" and len(out["ids"]) == 2 and out["trains"] is False
    with gw.client() as c:
        trajectory = c.get(f"/v1/trajectories/{out['ids'][0]}").json()
        group = c.get(f"/v1/groups/{out['ids'][0]}").json()
    (call,) = trajectory["calls"]
    assert call["status"] == DEMONSTRATION and call["policy"] == "agent"
    given = [{k: v for k, v in m.items() if v is not None} for m in WITH_TOOL["messages"][:-1]]  # as posted, nulls left out
    assert call["request"]["messages"] == given and call["request"]["tools"] == TOOLS
    assert call["response"]["choices"][0]["message"] == {"role": "assistant", "content": "5"}
    assert group["state"] == "closed" and group["close_reason"] == "demonstration"
    assert group["cannot_train"].startswith("a demonstration: it trains a policy whose train.objective gives sft a weight")
    assert gw.policy()["groups_ready"] == 0 and gw.policy()["health"]["warning"] is None
    with gw.admin() as c:  # the dashboard marks it
        page = c.get(f"/ui/trajectories/{out['ids'][0]}")
        assert page.status_code == 200 and "A demonstration: posted for agent to imitate" in page.text and 'class="badge demo"' in page.text
    with gw.admin() as c:
        assert c.patch("/admin/policies/agent", json={"train": {"objective": {"grpo": 1, "sft": 1}}}).status_code == 200
    assert gw.policy()["groups_ready"] == 2
    with gw.client() as c:
        assert c.get(f"/v1/groups/{out['ids'][0]}").json()["cannot_train"] is None
    assert post(gw, {"policy": "agent", "data": [{"messages": PLAIN}]}).json()["trains"] is True


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"policy": "agent", "data": [{"messages": PLAIN[:1] * 2}]}, "data[0]", "its last message must be the assistant's"),
        ({"policy": "agent", "data": [{"messages": [*PLAIN, {"role": "tool", "content": "x"}, PLAIN[1]]}]}, "data[0]", "tool_call_id"),
        ({"policy": "agent", "data": [{"messages": [PLAIN[0], {"role": "assistant"}]}]}, "data[0]", "content or tool_calls"),
        ({"policy": "agent", "data": []}, None, None),
        ({"policy": "agent", "data": [{"messages": [{"role": "robot", "content": "x"}, PLAIN[1]]}]}, None, None),
        ({"policy": "agent", "data": [{"messages": PLAIN, "extra": 1}]}, None, None),
    ],
)
def test_a_demonstration_that_is_none_is_refused_and_nothing_is_kept(gw: Gateway, body: Any, param: str | None, words: str | None) -> None:
    r = post(gw, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param and words in error["message"]
    with gw.client() as c:
        assert c.get("/v1/trajectories").json()["data"] == []


def test_an_unknown_policy_is_a_404(gw: Gateway) -> None:
    r = post(gw, {"policy": "nobody", "data": [{"messages": PLAIN}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "policy_not_found"


def test_burnish_sft_posts_a_file_and_names_a_bad_line(gw: Gateway, tmp_path: Path) -> None:
    good = tmp_path / "demos.jsonl"
    good.write_text(json.dumps(WITH_TOOL) + "\n\n" + json.dumps(PLAIN) + "\n")
    cli = [sys.executable, "-m", "burnish_server.cli", "sft", "--url", gw.url, "--token", "k", "--policy", "agent"]
    done = subprocess.run([*cli, str(good)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("posted 2 demonstrations for agent")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PLAIN) + "\n{not json\n")
    refused = subprocess.run([*cli, str(bad)], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "bad.jsonl:2: not JSON" in refused.stderr
    with gw.client() as c:
        assert len(c.get("/v1/trajectories").json()["data"]) == 2  # the bad file posted nothing


def test_a_demonstration_with_tool_calls_renders_to_the_tokens_vllm_reads(vllm, tiny_model: Path) -> None:
    """Every assistant turn's context is what vLLM's own tokenizer endpoint makes of the
    messages before it (its chat template, the tools shown); the turns alone are trained,
    never the tool's result."""
    import msgspec
    from transformers import AutoTokenizer

    from burnish_server.core.learning.demonstrations import Demonstration, record
    from burnish_server.core.platform.clock import utcnow
    from burnish_server.trainer.demonstrations import Demonstrations

    demonstration = msgspec.convert(WITH_TOOL, Demonstration)
    call = record(demonstration, "agent", "d-1", utcnow())
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    seq = Demonstrations(tokenizer).sequence(call)
    assert seq is not None and seq.imitate and not seq.grpo

    def vllm_ids(messages: list, prompt: bool) -> list[int]:
        body = {"model": "tiny", "messages": messages, "tools": TOOLS, "add_generation_prompt": prompt}
        r = httpx.post(vllm.url + "/tokenize", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    messages = WITH_TOOL["messages"]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(seq.spans) == len(turns) == 2
    for span, i in zip(seq.spans, turns):
        assert seq.tokens[: span.start] == vllm_ids(messages[:i], True)
        trained = seq.tokens[span.start : span.start + span.length]
        assert trained[-1] == tokenizer.eos_token_id  # up to the end of the turn, where vLLM stops
    assert seq.tokens == vllm_ids(messages, False)[: len(seq.tokens)]
    tool_result = tokenizer.encode("5", add_special_tokens=False)
    first, second = seq.spans
    between = seq.mask[first.start + first.length : second.start]
    assert sum(between) == 0 and len(between) > len(tool_result)  # the tool's result is context


async def test_a_step_of_sft_on_posted_demonstrations_through_the_trainer(make_gateway, vllm, tiny_model: Path) -> None:
    """Demonstrations posted over the API train a step of SFT alone: every demonstration's
    assistant tokens, nothing skipped, the version published."""
    from burnish_server.core.platform.settings import Settings
    from burnish_server.trainer.worker import TrainerWorker, WorkerSettings

    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy(
        "imitator", "tiny", model_path=str(tiny_model), lora={"rank": 8, "alpha": 16}, train={"learning_rate": 5e-3, "groups_per_step": 3, "objective": "sft"}
    )
    with gw.client() as c:
        r = c.post("/v1/demonstrations", json={"policy": "imitator", "data": [WITH_TOOL, {"messages": PLAIN}, {"messages": PLAIN}]})
        assert r.status_code == 201 and r.json()["trains"] is True
    worker = TrainerWorker(Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url), WorkerSettings(worker_id="sft-test"))
    await worker.recover()
    try:
        assert await worker.run_once()
        status = gw.policy("imitator")
        metrics = status["last_step"]["metrics"]
        assert status["step"] == 1 and metrics["groups"] == 3 and metrics["untokenized_calls"] == 0
        assert metrics["sft_tokens"] == metrics["tokens"] > 0 and metrics["grpo_tokens"] == 0 and metrics["sft_loss"] > 0
    finally:
        await worker.close()
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": "imitator@1"})


def test_a_teachers_answers_to_recorded_prompts_become_demonstrations(gw: Gateway, upstream) -> None:
    """The policy's newest distinct prompts (never a held-out one), answered greedily by the
    model named, each recorded as a demonstration of the prompt and its answer."""
    upstream.models = ["tiny", "big-sibling"]
    with gw.client() as c:
        for i, text in enumerate(("one", "two", "two")):  # two trajectories ask the same
            body = {"model": "agent", "messages": [{"role": "user", "content": text}]}
            assert c.post(f"/t/asked-{i}/v1/chat/completions", json=body).status_code == 200
        held_out = {"model": "agent", "messages": [{"role": "user", "content": "secret"}]}
        assert c.post("/eval/t/held/v1/chat/completions", json=held_out).status_code == 200
    upstream.requests.clear()
    with gw.admin() as c:
        r = c.post("/admin/policies/agent/teacher-answers", json={"model": "big-sibling", "limit": 10})
        assert r.status_code == 201, r.text
        out = r.json()
        assert (out["asked"], out["failed"], len(out["ids"]), out["trains"]) == (2, 0, 2, False)
        asked = [json.loads(req["body"]) for req in upstream.requests]
        assert sorted(a["messages"][0]["content"] for a in asked) == ["one", "two"]
        assert all(a["model"] == "big-sibling" and a["temperature"] == 0 for a in asked)
        answers = []
        for trajectory in out["ids"]:
            (call,) = c.get(f"/v1/trajectories/{trajectory}").json()["calls"]
            assert call["status"] == DEMONSTRATION
            answers.append((call["request"]["messages"][0]["content"], call["response"]["choices"][0]["message"]["content"]))
        assert sorted(answers) == [("one", "You said: one ok"), ("two", "You said: two ok")]
        missing = c.post("/admin/policies/nobody/teacher-answers", json={"model": "big-sibling"})
        assert missing.status_code == 404


def test_the_policys_own_teacher_answers_shown_its_context(gw: Gateway, upstream) -> None:
    """``model`` omitted: the policy's teacher (its base, here) answers each prompt shown the
    teacher context after the prompt's system message; the demonstration keeps the prompt alone."""
    with gw.admin() as c:
        refused = c.post("/admin/policies/agent/teacher-answers", json={"limit": 5})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_teacher_answers", refused.text
        shown = [{"role": "user", "content": "two"}, {"role": "assistant", "content": "2"}]
        assert c.patch("/admin/policies/agent", json={"train": {"teacher": {"context": shown}}}).status_code == 200
    with gw.client() as c:
        body = {"model": "agent", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "three"}]}
        assert c.post("/t/asked-own/v1/chat/completions", json=body).status_code == 200
    upstream.requests.clear()
    with gw.admin() as c:
        r = c.post("/admin/policies/agent/teacher-answers", json={"limit": 1})
        assert r.status_code == 201 and r.json()["failed"] == 0, r.text
        (asked,) = [json.loads(req["body"]) for req in upstream.requests]
        assert asked["model"] == gw.policy("agent")["base_model"]
        assert asked["messages"] == [body["messages"][0], *shown, body["messages"][1]]
        (call,) = c.get(f"/v1/trajectories/{r.json()['ids'][0]}").json()["calls"]
        assert call["request"]["messages"] == body["messages"]
        assert call["response"]["choices"][0]["message"]["content"] == "You said: three ok"
