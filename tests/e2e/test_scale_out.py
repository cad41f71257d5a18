"""Several gateways and several trainers on one PostgreSQL, as in a scaled-out deployment:
two `burnish gateway` processes take concurrent traffic for two policies, two `burnish
trainer` processes train them. Every call is recorded exactly once, and every ready group is
trained exactly once, each policy's steps in order."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from burnish_server.serving.process import VLLMServer, last_lines
from tests.conftest import ADMIN_TOKEN, wait_for
from tests.servers import free_port

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("database_url", ["postgres"], indirect=True)]
GROUPS_PER_POLICY, SIZE = 8, 2
POLICIES = ("alpha", "beta")


def spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "burnish_server.cli", *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, last_lines(log)
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(last_lines(log))


def test_two_gateways_two_trainers_one_postgres(database_url: str, vllm: VLLMServer, tiny_model: Path, tmp_path: Path) -> None:
    env = {**os.environ, "BURNISH_DATABASE_URL": database_url, "BURNISH_DATA_DIR": str(tmp_path / "data"), "BURNISH_ADMIN_TOKEN": ADMIN_TOKEN}
    procs: list[tuple[subprocess.Popen, Path]] = []
    try:
        urls = []
        for n in range(2):
            port, log = free_port(), tmp_path / f"gateway{n}.log"
            proc = spawn(["gateway", "--upstream", vllm.url, "--port", str(port)], log, env)
            procs.append((proc, log))
            urls.append(f"http://127.0.0.1:{port}")
            wait_healthy(urls[-1], proc, log)
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        for policy in POLICIES:
            body = {
                "name": policy,
                "base_model": "tiny",
                "model_path": str(tiny_model),
                "lora": {"rank": 8, "alpha": 16},
                "train": {"learning_rate": 5e-3, "groups_per_step": 2},
            }
            assert httpx.post(urls[0] + "/admin/policies", json=body, headers=admin).status_code == 201
        # The other gateway learns of a new policy from the store within its refresh interval
        # (gateway/policies/routing.py); until then it would pass "alpha" through to vLLM untouched.
        for url in urls:
            wait_for(lambda url=url: {m["id"] for m in httpx.get(url + "/v1/models").json()["data"]} >= set(POLICIES), 10, f"{url} never listed the policies")
        for n in range(2):
            log = tmp_path / f"trainer{n}.log"
            procs.append((spawn(["trainer", "--upstream", vllm.url, "--worker-id", f"trainer-{n}"], log, env), log))

        async def traffic() -> None:
            async with httpx.AsyncClient(timeout=120) as client:

                async def member(policy: str, g: int, i: int) -> None:
                    gateway = urls[(g + i) % 2]  # a group's members land on both gateways
                    group, trajectory = f"{policy}-g{g}", f"{policy}-g{g}-{i}"
                    r = await client.post(
                        f"{gateway}/g/{group}/t/{trajectory}/v1/chat/completions",
                        json={"model": policy, "messages": [{"role": "user", "content": f"{g} {i}"}], "max_tokens": 4},
                        headers={"x-group-size": str(SIZE)},
                    )
                    assert r.status_code == 200, r.text
                    r = await client.post(f"{urls[i % 2]}/v1/trajectories/{trajectory}/reward", json={"reward": float(i)})
                    assert r.status_code == 200, r.text

                await asyncio.gather(*(member(p, g, i) for p in POLICIES for g in range(GROUPS_PER_POLICY) for i in range(SIZE)))

        asyncio.run(traffic())
        deadline = time.monotonic() + 240
        while True:
            status = [httpx.get(f"{urls[1]}/admin/policies/{p}", headers=admin).json() for p in POLICIES]
            if all(s["groups_trained"] == GROUPS_PER_POLICY and s["step"] == GROUPS_PER_POLICY // 2 for s in status):
                break
            for proc, log in procs:
                assert proc.poll() is None, last_lines(log)
            assert time.monotonic() < deadline, (status, [last_lines(log) for _, log in procs[2:]])
            time.sleep(0.5)
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGINT)
        for proc, _ in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for policy in POLICIES:
            for step in range(1, GROUPS_PER_POLICY // 2 + 1):
                httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": f"{policy}@{step}"})

    async def check() -> None:
        engine = create_async_engine(database_url)
        async with engine.connect() as conn:
            calls = (await conn.execute(text("SELECT trajectory_id, count(*) FROM calls GROUP BY trajectory_id"))).all()
            steps = (await conn.execute(text("SELECT policy, step, groups, trainer FROM steps ORDER BY policy, step"))).all()
            trained = (await conn.execute(text("SELECT count(*) FROM groups WHERE trained_at IS NOT NULL"))).scalar_one()
        await engine.dispose()
        assert len(calls) == len(POLICIES) * GROUPS_PER_POLICY * SIZE and all(n == 1 for _, n in calls)  # each call once
        for policy in POLICIES:
            mine = [s for s in steps if s.policy == policy]
            assert [s.step for s in mine] == list(range(1, GROUPS_PER_POLICY // 2 + 1))
            groups = [g for s in mine for g in s.groups]
            assert sorted(groups) == sorted(f"{policy}-g{g}" for g in range(GROUPS_PER_POLICY))  # each group once
        assert trained == len(POLICIES) * GROUPS_PER_POLICY
        print("steps by trainer:", {t: sum(s.trainer == t for s in steps) for t in {s.trainer for s in steps}})

    asyncio.run(check())
