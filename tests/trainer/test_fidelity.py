"""A version is served only as the trainer made it: vLLM's log-probabilities of each
checkpoint's probe against the trainer's (core/learning/fidelity.py), before it serves, after a
rollback, and on a replica caught up (the served version and one kept for pinned calls). The
probe itself is made as vLLM serves the adapter: LoRA's dropout off."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import msgspec
import torch

from burnish_server.core.learning.fidelity import NOISE_FLOORS, Probe
from burnish_server.core.learning.policies import LoraSettings, TrainSettings
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.adapters import VLLMAdapters, steps_of
from burnish_server.serving.process import VLLMServer
from burnish_server.store.policies import get_policy
from burnish_server.trainer.fidelity import make_probe
from burnish_server.trainer.policy_model import PolicyModel, make_micro_batch
from burnish_server.trainer.sequences import Sequence
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
from tests.conftest import served_step
from tests.trainer.test_trainer_recovery import TINY, make_groups, unload


def served(vllm: VLLMServer) -> set[str]:
    return {m["id"] for m in httpx.get(vllm.url + "/v1/models").json()["data"]}


async def test_a_wrong_adapter_under_a_steps_name_is_never_served(make_gateway, vllm: VLLMServer, tiny_model: Path) -> None:
    """Step 3's checkpoint holds step 1's weights (a copy gone wrong): vLLM loads them and
    answers, but not as step 3 was trained, so 3 is not served, the status says why, and vLLM
    drops it. Put right, it serves at the next try; a rollback is checked the same way."""
    # The session's vLLM may still hold another test's agent@3 and agent@4: after step 2 serves,
    # the publisher keeps the newest three (trainer_keep_loaded) and would unload agent@1, which
    # this test scores below. Start from no agent adapters.
    unload(vllm, steps_of("agent", list(served(vllm))))
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), **TINY)
    await make_groups(gw, 6)
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url, trainer_publish_retry=0)
    ckpts = Path(gw.settings.data_dir) / "policies" / "agent" / "checkpoints"
    worker = TrainerWorker(settings, WorkerSettings(worker_id="w1"))
    try:
        for step in (1, 2):
            assert await worker.train_once(await worker.db.read(get_policy, "agent"))
            assert served_step(gw) == step
        probe = msgspec.json.decode((ckpts / "2" / "probe.json").read_bytes(), type=Probe)
        assert probe.dtype == "float32" and 0 < probe.tokens <= 2 * 95
        # Served as trained: within the noise floor, by a wide margin.
        vllm_adapters = VLLMAdapters(vllm.url)
        noise = vllm_adapters.fidelity("agent@2", probe)
        another = vllm_adapters.fidelity("agent@1", probe)
        vllm_adapters.close()
        print(f"step 2 as served: {noise}; step 1's weights asked the same: {another}")
        assert noise.mean_abs < NOISE_FLOORS["float32"] / 10 < NOISE_FLOORS["float32"] < another.mean_abs

        # Step 3 is trained and recorded, then its adapter is overwritten with step 1's.
        policy = await worker.db.read(get_policy, "agent")
        assert await worker.stepper.step(policy) is not None
        right = shutil.copy(ckpts / "3" / "adapter" / "adapter_model.safetensors", ckpts / "right.safetensors")
        shutil.copy(ckpts / "1" / "adapter" / "adapter_model.safetensors", ckpts / "3" / "adapter" / "adapter_model.safetensors")
        assert not await worker.publisher.pending(await worker.db.read(get_policy, "agent"))
        status = gw.policy()
        assert served_step(gw) == 2 and status["pending_version"] == "agent@3"
        assert "does not serve agent@3 as trained" in status["load_error"] and "noise floor" in status["load_error"], status["load_error"]
        assert "agent@3" not in served(vllm)  # unloaded: no gateway sends a call to it

        shutil.copy(right, ckpts / "3" / "adapter" / "adapter_model.safetensors")
        assert await worker.publisher.pending(await worker.db.read(get_policy, "agent"))
        assert served_step(gw) == 3 and gw.policy()["load_error"] is None

        # A rollback is checked too: step 1 as it was trained.
        assert gw.admin().post("/admin/policies/agent/rollback", json={"step": 1}).status_code == 202
        assert await worker.publisher.pending(await worker.db.read(get_policy, "agent"))
        assert served_step(gw) == 1

        # A replica caught up (trainer/catch_up.py), as after a restart: the served version and
        # one kept for pinned calls, each checked as it loads. Step 3's weights are wrong again:
        # refused, said, and not left loaded for a pinned call to reach.
        unload(vllm, (1, 3))
        shutil.copy(ckpts / "1" / "adapter" / "adapter_model.safetensors", ckpts / "3" / "adapter" / "adapter_model.safetensors")
        replica = VLLMAdapters(vllm.url)
        try:
            held = worker.replicas.bring(replica, replica.model_ids(), [await worker.db.read(get_policy, "agent")], {"agent": [1, 3]})
        finally:
            replica.close()
        steps, error = held["agent"]
        assert 1 in steps and 3 not in steps and "agent@1" in served(vllm) and "agent@3" not in served(vllm), (steps, served(vllm))
        assert error is not None and "does not serve agent@3 as trained" in error, error
    finally:
        await worker.close()
        unload(vllm, (1, 2, 3))


def test_the_probe_is_made_with_dropout_off_as_vllm_serves_the_adapter(tiny_model: Path) -> None:
    """A policy with LoRA dropout 0.1: after a step the model is in train mode, where two
    forwards differ; the probe is the same every time (eval mode), and leaves the mode as it was."""
    model = PolicyModel(str(tiny_model), LoraSettings(rank=8, alpha=16, dropout=0.1), TrainSettings(learning_rate=1e-2))
    sequences = []
    for prompt, answer in (([3, 4, 5, 6], [7, 8, 9]), ([5, 6, 7], [8, 9, 10, 11])):
        seq = Sequence()
        seq.add(prompt, answer, None)
        sequences.append(seq)
    model.step([(sequences[0], 1.0), (sequences[1], -1.0)])  # LoRA's B away from 0: dropout now shows
    assert model.model.training
    micro = make_micro_batch([(s, 0.0) for s in sequences], model.pad_id, 64, model.device)
    noisy = [model.token_logprobs(micro).detach() for _ in range(2)]
    assert not torch.equal(*noisy)  # in train mode dropout moves every forward
    first, again = make_probe(model, sequences), make_probe(model, sequences)
    assert first is not None and again is not None and first.logprobs == again.logprobs
    assert model.model.training  # left as the step needs it
