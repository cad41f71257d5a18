"""bench/gpu.sh's whole-step run, on the CPU: the loopback stand-in for vLLM answers the trainer
as vLLM does, and bench/trainer_whole.py takes the real worker's passes on the tiny shape into
a results file that bench/gpu_summary.py turns into its table."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from burnish_server.serving.adapters import AdapterError, VLLMAdapters

ROOT = Path(__file__).resolve().parents[2]
# bench/ is no package: the stand-in's module loaded from its file, bench/ kept off sys.path.
_spec = importlib.util.spec_from_file_location("vllm_standin", ROOT / "bench" / "vllm_standin.py")
assert _spec is not None and _spec.loader is not None
vllm_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vllm_standin)
VLLMStandIn = vllm_standin.VLLMStandIn

PHASES = ("wall_s", "read_s", "load_s", "batch_s", "step_s", "save_s", "record_s", "publish_s")


def test_the_standin_answers_the_trainer_as_vllm_does(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with VLLMStandIn("base", "/models/base") as standin:
        vllm = VLLMAdapters(standin.url + "/v1")
        try:
            vllm.check("base")
            with pytest.raises(AdapterError, match="does not answer"):
                vllm.check("agent@1")
            with pytest.raises(AdapterError, match="did not load"):
                vllm.load("agent@1", tmp_path / "nothing")  # no adapter there
            vllm.load("agent@1", adapter)
            vllm.load("agent@1", adapter)  # held from this path already: fine
            vllm.check("agent@1")
            assert vllm.loaded_from("agent@1") == str(adapter) and vllm.loaded_from("base") == "/models/base"
            other = tmp_path / "other"
            other.mkdir()
            (other / "adapter_config.json").write_text("{}")
            vllm.load("agent@1", other)  # held from elsewhere: unloaded, loaded again from here
            assert vllm.loaded_from("agent@1") == str(other)
            vllm.load("agent@2", adapter)
            assert vllm.loaded_steps("agent") == [2, 1]
            vllm.unload("agent@1")
            assert vllm.model_ids() == ["base", "agent@2"]
            assert httpx.post(standin.url + "/v1/unload_lora_adapter", json={"lora_name": "agent@1"}).status_code == 404
            chat = httpx.post(standin.url + "/v1/chat/completions", json={"model": "agent@2", "messages": [{"role": "user", "content": "hi"}]})
            assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
        finally:
            vllm.close()


def test_the_whole_step_on_the_tiny_shape(tmp_path: Path) -> None:
    """The worker's two passes: every phase timed, each step published to the stand-in and served."""
    results = tmp_path / "runs" / "trainer_whole.json"
    args = ["--model", "qwen2-tiny", "--groups", "2", "--group-size", "4", "--prompt-len", "32", "--answer-len", "8", "--passes", "2"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trainer_whole.py"), *args, "--results", str(results)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    whole = json.loads(results.read_text())
    assert whole["served_step"] == 2 and whole["standin_adapters"] == ["agent@1", "agent@2"]
    assert whole["standin"]["load"] == 2 and whole["standin"]["answer"] == 2
    assert [p["step"] for p in whole["passes"]] == [1, 2]
    for p in whole["passes"]:
        assert p["calls"] == 16 and p["sequences"] == 8 and p["sampled"] == 8 * 2 * 8
        # Each phase timed: a phase the worker skipped, or a clock read twice, shows as no time.
        assert all(p[k] > 0 for k in PHASES if k != "load_s"), p
        assert p["wall_s"] > p["read_s"] + p["step_s"] + p["publish_s"], p
    # The model is built on the first pass and held for the second.
    first, second = whole["passes"]
    assert first["load_s"] > 0 and second["load_s"] < first["load_s"] / 2, (first["load_s"], second["load_s"])
    summary = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_summary.py"), str(results.parent), str(tmp_path / "gpu-results.json")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "| 1 (model built) |" in summary.stdout and "| 2 |" in summary.stdout
    assert json.loads((tmp_path / "gpu-results.json").read_text())["trainer_whole"] == whole
