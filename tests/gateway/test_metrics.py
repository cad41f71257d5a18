"""/metrics after known traffic, parsed with prometheus-client's own parser: the right counts."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from burnish_server.core.learning.drift import REASONS
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.store.database import Database
from burnish_server.store.training import claim_groups
from burnish_server.store.versions import record_step
from tests.conftest import Gateway
from tests.upstream import Upstream

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "count me"}]}


def scrape(gw: Gateway) -> dict[tuple[str, tuple], float]:
    r = httpx.get(gw.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_count_known_traffic(make_gateway, upstream: Upstream, database_url: str) -> None:
    gw = make_gateway(database_url, upstream_attempts=1)
    with gw.client() as c:
        for i in range(3):
            assert c.post(f"/g/grp/t/ok-{i}/v1/chat/completions", json=CHAT).status_code == 200
        with c.stream("POST", "/t/streamed/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status_code == 200 and r.read()
        assert c.post("/t/failed/v1/chat/completions", json=CHAT, headers={"x-fault": "status:503"}).status_code == 503
        assert c.post("/v1/completions", json={"model": "tiny", "prompt": "p"}).status_code == 200
        for i, reward in enumerate((0.0, 1.0)):
            c.post(f"/v1/trajectories/ok-{i}/reward", json={"reward": reward})
        c.post("/v1/groups/grp/close")

    m = scrape(gw)
    chat = ("endpoint", "chat.completions")
    assert m[("burnish_requests_total", (chat, ("status", "200")))] == 4  # 3 plain + 1 streamed
    assert m[("burnish_requests_total", (chat, ("status", "503")))] == 1
    assert m[("burnish_requests_total", (("endpoint", "completions"), ("status", "200")))] == 1
    assert m[("burnish_added_latency_seconds_count", (chat,))] == 5
    assert m[("burnish_upstream_latency_seconds_count", (chat,))] == 5
    assert 0 < m[("burnish_added_latency_seconds_sum", (chat,))] < m[("burnish_added_latency_seconds_count", (chat,))]  # under 1 s each
    # Every call and every reward/close went through the writer's commits.
    assert m[("burnish_commit_batch_size_sum", ())] == 6 + 2 + 1
    # ... each timed: as many commits, each well under a second.
    commits = m[("burnish_commit_batch_size_count", ())]
    assert m[("burnish_commit_seconds_count", ())] == commits and 0 < m[("burnish_commit_seconds_sum", ())] < commits
    assert m[("burnish_record_queue", ())] == 0
    # The calls are over: their connections wait idle for the next, to the one replica.
    assert m[("burnish_upstream_connections", (("state", "in_use"),))] == 0
    assert m[("burnish_upstream_connections", (("state", "idle"),))] >= 1
    assert m[("burnish_upstream_origins", ())] == 1
    assert m[("burnish_trajectories", (("state", "rewarded"),))] == 2
    assert m[("burnish_trajectories", (("state", "unrewarded"),))] == 4
    assert m[("burnish_groups", (("policy", ""), ("state", "closed")))] == 1


def test_metrics_show_the_trainers_steps(make_gateway, upstream: Upstream, database_url: str) -> None:
    """Trainer figures come from the store, so the gateway reports them without the trainer."""
    gw = make_gateway(database_url)
    gw.create_policy("agent", "tiny")
    with gw.client() as c:
        for g in ("a", "b"):
            for i in range(2):
                c.post(f"/g/{g}/t/{g}-{i}/v1/chat/completions", json={**CHAT, "model": "agent"})
                c.post(f"/v1/trajectories/{g}-{i}/reward", json={"reward": float(i)})
            c.post(f"/v1/groups/{g}/close")

    async def step() -> None:
        db = Database(gw.settings.resolved_database_url)
        try:
            ids = await db.transaction(claim_groups, "agent", "w", 1)
            metrics = StepMetrics(
                seconds=2.5, reward_mean=0.5, split_tool_call_rerendered=3.0, mismatch_kl=0.0123, clip_fraction=0.25, tis_capped_fraction=0.125
            )
            await db.transaction(record_step, "agent", 1, 0, ids, "w", metrics, "/c/1")
            await db.transaction(claim_groups, "agent", "w", 1)  # the second group: being trained
        finally:
            await db.dispose()

    asyncio.run(step())
    m = scrape(gw)
    agent = ("policy", "agent")
    assert m[("burnish_trainer_steps", (agent,))] == 1
    assert m[("burnish_trainer_step_seconds", (agent,))] == 2.5
    assert m[("burnish_policy_reward_mean", (agent,))] == 0.5
    assert m[("burnish_groups", (agent, ("state", "trained")))] == 1
    assert m[("burnish_groups", (agent, ("state", "training")))] == 1
    assert m[("burnish_sequence_splits", (agent, ("reason", "tool_call_rerendered")))] == 3
    assert m[("burnish_sequence_splits", (agent, ("reason", "prompt_cut")))] == 0
    assert gw.policy("agent")["splits"] == {reason: 3 if reason == "tool_call_rerendered" else 0 for reason in REASONS}  # the status says the same
    # The off-policy figures: in the metrics history, and in the dashboard's versions table.
    with gw.admin() as c:
        (first,) = c.get("/admin/policies/agent/metrics").json()["data"]
        page = c.get("/ui/policies/agent").text
    assert (first["mismatch_kl"], first["tis_capped_fraction"]) == (0.0123, 0.125)
    assert "Mismatch KL" in page and "1.23e-02" in page and "0.250 / 0.125" in page and "tis_capped_fraction" in page


def test_no_policy_ever_made_no_trainer_series(make_gateway, upstream: Upstream) -> None:
    gw = make_gateway()
    m = scrape(gw)
    assert not [k for k in m if k[0].startswith("burnish_trainer")]
    assert m[("burnish_trajectories", (("state", "rewarded"),))] == 0
