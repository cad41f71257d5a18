"""The admin controls acting on a real trainer and vLLM: train now, pause, rollback, a failed load.

The trainer runs in this process (``TrainerWorker.run_once``, one pass at a time), so the
test decides when it looks; everything else is real: gateway, store, vLLM, adapters.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import torch
from langfuse import Langfuse

from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.policies.routing import REFRESH_EVERY_S
from burnish_server.serving.process import VLLMServer
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
from tests.conftest import langfuse_settings
from tests.langfuse_server import Langfuse as LangfuseStandIn
from tests.trainer.test_trainer_recovery import ready_group, unload


async def test_train_now_pause_rollback_and_a_failed_load(
    make_gateway, vllm: VLLMServer, tiny_model: Path, langfuse: LangfuseStandIn, langfuse_server: tuple[LangfuseStandIn, str]
) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), lora={"rank": 8, "alpha": 16}, train={"learning_rate": 5e-3, "groups_per_step": 4})
    # The trainer also sends each step to Langfuse as an event.
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url, **langfuse_settings(langfuse_server[1]))
    worker = TrainerWorker(settings, WorkerSettings(worker_id="admin-test"))
    await worker.recover()
    admin = gw.admin()
    try:
        # Two ready groups, four per step: the trainer waits...
        await ready_group(gw, "a")
        await ready_group(gw, "b")
        assert not await worker.run_once()
        assert gw.policy()["groups_ready"] == 2
        # ...until asked to train now; then it trains on what is ready, and the request is spent.
        assert admin.post("/admin/policies/agent/train").status_code == 202
        assert gw.policy()["train_requested_at"] is not None
        assert await worker.run_once()
        status = gw.policy()
        assert (status["step"], status["head"], status["train_requested_at"], status["groups_ready"]) == (1, 1, None, 0)
        assert status["last_step"]["groups"] == ["a", "b"] and status["last_step"]["metrics"]["groups"] == 2

        # Paused: nothing trains, even with a full step's worth ready.
        assert admin.post("/admin/policies/agent/pause").json()["paused"] is True
        for g in "cdef":
            await ready_group(gw, g)
        assert not await worker.run_once()
        assert gw.policy()["step"] == 1 and gw.policy()["groups_ready"] == 4
        admin.post("/admin/policies/agent/resume")
        assert await worker.run_once()
        assert gw.policy()["step"] == 2

        # Roll back to step 1: served again, and the next step trains from it.
        r = admin.post("/admin/policies/agent/rollback", json={"step": 1})
        assert r.status_code == 202 and r.json()["pending_version"] == "agent@1"
        await worker.run_once()
        assert gw.policy()["step"] == 1 and gw.policy()["pending_version"] is None
        await asyncio.sleep(REFRESH_EVERY_S * 2 + 0.1)  # the gateway follows the store
        with gw.client() as c:
            r = c.post("/t/after-rollback/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert r.headers["x-policy-version"] == "agent@1"
        for g in "ghij":
            await ready_group(gw, g)
        assert await worker.run_once()
        steps = admin.get("/admin/policies/agent/checkpoints").json()["data"]
        assert [(s["step"], s["parent"], s["serving"]) for s in steps] == [(1, 0, False), (2, 1, False), (3, 1, True)]
        assert all(s["published_at"] and s["publish_seconds"] < 30 for s in steps)
        history = admin.get("/admin/policies/agent/metrics").json()["data"]
        assert [h["step"] for h in history] == [1, 2, 3]
        for key in "reward_mean reward_std loss kl tokens seconds_step seconds_save seconds_read sequence_splits untokenized_calls".split():
            assert all(key in h for h in history), key
        # In Langfuse: one event per step, in a trace of its own, with the step's metrics and groups.
        deadline = time.monotonic() + 15
        while len(langfuse.events()) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        events = {e["traceId"]: e["attributes"] for e in langfuse.events()}
        assert len(events) == 3
        for h, parent, groups in zip(history, (0, 1, 1), ("ab", "cdef", "ghij")):
            event = events[Langfuse.create_trace_id(seed=f"train:agent@{h['step']}")]
            assert event["session.id"] == "train:agent" and event["langfuse.version"] == f"agent@{h['step']}"
            assert event["langfuse.observation.input"] == {"parent": parent, "groups": list(groups)}
            assert event["langfuse.observation.output"]["loss"] == h["loss"] and event["langfuse.observation.output"]["reward_mean"] == h["reward_mean"]

        # A version vLLM cannot load: the old one keeps serving and the error shows in status.
        unload(vllm, (2,))
        shutil.rmtree(Path(gw.settings.data_dir) / "policies" / "agent" / "checkpoints" / "2" / "adapter")
        admin.post("/admin/policies/agent/rollback", json={"step": 2})
        await worker.run_once()
        status = gw.policy()
        assert status["step"] == 3 and status["pending_version"] == "agent@2"
        assert "agent@2" in status["load_error"] and status["load_error_at"]
        # Rolling forward to a good version clears it.
        admin.post("/admin/policies/agent/rollback", json={"step": 3})
        await worker.run_once()
        status = gw.policy()
        assert (status["step"], status["load_error"], status["pending_version"]) == (3, None, None)
    finally:
        admin.close()
        await worker.close()
        unload(vllm, (1, 2, 3))


async def test_an_idle_policy_leaves_the_trainers_memory_and_its_next_step_resumes(make_gateway, vllm: VLLMServer, tiny_model: Path) -> None:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), lora={"rank": 8, "alpha": 16}, train={"learning_rate": 5e-3, "groups_per_step": 1})
    # Idle after 10 s: longer than a pass that trains and publishes takes on a loaded machine.
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url, trainer_idle_unload=10.0)
    worker = TrainerWorker(settings, WorkerSettings(worker_id="idle-test"))
    await worker.recover()
    try:
        await ready_group(gw, "a")
        assert await worker.run_once()
        assert set(worker.held.models) == {"agent"} and len(worker.held.bases) == 1
        await asyncio.sleep(10.1)
        assert not await worker.run_once()
        assert worker.held.models == {} and worker.held.bases == {}  # the adapter, its optimizer and the base: gone
        # The next step loads the base again and resumes from step 1's checkpoint, optimizer included.
        await ready_group(gw, "b")
        assert await worker.run_once()
        assert worker.held.models["agent"].step_count == 2 and gw.policy()["last_step"]["parent"] == 1
        state = torch.load(worker.checkpoints.step("agent", 2) / "optimizer.pt")["state"]
        assert {float(s["step"]) for s in state.values()} == {2.0}  # AdamW's second step, not a first again
    finally:
        await worker.close()
