"""A trainer killed mid-step: the restarted one neither loses a group nor trains one twice.

The two places a kill can leave something behind are recreated exactly: after the
checkpoint is written but before its groups are marked, and after they are marked but
before the policy switches to the new version.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from gateway.policies import Policy, write_policies
from gateway.settings import Settings
from gateway.store.training import (
    claim_groups,
    complete_groups,
    count_ready,
    group_calls,
)
from gateway.vllm_server import VLLMServer
from tests.conftest import served_step
from trainer.policy_model import LoraSettings, TrainSettings
from trainer.worker import TrainerWorker, WorkerSettings

GROUPS, SIZE = 4, 2


async def test_killed_trainer_resumes_without_loss_or_repeat(make_gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    policies = tmp_path / "policies.json"
    write_policies(policies, [Policy("agent", base_model="tiny", model_path=str(tiny_model))])
    gw = make_gateway(upstream=vllm.url, policies_file=str(policies), upstream_timeout=120)
    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        for g in range(GROUPS):
            for i in range(SIZE):
                r = await client.post(
                    f"/g/grp{g}/t/grp{g}-{i}/v1/chat/completions",
                    json={"model": "agent", "messages": [{"role": "user", "content": "digits"}], "max_tokens": 8},
                    headers={"x-group-size": str(SIZE)},
                )
                assert r.status_code == 200
                assert (await client.post(f"/v1/trajectories/grp{g}-{i}/reward", json={"reward": float(i)})).status_code == 200

    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url, policies_file=str(policies))

    def worker() -> TrainerWorker:
        return TrainerWorker(settings, lora=LoraSettings(rank=8, alpha=16), train=TrainSettings(learning_rate=5e-3), worker=WorkerSettings(worker_id="w1"))

    policy = Policy("agent", base_model="tiny", model_path=str(tiny_model))
    ckpts = tmp_path / "data" / "policies" / "agent" / "checkpoints"

    # 1. Killed after writing checkpoint 1, before marking its groups.
    first = worker()
    await first.recover()
    ids = await first.db.transaction(claim_groups, "agent", "w1", 2)
    first.train_and_save(policy, await first.db.transaction(group_calls, ids), 1)
    assert (ckpts / "1").exists()
    await first.close()

    second = worker()
    await second.recover()
    assert not (ckpts / "1").exists()  # never counted: discarded
    assert await second.db.transaction(count_ready, "agent") == GROUPS  # its groups wait again

    # 2. Killed after marking step 1, before switching the policy to it.
    ids = await second.db.transaction(claim_groups, "agent", "w1", 2)
    second.train_and_save(policy, await second.db.transaction(group_calls, ids), 1)
    await second.db.transaction(complete_groups, ids, "w1", 1)
    assert served_step(policies) == 0
    await second.close()

    third = worker()
    await third.recover()
    for p in list(third.registry.policies.values()):
        await third.publish_pending(p)
    assert served_step(policies) == 1  # the trained step is served now, not trained again
    assert "agent@1" in [m["id"] for m in httpx.get(vllm.url + "/v1/models").json()["data"]]

    # 3. Business as usual: the two remaining groups make step 2, and nothing is left.
    third.registry.reload()
    assert await third.train_once(third.registry.policies["agent"])
    assert served_step(policies) == 2
    assert not await third.train_once(third.registry.policies["agent"])
    assert sorted(p.name for p in ckpts.iterdir()) == ["1", "2"]

    def trained_steps(conn):
        from sqlalchemy import select

        from gateway.store.models import Group

        return sorted(conn.execute(select(Group.trained_step)).scalars())

    assert await third.db.transaction(trained_steps) == [1, 1, 2, 2]  # every group once
    await third.close()
    for step in (1, 2):
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": f"agent@{step}"})
