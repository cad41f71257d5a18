"""What ``burnish up`` decides before it starts anything: the training defaults a model gets
(one rule, core/learning/defaults.py), the ports it may use, and whether the policy it names was made
for the model it serves. Each refusal must come before any server starts, with the fix."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from sqlalchemy import update

from burnish_server.cli.up import ensure_policy_for_model
from burnish_server.core.learning.defaults import LLAMA_PROJECTIONS, ModelShape, defaults, learning_rate
from burnish_server.core.learning.policies import LoraSettings, Policy, TrainSettings
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.process import VLLMFailed, VLLMServer, free_ports
from burnish_server.store.database import Database
from burnish_server.store.models import PolicyRow
from burnish_server.store.policies import create_policy, get_policy
from tests.servers import free_port

SMOLLM2 = ModelShape(model_type="llama", hidden_size=576)


def test_one_rule_gives_every_pretrained_model_its_learning_rate_from_its_width() -> None:
    smol = defaults(SMOLLM2)
    # SmolLM2-135M lands where the demo measured it learning (docs/trainer.md), on every projection.
    assert smol.train.learning_rate == 5.3e-4 and smol.lora.target_modules == LLAMA_PROJECTIONS
    assert (smol.lora.rank, smol.lora.alpha, smol.train.groups_per_step) == (16, 32, 4)
    assert "learning rate 0.00053" in smol.explanation and "PATCH /admin/policies/<name>" in smol.explanation
    # Wider models take smaller steps; Qwen's fitted exponent makes its rate nearly flat in width.
    llama_8b, qwen_7b = ModelShape(model_type="llama", hidden_size=4096), ModelShape(model_type="qwen2", hidden_size=3584)
    assert defaults(llama_8b).train.learning_rate == 1.1e-4 and defaults(qwen_7b).train.learning_rate == 1.9e-4
    # Alpha stays 32 whatever the rank; an alpha changed by hand moves the rate inversely.
    assert learning_rate(SMOLLM2, alpha=64) == pytest.approx(learning_rate(SMOLLM2) / 2)
    assert defaults(SMOLLM2, micro_batch_tokens=2048).train.micro_batch_tokens == 2048


def test_a_policy_trains_sequences_as_long_as_the_served_window() -> None:
    """A coding CLI's session is long: the trained length is the window vLLM serves, the one
    burnish up sets, else the user's --max-model-len, else the model's own."""
    from burnish_server.cli.up import served_window

    own = {"max_position_embeddings": 8192}
    assert served_window(own, [], None) == 8192
    assert served_window(own, ["--max-model-len=4096"], None) == 4096 == served_window(own, ["--max-model-len", "4096"], None)
    assert served_window(own, [], 2048) == 2048 and served_window({}, [], None) is None
    assert defaults(SMOLLM2, window=8192).train.max_seq_len == 8192 and "sequences up to 8192 tokens" in defaults(SMOLLM2, window=8192).explanation
    assert defaults(SMOLLM2).train.max_seq_len == TrainSettings().max_seq_len


def _up(data: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BURNISH_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "burnish_server.cli", "up", *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        gateway = _up(tmp_path, "--model", "tiny", "--port", str(port))
        assert gateway.returncode != 0 and f"port {port} on 127.0.0.1 is in use" in gateway.stderr and "--port" in gateway.stderr
        vllm = _up(tmp_path, "--model", "tiny", "--port", str(free_port()), "--vllm-port", str(port))
        assert vllm.returncode != 0 and f"port {port} is in use" in vllm.stderr and "leave it out to take a free one" in vllm.stderr
        assert time.monotonic() - started < 60
        assert not (tmp_path / "models").exists() and not (tmp_path / "logs" / "vllm.log").exists()  # nothing made, nothing started
        # Without --vllm-port, the first free port from the default is taken instead.
        assert free_ports("127.0.0.1", port, 1) != [port]


def test_a_policy_made_for_another_model_stops_burnish_up_with_the_fix(tmp_path: Path) -> None:
    settings = Settings.load(None, data_dir=str(tmp_path))

    async def made_for_smollm2() -> None:
        db = Database(settings.resolved_database_url)
        await db.migrate()
        await db.transaction(create_policy, Policy(name="agent", base_model="smollm2", model_path="/models/smollm2"))
        await db.dispose()

    asyncio.run(made_for_smollm2())
    out = _up(tmp_path, "--model", "tiny", "--port", str(free_port()), timeout=300)
    assert out.returncode != 0, out.stdout
    assert "policy 'agent' was made for another model: smollm2 (/models/smollm2); this burnish up serves tiny" in out.stderr
    assert "--policy agent-tiny" in out.stderr and "--switch-base" in out.stderr
    assert "starting vLLM" not in out.stdout and not (tmp_path / "logs" / "vllm.log").exists()


def test_switch_base_moves_a_policy_that_never_trained_and_refuses_one_that_did(tmp_path: Path) -> None:
    settings = Settings.load(None, data_dir=str(tmp_path))
    old = Policy(name="agent", base_model="smollm2", model_path="/models/smollm2", project="support")
    new = Policy(name="agent", base_model="tiny", model_path="/models/tiny", lora=LoraSettings(rank=8), train=TrainSettings(learning_rate=5e-3))

    async def run() -> None:
        db = Database(settings.resolved_database_url)
        await db.migrate()
        await db.transaction(create_policy, old)
        await db.dispose()
        moved = await ensure_policy_for_model(settings, new, switch_base=True)
        assert (moved.base_model, moved.model_path, moved.lora, moved.train, moved.project) == ("tiny", "/models/tiny", new.lora, new.train, "support")
        assert await ensure_policy_for_model(settings, new, switch_base=False) == moved  # the same model again: nothing to say
        db = Database(settings.resolved_database_url)
        await db.transaction(lambda c: c.execute(update(PolicyRow).where(PolicyRow.name == "agent").values(head=1)))
        await db.dispose()
        with pytest.raises(click.ClickException, match="has trained on tiny \\(/models/tiny\\), so it cannot move"):
            await ensure_policy_for_model(settings, old, switch_base=True)
        db = Database(settings.resolved_database_url)
        assert (await db.transaction(get_policy, "agent")).base_model == "tiny"  # unchanged
        await db.dispose()

    asyncio.run(run())


def test_burnish_up_is_not_up_while_another_server_answers_on_vllms_port(upstream_server, tmp_path: Path) -> None:
    """A vLLM left running (another ``burnish up``'s) answers /health as well as ours would:
    ours is up only once the server on its port serves the model it was started for."""
    _, url = upstream_server
    ours = VLLMServer(model="/models/mine", served_model_name="mine", log_path=tmp_path / "vllm.log", port=int(url.rsplit(":", 1)[1]))
    ours.process = subprocess.Popen(["sleep", "60"], start_new_session=True)  # ours, still loading
    with pytest.raises(VLLMFailed, match="another server answers on .* \\(serving tiny\\), not the vLLM started here for mine"):
        ours.wait_healthy(timeout=20)
    assert ours.process.poll() is not None  # and it was stopped
