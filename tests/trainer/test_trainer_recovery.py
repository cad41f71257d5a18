"""A trainer killed mid-step: the restarted one neither loses a group nor trains one twice.

The first test recreates the two places a kill can leave something behind, exactly:
after the checkpoint is written but before its step is recorded, and after it is
recorded but before the policy switches to the new version. The second kills a real
``burnish trainer`` process with SIGKILL in the middle of its steps.
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
from sqlalchemy import select

from burnish_server.core.platform.settings import Settings
from burnish_server.serving.process import VLLMServer, last_lines
from burnish_server.store.models import Group, StepRow
from burnish_server.store.policies import get_policy, load_policies
from burnish_server.store.training import claim_groups, count_ready, group_calls
from burnish_server.store.versions import record_step
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
from tests.conftest import Gateway, served_step

SIZE = 2
TINY = {"lora": {"rank": 8, "alpha": 16}, "train": {"learning_rate": 5e-3, "groups_per_step": 2}}


async def ready_group(gw: Gateway, name: str, policy: str = "agent") -> None:
    """A group of SIZE policy calls with rewards 0, 1, ...: closed by its last reward, and ready."""
    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        for i in range(SIZE):
            r = await client.post(
                f"/g/{name}/t/{name}-{i}/v1/chat/completions",
                json={"model": policy, "messages": [{"role": "user", "content": "digits"}], "max_tokens": 8},
                headers={"x-group-size": str(SIZE)},
            )
            assert r.status_code == 200
            assert (await client.post(f"/v1/trajectories/{name}-{i}/reward", json={"reward": float(i)})).status_code == 200


async def make_groups(gw: Gateway, count: int) -> None:
    for g in range(count):
        await ready_group(gw, f"grp{g}")


def trained(conn) -> tuple[list[int | None], list[tuple[int, list[str]]]]:
    """Each group's trained step, and each recorded step's groups."""
    groups = sorted(conn.execute(select(Group.trained_step)).scalars(), key=lambda s: (s is None, s))
    steps = [(r.step, sorted(r.groups)) for r in conn.execute(select(StepRow).order_by(StepRow.step))]
    return groups, steps


def unload(vllm: VLLMServer, steps) -> None:
    for step in steps:
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": f"agent@{step}"})


async def test_a_trainer_steps_from_the_head_another_trainer_just_moved(make_gateway, vllm: VLLMServer, tiny_model: Path) -> None:
    """Trainer A reads the policies, trainer B takes a step, then A claims the next groups:
    A must train from B's step (a step from A's stale view would be recorded, never served)."""
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), **TINY)
    await make_groups(gw, 4)
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url)
    a, b = TrainerWorker(settings, WorkerSettings(worker_id="a")), TrainerWorker(settings, WorkerSettings(worker_id="b"))
    try:
        stale = (await a.db.read(load_policies))[0]
        assert await b.train_once((await b.db.read(load_policies))[0])
        assert await a.train_once(stale)
        steps = [(s["step"], s["parent"], s["serving"]) for s in gw.admin().get("/admin/policies/agent/checkpoints").json()["data"]]
        assert steps == [(1, 0, False), (2, 1, True)] and served_step(gw) == 2
    finally:
        await a.close()
        await b.close()
        unload(vllm, (1, 2))


async def test_a_step_replaces_an_adapter_vllm_holds_under_its_name_from_elsewhere(make_gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    """vLLM may hold ``agent@2`` already, loaded from another directory: a policy deleted and
    made again under its name, or another deployment on the same vLLM. Step 2 must be served
    from its own checkpoint, not from those weights."""
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), **TINY)
    await make_groups(gw, 4)
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url)
    ckpts = Path(gw.settings.data_dir) / "policies" / "agent" / "checkpoints"
    worker = TrainerWorker(settings, WorkerSettings(worker_id="w1"))

    def roots() -> dict[str, str]:
        return {m["id"]: m["root"] for m in httpx.get(vllm.url + "/v1/models").json()["data"]}

    try:
        assert await worker.train_once(await worker.db.read(get_policy, "agent"))
        elsewhere = shutil.copytree(ckpts / "1" / "adapter", tmp_path / "elsewhere" / "adapter")
        unload(vllm, (2,))
        assert httpx.post(vllm.url + "/v1/load_lora_adapter", json={"lora_name": "agent@2", "lora_path": str(elsewhere)}).status_code == 200
        assert roots()["agent@2"] == str(elsewhere)
        assert await worker.train_once(await worker.db.read(get_policy, "agent"))
        assert served_step(gw) == 2 and roots()["agent@2"] == str(ckpts / "2" / "adapter")
    finally:
        await worker.close()
        unload(vllm, (1, 2))


async def test_killed_trainer_resumes_without_loss_or_repeat(make_gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), **TINY)
    await make_groups(gw, 4)
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url)
    ckpts = tmp_path / "data" / "policies" / "agent" / "checkpoints"

    def worker() -> TrainerWorker:
        return TrainerWorker(settings, WorkerSettings(worker_id="w1"))

    # 1. Killed after writing checkpoint 1, before recording its step.
    first = worker()
    await first.recover()
    ids = await first.db.transaction(claim_groups, "agent", "w1", 2)
    policy = await first.db.read(get_policy, "agent")
    first.held.step(policy, await first.db.read(group_calls, ids), 1)
    assert (ckpts / "1").exists()
    await first.close()

    second = worker()
    await second.recover()
    assert not (ckpts / "1").exists()  # never counted: set aside, not served, not resumed from
    assert [p.name.startswith(".unrecorded-1-") for p in ckpts.iterdir()] == [True]
    assert await second.db.read(count_ready, "agent") == 4  # its groups wait again

    # 2. Killed after recording step 1, before switching the policy to it.
    ids = await second.db.transaction(claim_groups, "agent", "w1", 2)
    metrics = second.held.step(policy, await second.db.read(group_calls, ids), 1)
    assert await second.db.transaction(record_step, "agent", 1, 0, ids, "w1", metrics, str(ckpts / "1"))
    assert served_step(gw) == 0 and gw.policy()["pending_version"] == "agent@1"
    await second.close()

    third = worker()
    await third.recover()
    await third.publisher.pending(await third.db.read(get_policy, "agent"))
    assert served_step(gw) == 1  # the recorded step is served now, not trained again
    assert "agent@1" in [m["id"] for m in httpx.get(vllm.url + "/v1/models").json()["data"]]

    # 3. Business as usual: the two remaining groups make step 2, and nothing is left.
    assert await third.train_once(await third.db.read(get_policy, "agent"))
    assert served_step(gw) == 2
    assert not await third.train_once(await third.db.read(get_policy, "agent"))
    assert sorted(p.name for p in ckpts.iterdir() if p.name.isdigit()) == ["1", "2"]
    groups, steps = await third.db.read(trained)
    assert groups == [1, 1, 2, 2]  # every group once
    assert [s for s, _ in steps] == [1, 2] and set(steps[0][1]).isdisjoint(steps[1][1])
    await third.close()
    unload(vllm, (1, 2))


def test_sigkilled_trainer_process_resumes(make_gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    """kill -9 a real `burnish trainer` as soon as it claims groups, twice; the third run finishes the work."""
    import asyncio

    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), **TINY)
    asyncio.run(make_groups(gw, 6))
    env = {**os.environ, "BURNISH_DATA_DIR": gw.settings.data_dir}
    command = [sys.executable, "-m", "burnish_server.cli", "trainer", "--upstream", vllm.url, "--worker-id", "killme"]

    def run_until_claims(claims: int, log: Path) -> None:
        """Start a trainer; SIGKILL it when it has claimed groups for the `claims`-th time."""
        with log.open("wb") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while log.read_text().count("claimed") < claims:
            assert proc.poll() is None, last_lines(log)
            assert time.monotonic() < deadline, last_lines(log)
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    # Killed in its first step (the model is still loading: nothing was recorded).
    run_until_claims(1, tmp_path / "t1.log")
    assert gw.policy()["last_step"] is None and gw.policy()["groups_ready"] == 4  # 2 of 6 held by the dead claim
    # Restarted with the same worker id: it releases the claim at once, makes step 1, and is killed in step 2.
    run_until_claims(2, tmp_path / "t2.log")
    assert "released 2 groups" in (tmp_path / "t2.log").read_text()
    # The third run finishes.
    log = tmp_path / "t3.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while served_step(gw) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, last_lines(log)
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)

    status = gw.policy()
    assert status["groups_ready"] == 0 and status["groups_trained"] == 6
    with gw.admin() as c:
        steps = c.get("/admin/policies/agent/checkpoints").json()["data"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    every_group = [g for s in steps for g in s["groups"]]
    assert sorted(every_group) == [f"grp{g}" for g in range(6)]  # each trained exactly once
    ckpts = Path(gw.settings.data_dir) / "policies" / "agent" / "checkpoints"
    # Every recorded step has its checkpoint, nothing half-written is left; a step killed after its
    # rename but before its record would be set aside as .unrecorded-N-*.
    assert sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".unrecorded-")) == ["1", "2", "3"]
    unload(vllm, (1, 2, 3))
