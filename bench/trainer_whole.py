"""The trainer's whole step as ``burnish trainer`` takes it on one device: the real
``TrainerWorker`` (``trainer/worker.py``) against a store of recorded calls, publishing to a
loopback stand-in for vLLM (``bench/vllm_standin.py``: the GPU machine has no vLLM), read,
batch, step, save, record and publish each timed.

Run from the repository root (on a GPU: ``bench/gpu.sh`` runs it; on the CPU, a small shape)::

    python3 bench/trainer_whole.py --model qwen2.5-1.5b [--groups 4 --group-size 8 --passes 2]
    .venv/bin/python bench/trainer_whole.py --model qwen2-tiny --groups 2 --group-size 4 --prompt-len 64 --answer-len 16

What it sets up, as a deployment has it: a fresh SQLite store in a temporary folder, migrated
(``Database.migrate``, as ``burnish db upgrade`` and every process do); the policy ``agent`` on
the model (``store/policies.py: create_policy``: LoRA r=16, alpha 32, learning rate 5e-4,
``--groups`` groups a step, promotion immediate); the stand-in serving the model as its base.
Then, ``--passes`` times: the calls of ``--groups`` x ``--group-size`` two-call agent
trajectories written through the store's own writes (``store/writes.py``: ``insert_calls`` for
the calls, as the gateway's group commit writes them, with token ids and logprobs as
``bench/trainer_step.py`` builds them, sampled by the step then served; ``PostReward`` for each
trajectory's reward, the last of a group closing it), then one ``TrainerWorker.run_once()``,
after ``recover()`` as ``TrainerWorker.run`` does. The first pass builds the model on the device
(``load``); the later ones are the steady state.

Each pass's figures, from what the worker records in the store's ``steps`` table (its
``metrics`` and ``publish_seconds``) and the pass's wall time around ``run_once``:

* ``read``: ``seconds_read``: the claim of the ready groups and the read of their calls;
* ``load``: ``seconds_load``: the policy's model built (first pass) or found in memory;
* ``batch``, ``step``, ``save``: ``seconds_batch``, ``seconds_step``, ``seconds_save``: the
  calls to sequences and advantages, the GRPO step, the checkpoint written;
* ``publish``: ``publish_seconds``: the adapter loaded into the stand-in and checked to answer
  (the trainer's side of a publish; a real vLLM's load of the adapter is not in it);
* ``record``: the rest of the pass, which the worker does not time apart: the pass's wall time
  less the above and the worker's own bookkeeping inside its step (metrics.json): the step
  recorded in the store (one transaction), the policy read and switched to the new version,
  the catch-up pass over the replicas (the stand-in's models listed, each replica's standing
  written), the checkpoint's move into place and the old adapters unloaded.

The device is synchronised at each pass's start and end. Prints one JSON line; writes ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

POLICY = "agent"  # the policy bench/trainer_step.py's recorded calls name


def rewarded(conn: Any, rewards: list[tuple[str, float]]) -> int:
    """Each trajectory's reward posted as the gateway posts it; the groups it closed."""
    from burnish_server.store.writes import PostReward

    return sum(bool(PostReward(trajectory, reward).apply(conn)["group_closed"]) for trajectory, reward in rewards)


