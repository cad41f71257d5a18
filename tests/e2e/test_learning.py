"""The proof: an agent loop through the gateway, a programmatic reward, the trainer in its
own process, and vLLM serving each new adapter. The reward rises, and the late calls are
served by trained versions.

The agent is examples/digits.py (through the SDK): asked "Write some digits.", it earns the
share of digit characters in its answer. It samples with top_k 50: from the full vocabulary
of a random model, learning takes far longer (measured: 0.09 -> 0.14 in 30 steps, against
0.07 -> 0.74 with top_k 50).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from burnish import AsyncClient
from burnish_server.serving.process import VLLMServer, last_lines
from tests.conftest import ADMIN_TOKEN, Gateway, served_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from digits import play_round  # noqa: E402

# Groups of 8: with 4, the rise came between round 12 and round 23, and in some runs not
# within 36 rounds; with 8 it came by round 13 (docs/trainer.md).
ROUNDS, GROUPS, GROUP_SIZE = 36, 2, 8
# A round takes a few seconds; past this it is stuck. Below the SDK's and the upstream's 120 s
# time-outs, so that the report is taken while whatever is stuck still is.
ROUND_TIMEOUT_S = 90


def gateway_tasks() -> list[asyncio.Task]:
    """The tasks of the other event loops in this process (the in-process gateways' loops)."""
    here = asyncio.get_running_loop()
    return [task for task in list(asyncio.tasks._all_tasks) if task.get_loop() is not here and not task.done()]


def awaiting(coro) -> list[str]:
    """Where a suspended coroutine waits: each frame down its await chain."""
    out = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            out.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out


def stuck_report(gw: Gateway, vllm: VLLMServer, trainer_log: Path) -> str:
    """What a stuck round leaves to look at: the gateway's queue, every thread's stack, the logs."""
    try:
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        queue = "\n".join(
            line for line in metrics.splitlines() if line.startswith(("burnish_record_queue", "burnish_requests_total", "burnish_commit_batch_size_count"))
        )
    except httpx.HTTPError as exc:
        queue = f"/metrics did not answer: {exc!r}"
    try:  # is SQLite's write lock held (by the trainer, or by the gateway's own writer)?
        db = sqlite3.connect(make_url(gw.settings.resolved_database_url).database, timeout=1)
        db.execute("BEGIN IMMEDIATE")
        db.rollback()
        lock = "the store's write lock is free"
    except sqlite3.OperationalError as exc:
        lock = f"the store's write lock is held: {exc}"
    tasks = "\n".join(" <- ".join(awaiting(task.get_coro())) for task in gateway_tasks()) or "(none found)"
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = "\n".join(f"-- {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame)[-6:])}" for ident, frame in sys._current_frames().items())
    return f"{queue}\n{lock}\n== the gateway's tasks, outermost first\n{tasks}\n== threads\n{stacks}\n== trainer\n{last_lines(trainer_log, 15)}\n== vllm\n{last_lines(vllm.log_path, 25)}"


def test_reward_rises_through_the_whole_loop(make_gateway, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    gw: Gateway = make_gateway(upstream=vllm.url, upstream_timeout=120)
    # The embedded default's settings for the tiny model (cli/up.py).
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), lora={"rank": 8, "alpha": 16}, train={"learning_rate": 5e-3, "groups_per_step": GROUPS})
    env = {**os.environ, "BURNISH_DATA_DIR": gw.settings.data_dir}
    trainer_log = (tmp_path / "trainer.log").open("wb")
    trainer = subprocess.Popen(
        [sys.executable, "-m", "burnish_server.cli", "trainer", "--upstream", vllm.url], env=env, stdout=trainer_log, stderr=subprocess.STDOUT
    )
    means, versions = [], []
    trainable = 0  # groups whose rewards differ: only those are ever trained (GRPO learns nothing from a tie)

    async def loop() -> None:
        nonlocal trainable
        async with AsyncClient(gw.url, admin_token=ADMIN_TOKEN) as client:
            for round_no in range(ROUNDS):
                try:
                    results = await asyncio.wait_for(play_round(client, round_no, groups=GROUPS, size=GROUP_SIZE), ROUND_TIMEOUT_S)
                except TimeoutError:
                    pytest.fail(f"round {round_no} stuck for {ROUND_TIMEOUT_S} s\n{stuck_report(gw, vllm, tmp_path / 'trainer.log')}")
                means.append(sum(r for r, _ in results) / len(results))
                versions.append({v for _, v in results})
                groups = [[r for r, _ in results[g * GROUP_SIZE : (g + 1) * GROUP_SIZE]] for g in range(GROUPS)]
                trainable += sum(max(g) > min(g) for g in groups)
                # Each round samples from the newest version: wait until the gateway routes to it.
                waiting = asyncio.create_task(client.wait_for_step("agent", trainable // GROUPS, timeout=120))
                while not waiting.done():
                    assert trainer.poll() is None, last_lines(tmp_path / "trainer.log")
                    await asyncio.sleep(0.1)
                waiting.result()

    try:
        asyncio.run(loop())
    finally:
        trainer.send_signal(signal.SIGINT)
        trainer.wait(timeout=60)
        trainer_log.close()
    first, last = sum(means[:5]) / 5, sum(means[-5:]) / 5
    print(f"mean reward per round: {[round(m, 3) for m in means]}")
    # Measured (docs/trainer.md): first rounds ~0.07, last rounds ~0.75. Threshold: a rise of 0.2.
    assert last > first + 0.2, (means, versions)
    assert versions[0] == {"agent@0"}
    late_steps = [int(v.split("@")[1]) for vs in versions[-5:] for v in vs]
    assert min(late_steps) >= 10, versions[-5:]  # served by trained versions
    # Every trainable pair of groups made exactly one step, each checkpointed.
    final = served_step(gw)
    assert final == trainable // GROUPS
    checkpoints = sorted(int(p.name) for p in (Path(gw.settings.data_dir) / "policies" / "agent" / "checkpoints").iterdir() if p.name.isdigit())
    assert checkpoints == list(range(1, final + 1))
    # The metrics history has one entry per step, and its rewards rise too.
    with gw.admin() as c:
        history = c.get("/admin/policies/agent/metrics").json()["data"]
    assert [h["step"] for h in history] == checkpoints
    assert all(h["groups"] == GROUPS and h["tokens"] > 0 and h["published_at"] for h in history)
    assert sum(h["reward_mean"] for h in history[-5:]) / 5 > sum(h["reward_mean"] for h in history[:5]) / 5
