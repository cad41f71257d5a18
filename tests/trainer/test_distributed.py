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

from burnish_server.core.platform.settings import Settings
from burnish_server.serving.process import VLLMServer, last_lines
from burnish_server.store.database import Database
from burnish_server.store.models import Group
from burnish_server.store.policies import get_policy
from burnish_server.store.training import group_calls
from burnish_server.trainer.checkpoints import Checkpoints
from burnish_server.trainer.models import Models
from tests.conftest import Gateway
from tests.trainer.test_trainer_recovery import TINY, ready_group

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
    ours = tmp_path / "one-rank" / "policies" / policy_name / "checkpoints" / "1"
    # The gradients: AdamW's first moment after one step is 0.1 x the step's gradient.
    first = [torch.load(d / "optimizer.pt")["state"] for d in (ours, checkpoints / "1")]
    assert first[0].keys() == first[1].keys()
    for index in first[0]:
        expected = first[0][index]["exp_avg"]
        # fp32 sums in another order: equal to a ten-thousandth of the tensor's largest entry.
        torch.testing.assert_close(first[1][index]["exp_avg"], expected, rtol=1e-3, atol=1e-4 * float(expected.abs().max()))
    # The adapter. AdamW's first step moves each entry by about lr x g / (|g| + 1e-8): an entry
    # whose gradient is within a few 1e-8 of zero moves by a share of lr that float rounding
    # (the order of a sum across ranks) changes. All others agree to float precision.
    one, two = (load_file(d / "adapter" / "adapter_model.safetensors") for d in (ours, checkpoints / "1"))
    assert one.keys() == two.keys()
    lr, entries, loose, moved = TINY["train"]["learning_rate"], 0, 0, 0
    for key in one:
        gap = (two[key] - one[key]).abs()
        assert gap.max() <= lr, key
        entries, loose, moved = entries + gap.numel(), loose + int((gap > 1e-6).sum()), moved + int(one[key].abs().sum() > 0)
    assert loose <= entries // 1000, (loose, entries)
    assert moved >= len(one) // 2  # the step moved the adapter (LoRA's B, from zero)


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of torchrun's worker of that rank (from its environment: RANK)."""
    for child in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(child)
    raise AssertionError(f"no rank {rank} under {launcher.pid}")


def test_a_rank_killed_mid_step_records_nothing_and_the_trainer_started_again_resumes(make_gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent-killed", "tiny", model_path=str(tiny_model), **TINY)
    admin = gw.admin()
    log = tmp_path / "trainer.log"
    # No restart by torchrun here: the test starts the trainer again itself, to look in between.
    trainer = start_trainer(gw, vllm, log, "--worker-id", "killed-test", BURNISH_TRAINER_MAX_RESTARTS="0")
    # Step 1, on both ranks.
    asyncio.run(ready_group(gw, "a", "agent-killed"))
    asyncio.run(ready_group(gw, "b", "agent-killed"))
    wait(lambda: gw.policy("agent-killed")["step"] == 1, "step 1 served", trainer, log)
    admin.post("/admin/policies/agent-killed/pause")
    asyncio.run(ready_group(gw, "c", "agent-killed"))
    asyncio.run(ready_group(gw, "d", "agent-killed"))

    # Rank 1 is frozen; step 2 begins (rank 0 claims its groups and waits for rank 1 in the
    # step's all-reduce), then rank 1 dies.
    follower = rank_pid(trainer, 1)
    os.kill(follower, signal.SIGSTOP)
    admin.post("/admin/policies/agent-killed/resume")
    wait(lambda: {g: c for g, (c, _) in groups(gw).items() if g in "cd"} == {"c": "killed-test", "d": "killed-test"}, "claim", trainer, log)
    os.kill(follower, signal.SIGKILL)
    wait(lambda: trainer.poll() is not None, "exit", trainer, log, timeout=120)
    assert trainer.returncode != 0
    # Nothing recorded, no checkpoint counted; its groups untrained (released, or still claimed
    # by this worker id, which the next start releases at once).
    status = gw.policy("agent-killed")
    assert (status["step"], status["head"], status["last_step"]["step"]) == (1, 1, 1)
    assert {g: trained for g, (_, trained) in groups(gw).items()} == {"a": 1, "b": 1, "c": None, "d": None}
    checkpoints = Path(gw.settings.data_dir) / "policies" / "agent-killed" / "checkpoints"

    # Started again: both ranks resume from checkpoint 1 (rank 0 reads it and sends it to
    # rank 1), and train those groups, once, into step 2.
    trainer = start_trainer(gw, vllm, log, "--worker-id", "killed-test")
    try:
        wait(lambda: gw.policy("agent-killed")["step"] == 2, "step 2 served", trainer, log)
    finally:
        stop(trainer)
    steps = admin.get("/admin/policies/agent-killed/checkpoints").json()["data"]
    assert sorted((s["step"], s["parent"], sorted(s["groups"])) for s in steps) == [(1, 0, ["a", "b"]), (2, 1, ["c", "d"])]
    assert {g: trained for g, (_, trained) in groups(gw).items()} == {"a": 1, "b": 1, "c": 2, "d": 2}
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == ["1", "2"]
    state = torch.load(checkpoints / "2" / "optimizer.pt")["state"]
    assert {float(s["step"]) for s in state.values()} == {2.0}  # AdamW's second step: resumed, not begun again
