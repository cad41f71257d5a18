"""Langfuse export: the real `langfuse` package's API client sending to a stand-in for
Langfuse's ingestion on a loopback socket (tests/langfuse_server.py). What arrives is
checked against what the gateway stored; a stalled or refusing Langfuse must cost the
gateway nothing, and what it could not send must be counted."""

from __future__ import annotations

import base64
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from langfuse import Langfuse
from prometheus_client.parser import text_string_to_metric_families

from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.app import create_app
from tests.conftest import Gateway, langfuse_settings, wait_for
from tests.judge import Judge, scores
from tests.langfuse_server import PUBLIC_KEY, SECRET_KEY
from tests.langfuse_server import Langfuse as LangfuseStandIn
from tests.servers import ServerThread, free_port
from tests.upstream import Upstream

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "temperature": 0.5}


def items(gw: Gateway) -> dict[tuple[str, str], float]:
    """burnish_langfuse_items_total by (kind, outcome), from /metrics."""
    text = httpx.get(gw.url + "/metrics").text
    return {
        (s.labels["kind"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "burnish_langfuse_items_total"
    }


def ns(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp).timestamp() * 1e6) * 1000


def test_calls_rewards_and_ruler_verdicts_arrive_as_generations_and_scores(
    make_gateway, langfuse: LangfuseStandIn, langfuse_server: tuple[LangfuseStandIn, str], judge: Judge, judge_server: tuple[Judge, str]
) -> None:
    gw = make_gateway(judge_base_url=judge_server[1], judge_model="judge", **langfuse_settings(langfuse_server[1]))
    gw.create_policy("agent", "tiny")
    with gw.client() as c:
        headers = {"x-group-id": "g1", "x-group-size": "2"}
        assert c.post("/v1/chat/completions", json={**CHAT, "model": "agent"}, headers={**headers, "x-trajectory-id": "t1"}).status_code == 200
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "model": "agent", "stream": True}, headers={**headers, "x-trajectory-id": "t2"}) as r:
            assert r.status_code == 200 and r.read()
        assert c.post("/v1/trajectories/t1/reward", json={"reward": 0.25, "components": {"format": 1.0}}).status_code == 200
        assert c.post("/v1/trajectories/t1/reward", json={"reward": 0.5}).status_code == 200  # the latest reward wins
        for t in ("t3", "t4"):  # different answers, or RULER would judge them as one
            body = {**CHAT, "model": "agent", "messages": [{"role": "user", "content": f"hello {t}"}]}
            assert c.post(f"/g/g2/t/{t}/v1/chat/completions", json=body).status_code == 200
        judge.script = [scores({"t3": 0.9, "t4": 0.1})]
        assert c.post("/v1/groups/g2/ruler", json={}).status_code == 200

    # Counted once Langfuse answered: then everything has arrived.
    wait_for(lambda: items(gw) == {("generation", "sent"): 4, ("score", "sent"): 6})
    assert len(langfuse.generations()) == 4 and len(langfuse.scores) == 2 + 4
    # Through Langfuse's own API client: Basic auth with the keys, the OTLP ingestion version it asks for.
    auth = "Basic " + base64.b64encode(f"{PUBLIC_KEY}:{SECRET_KEY}".encode()).decode()
    assert {r["headers"]["authorization"] for r in langfuse.requests} == {auth}
    assert all(r["headers"]["x-langfuse-ingestion-version"] == "4" for r in langfuse.requests if "otel" in r["path"])

    by_trace = {g["traceId"]: g for g in langfuse.generations()}
    for t, group in (("t1", "g1"), ("t2", "g1"), ("t3", "g2"), ("t4", "g2")):
        stored = gw.trajectory(t)["calls"][0]
        g = by_trace[Langfuse.create_trace_id(seed=t)]  # the trace id anyone can derive from the trajectory id
        a = g["attributes"]
        assert a["session.id"] == group
        assert a["langfuse.trace.metadata"] == {"trajectory_id": t, "group_id": group, "policy": "agent", "version": "agent@0"}
        assert a["langfuse.observation.metadata"]["stream"] is stored["stream"] and a["langfuse.version"] == "agent@0"
        assert a["langfuse.observation.input"] == stored["request"]["messages"]
        assert a["langfuse.observation.model.parameters"] == {"temperature": 0.5}
        assert a["langfuse.observation.output"] == stored["response"]["choices"][0]["message"]
        assert a["langfuse.observation.model.name"] == stored["upstream_model"] == "tiny"
        if stored["usage"]:
            assert a["langfuse.observation.usage_details"] == {
                "input": 10,
                "output": stored["usage"]["completion_tokens"],
                "total": stored["usage"]["total_tokens"],
            }
        # The call's own times, not the export's.
        assert (int(g["startTimeUnixNano"]), int(g["endTimeUnixNano"])) == (ns(stored["started_at"]), ns(stored["finished_at"]))

    # Every reward is a score, in order (burnish keeps every reward too); each has its own id.
    assert len({s["id"] for s in langfuse.scores}) == 6
    t1 = [s for s in langfuse.scores if s["traceId"] == Langfuse.create_trace_id(seed="t1")]
    assert [(s["name"], s["value"], s["metadata"]) for s in t1] == [
        ("reward", 0.25, {"trajectory_id": "t1", "source": "user", "components": {"format": 1.0}}),
        ("reward", 0.5, {"trajectory_id": "t1", "source": "user", "components": {}}),
    ]
    shown = {(s["traceId"], s["name"]): s for s in langfuse.scores}
    assert (
        shown[(Langfuse.create_trace_id(seed="t3"), "ruler")] | {"value": 0.9, "comment": "t3 judged"} == shown[(Langfuse.create_trace_id(seed="t3"), "ruler")]
    )
    assert shown[(Langfuse.create_trace_id(seed="t4"), "reward")]["value"] == 0.1