async def whole(args: argparse.Namespace, model: Path, vocab: int, work: Path) -> dict[str, Any]:
    import msgspec
    import torch
    from trainer_step import recorded_rows
    from vllm_standin import VLLMStandIn

    from burnish_server.core.learning.policies import LoraSettings, Policy, PromotionSettings, TrainSettings
    from burnish_server.core.learning.steps import StepMetrics
    from burnish_server.core.platform.settings import Settings
    from burnish_server.store.database import Database
    from burnish_server.store.policies import create_policy, get_policy, list_steps
    from burnish_server.store.writes import insert_calls
    from burnish_server.trainer.worker import TrainerWorker, WorkerSettings

    cuda = torch.cuda.is_available()

    def sync() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    # Every pass's calls, made at once so that the seed gives the same batches as trainer_step.py's.
    rows = recorded_rows(argparse.Namespace(**{**vars(args), "groups": args.groups * args.passes}), vocab)
    per_pass = len(rows) // args.passes
    with VLLMStandIn(args.model, str(model)) as vllm:
        # The stand-in has no weights to score the fidelity probe with (core/learning/fidelity.py).
        settings = Settings.load({}, data_dir=str(work / "data"), upstream=vllm.url, trainer_fidelity=False)
        db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        await db.migrate()
        train = TrainSettings(learning_rate=5e-4, groups_per_step=args.groups)
        await db.transaction(
            create_policy,
            Policy(
                name=POLICY,
                base_model=args.model,
                model_path=str(model),
                lora=LoraSettings(rank=16, alpha=32),
                train=train,
                promotion=PromotionSettings(rule="immediate"),
            ),
        )
        worker = TrainerWorker(settings, WorkerSettings(worker_id="bench-whole"))
        passes: list[dict[str, Any]] = []
        try:
            await worker.recover()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            for n in range(args.passes):
                served = (await db.read(get_policy, POLICY)).step
                mine = rows[n * per_pass : (n + 1) * per_pass]
                # Sampled by the version then served, as the gateway records it.
                await db.transaction(insert_calls, [msgspec.structs.replace(r.call, policy_step=served) for r in mine])
                rewards = list({r.trajectory_id: r.reward for r in mine}.items())
                closed = await db.transaction(rewarded, rewards)
                assert closed == args.groups, f"{closed} groups closed, not {args.groups}"
                t0 = sync()
                trained = await worker.run_once()
                wall = sync() - t0
                assert trained, "the worker trained nothing"
                passes.append({"pass": n + 1, "wall_s": wall, "calls": len(mine)})
            steps = await db.read(list_steps, POLICY)
            policy = await db.read(get_policy, POLICY)
            base = next(iter(worker.held.bases.values()))
            checkpointing, packed = base.checkpointing, base.packs
        finally:
            await worker.close()
            await db.dispose()
        standin = dict(vllm.calls)
        adapters = list(vllm.adapters)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    assert len(steps) == args.passes and policy.step == args.passes, f"steps {[s.step for s in steps]}, served {policy.step}"
    for figures, step in zip(passes, steps, strict=True):
        m = step.metrics
        assert isinstance(m, StepMetrics) and step.publish_seconds is not None
        figures.update(
            step=step.step,
            read_s=m.seconds_read,
            load_s=m.seconds_load,
            batch_s=m.seconds_batch,
            step_s=m.seconds_step,
            save_s=m.seconds_save,
            publish_s=step.publish_seconds,
            # The worker's step (m.seconds) is load + batch + step + save + writing metrics.json.
            record_s=figures["wall_s"] - m.seconds_read - (m.seconds or 0.0) - step.publish_seconds,
            sequences=m.sequences,
            sampled=m.tokens,
            loss=m.loss,
        )
    return {
        "model": args.model,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "store": "sqlite",
        "groups": args.groups,
        "group_size": args.group_size,
        "calls": per_pass,
        "checkpointing": checkpointing,
        "packed": packed,
        "passes": passes,
        "served_step": policy.step,
        "standin": standin,
        "standin_adapters": adapters,
        "peak_memory": peak,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", help="a shape from bench/vs_trl.py (random weights) or a local HF model")
    ap.add_argument("--groups", type=int, default=4, help="groups a step (the policy's groups_per_step)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=600)
    ap.add_argument("--answer-len", type=int, default=150)
    ap.add_argument("--same-prompt", action="store_true", help="a group's trajectories share their first prompt")
    ap.add_argument("--passes", type=int, default=2, help="run_once passes, each on its own groups; the first builds the model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "trainer_whole.json")
    args = ap.parse_args()
    if args.passes < 1 or args.groups < 1 or args.group_size < 2:
        ap.error("--passes and --groups at least 1, --group-size at least 2")

    import vs_trl

    if path := vs_trl.import_path():
        sys.path.insert(0, path)
    from trainer_step import model_folder

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("burnish").setLevel(logging.INFO)  # the worker's own lines: each step's figures, each publish
    with tempfile.TemporaryDirectory(prefix="burnish-whole-") as tmp:
        work = Path(tmp)
        model, vocab = model_folder(args.model, work, args.seed)
        result = asyncio.run(whole(args, model, vocab, work))
    print(json.dumps(result), flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
