"""The trainer on several ranks (torch.distributed; gloo on the CPU), started as a user starts
it: ``burnish trainer --nproc 2``, torchrun underneath, against the gateway, the store and
vLLM serving the tiny model.

- Under DDP and under FSDP2, one step on 2 ranks leaves the adapter one rank leaves (the
  same step taken in this process from the same recorded calls), and records one step with
  one checkpoint, which vLLM serves.
- A rank killed mid-step leaves nothing recorded and its groups untrained; the trainer
  started again trains them, once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file
from sqlalchemy import select

from burnish_server.core.settings import Settings
from burnish_server.serving.process import VLLMServer, last_lines
from burnish_server.store.database import Database
from burnish_server.store.models import Group
from burnish_server.store.policies import get_policy
from burnish_server.store.training import group_calls
from burnish_server.trainer.checkpoints import Checkpoints
from burnish_server.trainer.models import Models
from tests.conftest import Gateway
from tests.test_trainer_recovery import TINY, ready_group

STEP_TIMEOUT_S = 240  # two ranks start (torch, transformers, peft each), train a step, publish it


def start_trainer(gw: Gateway, vllm: VLLMServer, log: Path, *args: str, **env: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "burnish_server.cli", "trainer", "--upstream", vllm.url, "--nproc", "2", *args]
    environ = {**os.environ, "BURNISH_DATA_DIR": gw.settings.data_dir, **env}
    return subprocess.Popen(command, env=environ, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def wait(condition, what: str, trainer: subprocess.Popen, log: Path, timeout: float = STEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {timeout}s\n{last_lines(log, 40)}"
        assert trainer.poll() is None or what == "exit", f"the trainer exited ({trainer.returncode}) before {what}\n{last_lines(log, 40)}"
        time.sleep(0.2)


def stop(trainer: subprocess.Popen) -> int:
    os.killpg(trainer.pid, signal.SIGINT)
    try:
        return trainer.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(trainer.pid, signal.SIGKILL)
        raise


def groups(gw: Gateway) -> dict[str, tuple[str | None, int | None]]:
    """Each group's claim (the worker holding it) and the step that trained it."""

    async def read() -> dict[str, tuple[str | None, int | None]]:
        db = Database(gw.settings.resolved_database_url)
        try:
            rows = await db.read(lambda c: c.execute(select(Group.id, Group.claimed_by, Group.trained_step)).all())
        finally:
            await db.dispose()
        return {r.id: (r.claimed_by, r.trained_step) for r in rows}

    return asyncio.run(read())


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_train_the_adapter_one_rank_would(make_gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path, parallel: str) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy(f"agent-{parallel}", "tiny", model_path=str(tiny_model), **TINY)
    policy_name = f"agent-{parallel}"
    asyncio.run(ready_group(gw, "a", policy_name))
    asyncio.run(ready_group(gw, "b", policy_name))
    log = tmp_path / "trainer.log"
    trainer = start_trainer(gw, vllm, log, "--parallel", parallel)
    try:
        wait(lambda: gw.policy(policy_name)["step"] == 1, "step served", trainer, log)
    finally:
        stop(trainer)  # torchrun exits 1 on a signal, whatever its ranks did
    text = log.read_text()
    assert "rank 0 of 2" in text and "[rank0]: Traceback" not in text and "[rank1]: Traceback" not in text, text[-5000:]

    # One step, one checkpoint, trained on both ranks.
    checkpoints = Path(gw.settings.data_dir) / "policies" / policy_name / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["1"]
    (step,) = gw.admin().get(f"/admin/policies/{policy_name}/metrics").json()["data"]
    assert step["ranks"] == 2 and step["groups"] == 2 and {trained for _, trained in groups(gw).values()} == {1}

    # The same step in this process, on one rank, from the same recorded calls.
    async def reference() -> None:
        db = Database(gw.settings.resolved_database_url)
        try:
            policy = await db.read(get_policy, policy_name)
            rows = await db.read(group_calls, ["a", "b"])
        finally:
            await db.dispose()
        settings = Settings.load({}, data_dir=str(tmp_path / "one-rank"))
        Models(settings, Checkpoints(settings.data_path)).step(msgspec.structs.replace(policy, step=0, head=0), rows, 1)

    asyncio.run(reference())
    one = load_file(tmp_path / "one-rank" / "policies" / policy_name / "checkpoints" / "1" / "adapter" / "adapter_model.safetensors")
    two = load_file(checkpoints / "1" / "adapter" / "adapter_model.safetensors")
    assert one.keys() == two.keys()
    moved = 0
    for key in one:
        # Float tolerance for one AdamW step: each entry moves by about lr x g / (|g| + eps), so
        # an entry whose gradient is near eps moves by a share of lr (5e-3) that the order of
        # float sums changes: a few thousandths of lr at most.
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=2e-5)
        moved += int(one[key].abs().sum() > 0)
    assert moved >= len(one) // 2  # the step moved the adapter (LoRA's B, from zero)