def test_a_stalled_langfuse_costs_the_gateway_nothing(
    make_gateway, upstream_server: tuple[Upstream, str], langfuse: LangfuseStandIn, langfuse_server: tuple[LangfuseStandIn, str], tmp_path: Path
) -> None:
    """Langfuse holds every request for 30 s: calls answer as fast as with no export, and
    what could not be sent is counted: failed when a request timed out, dropped beyond the
    queue or when the gateway stopped with items unsent."""
    langfuse.mode = "stall"
    exporting = create_app(
        Settings.load(
            {},
            upstream=upstream_server[1],
            data_dir=str(tmp_path / "lf"),
            **langfuse_settings(langfuse_server[1], langfuse_timeout=3, langfuse_attempts=1, langfuse_queue_size=20),
        )
    )
    plain = make_gateway()

    def latencies(url: str, calls: range) -> list[float]:
        out = []
        with httpx.Client(base_url=url, timeout=30) as c:
            for i in calls:
                t0 = time.perf_counter()
                assert c.post(f"/t/{url[-5:]}-{i}/v1/chat/completions", json=CHAT).status_code == 200
                out.append(time.perf_counter() - t0)
        return out

    with ServerThread(exporting) as server:
        stalled = latencies(server.url, range(150))
        wait_for(lambda: langfuse.requests)  # a batch is stuck in Langfuse for the export's 3 s...
        stalled += latencies(server.url, range(150, 190))  # ...while these overflow the queue of 20
    calls = 190
    baseline = latencies(plain.url, range(calls))
    # A call that waited on the export would take the export's 3 s timeout.
    assert max(stalled) < 0.75, max(stalled)
    assert statistics.median(stalled) < 2 * statistics.median(baseline) + 0.005, (statistics.median(stalled), statistics.median(baseline))
    # Stopping the gateway gave the export 5 s, then counted what was left: nothing vanished.
    registry = exporting.state.services.metrics.registry
    outcome = {o: registry.get_sample_value("burnish_langfuse_items_total", {"kind": "generation", "outcome": o}) or 0 for o in ("sent", "failed", "dropped")}
    assert outcome["sent"] == 0 and outcome["dropped"] >= calls - 150 - 20 and outcome["failed"] > 0, outcome
    assert outcome["failed"] + outcome["dropped"] == calls


@pytest.mark.parametrize("mode", [503, 401, "unreachable"])
def test_a_refusing_or_absent_langfuse_is_counted(make_gateway, langfuse: LangfuseStandIn, langfuse_server: tuple[LangfuseStandIn, str], mode: Any) -> None:
    url = f"http://127.0.0.1:{free_port()}" if mode == "unreachable" else langfuse_server[1]
    if mode != "unreachable":
        langfuse.mode = mode
    gw = make_gateway(**langfuse_settings(url, langfuse_attempts=2, langfuse_timeout=1))
    slowest = 0.0
    with gw.client() as c:
        for i in range(5):
            t0 = time.perf_counter()
            assert c.post(f"/t/r{i}/v1/chat/completions", json=CHAT).status_code == 200
            assert c.post(f"/v1/trajectories/r{i}/reward", json={"reward": i / 4}).status_code == 200
            slowest = max(slowest, time.perf_counter() - t0)
    assert slowest < 0.75  # a call and a reward that waited on Langfuse would take its 1 s timeout
    wait_for(lambda: items(gw).get(("generation", "failed"), 0) + items(gw).get(("score", "failed"), 0) == 10)
    assert items(gw) == {("generation", "failed"): 5, ("score", "failed"): 5}
    if mode == 503:  # retried: each batch sent twice
        assert len(langfuse.requests) == 2 * len({(r["path"], r["body"]) for r in langfuse.requests})
    elif mode == 401:  # not worth a retry
        assert len(langfuse.requests) == len({(r["path"], r["body"]) for r in langfuse.requests})
    # Nothing stored was lost on the way.
    assert all(gw.trajectory(f"r{i}")["reward"] == i / 4 for i in range(5))


def test_no_keys_no_export(make_gateway, langfuse: LangfuseStandIn, langfuse_server: tuple[LangfuseStandIn, str]) -> None:
    gw = make_gateway(langfuse_base_url=langfuse_server[1], langfuse_public_key=PUBLIC_KEY)  # no secret key
    with gw.client() as c:
        assert c.post("/t/quiet/v1/chat/completions", json=CHAT).status_code == 200
    time.sleep(0.5)
    assert langfuse.requests == [] and items(gw) == {}


def test_langfuse_settings_take_langfuses_own_names() -> None:
    s = Settings.load({"LANGFUSE_PUBLIC_KEY": "pk", "LANGFUSE_SECRET_KEY": "sk", "LANGFUSE_HOST": "http://lf:3000"})
    assert (s.langfuse_public_key, s.langfuse_secret_key, s.langfuse_base_url) == ("pk", "sk", "http://lf:3000")
    s = Settings.load({"LANGFUSE_HOST": "http://old", "LANGFUSE_BASE_URL": "http://new", "BURNISH_LANGFUSE_BASE_URL": "http://mine"})
    assert s.langfuse_base_url == "http://mine"
    assert Settings.load({"LANGFUSE_HOST": "http://old", "LANGFUSE_BASE_URL": "http://new"}).langfuse_base_url == "http://new"
