"""Evaluation (held-out) trajectories: marked by X-Eval or the /eval prefixes, recorded and
rewarded like any other, never trained on; their score per policy version in the admin API,
the metrics history, /metrics, the SDK and Langfuse. On SQLite and PostgreSQL, against the
deterministic upstream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from langfuse import Langfuse
from sqlalchemy import select

from burnish import AsyncClient, Client
from burnish_server.core.learning.policies import Policy
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.platform.clock import utcnow
from burnish_server.store.database import Database, alembic_config
from burnish_server.store.evals import METRICS_NEWEST, for_metrics
from burnish_server.store.models import Group, Trajectory
from burnish_server.store.policies import create_policy, policy_status, update_policy
from burnish_server.store.training import DEFAULT_LEASE_S, claim_groups, count_ready, group_calls
from burnish_server.store.versions import record_step
from burnish_server.store.writer import Writer
from burnish_server.store.writes import CloseGroup, PostReward
from tests.conftest import ADMIN_TOKEN, Gateway, langfuse_settings, set_served_step, wait_for
from tests.gateway.test_metrics import scrape
from tests.langfuse_server import Langfuse as LangfuseStandIn
from tests.store.test_store import record
from tests.upstream import Upstream

HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": "tiny", "messages": HI}
MESSAGES = {"model": "tiny", "max_tokens": 5, "messages": HI}


def _eval(gw: Gateway, trajectory_id: str) -> bool:
    return gw.trajectory(trajectory_id)["eval"]


# ---- marking, through the gateway ------------------------------------------------------------


def test_the_header_and_each_prefix_mark_a_call_held_out(gateway: Gateway, upstream: Upstream) -> None:
    gateway.create_policy("agent", "tiny")
    with gateway.client() as c:
        for i, value in enumerate(("true", "1", "TRUE", "True")):
            assert c.post("/v1/chat/completions", json=CHAT, headers={"x-trajectory-id": f"h{i}", "x-eval": value}).status_code == 200
        for i, value in enumerate(("false", "0", "FALSE")):
            assert c.post("/v1/chat/completions", json=CHAT, headers={"x-trajectory-id": f"n{i}", "x-eval": value}).status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT, headers={"x-trajectory-id": "plain"}).status_code == 200
        # The prefixes, beside /v1, /t/{t}/v1 and /g/{g}/t/{t}/v1; the translated surfaces too.
        assert c.post("/eval/v1/chat/completions", json=CHAT, headers={"x-trajectory-id": "p0"}).status_code == 200
        assert c.post("/eval/t/p1/v1/completions", json={"model": "tiny", "prompt": "hi"}).status_code == 200
        assert c.post("/eval/g/eg/t/p2/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/eval/t/p3/v1/messages", json=MESSAGES).status_code == 200
        assert c.post("/eval/t/p4/v1/messages", json={**MESSAGES, "model": "agent"}).status_code == 200  # a policy: translated
        assert c.post("/eval/t/p5/v1/responses", json={"model": "agent", "input": "hi"}).status_code == 200
        assert c.get("/eval/v1/models").json()["data"][0]["id"] == "agent"
        anonymous = c.post("/eval/v1/chat/completions", json=CHAT)  # no key: a one-call trajectory, held out
        # The prefix wins over a header that says false: marking only ever adds.
        assert c.post("/eval/t/p6/v1/chat/completions", json=CHAT, headers={"x-eval": "false"}).status_code == 200
    assert all("x-eval" not in r["headers"] for r in upstream.requests)  # the gateway's own header stays here

    held_out = [f"h{i}" for i in range(4)] + [f"p{i}" for i in range(7)] + [anonymous.headers["x-trajectory-id"]]
    assert all(_eval(gateway, t) for t in held_out)
    assert not any(_eval(gateway, t) for t in ("n0", "n1", "n2", "plain"))
    assert gateway.trajectory("p4")["calls"][0]["policy"] == "agent"
    with gateway.client() as c:
        group = c.get("/v1/groups/eg").json()
        assert group["eval"] is True and group["members"][0]["eval"] is True
        # Rewarded like any other.
        for t in held_out[:3]:
            r = c.post(f"/v1/trajectories/{t}/reward", json={"reward": 0.5})
            assert r.status_code == 200 and r.json()["eval"] is True
        listed = {t["id"] for t in c.get("/v1/trajectories", params={"eval": "true", "limit": 1000}).json()["data"]}
        assert listed == set(held_out)
        others = {t["id"] for t in c.get("/v1/trajectories", params={"eval": "false"}).json()["data"]}
        assert others == {"n0", "n1", "n2", "plain"}
        exported = [json.loads(line) for line in c.get("/v1/trajectories/export").text.splitlines()]
        assert {t["id"]: t["eval"] for t in exported} == {t: True for t in held_out} | {t: False for t in ("n0", "n1", "n2", "plain")}
        only = [json.loads(line)["id"] for line in c.get("/v1/trajectories/export", params={"eval": True}).text.splitlines()]
        assert sorted(only) == sorted(held_out)
        assert c.get("/v1/trajectories", params={"eval": "maybe"}).status_code == 400


def test_a_mark_is_never_cleared(gateway: Gateway) -> None:
    with gateway.client() as c:
        assert c.post("/eval/g/sticky/t/s1/v1/chat/completions", json=CHAT).status_code == 200
        # Later calls without the mark, in one trajectory and into the same group.
        assert c.post("/g/sticky/t/s1/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT, headers={"x-trajectory-id": "s1", "x-eval": "false"}).status_code == 200
        assert c.post("/g/sticky/t/s2/v1/chat/completions", json=CHAT).status_code == 200
        # A marked call into a group that exists makes it held out.
        assert c.post("/g/late/t/l1/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/g/late/t/l2/v1/chat/completions", json=CHAT, headers={"x-eval": "1"}).status_code == 200
        groups = {g: c.get(f"/v1/groups/{g}").json() for g in ("sticky", "late")}
    assert _eval(gateway, "s1") and len(gateway.trajectory("s1")["calls"]) == 3
    assert not _eval(gateway, "s2") and not _eval(gateway, "l1") and _eval(gateway, "l2")
    assert groups["sticky"]["eval"] is True and groups["late"]["eval"] is True


def test_bad_x_eval_values_are_refused_in_the_surfaces_format(gateway: Gateway, upstream: Upstream) -> None:
    with gateway.client() as c:
        for value in ("yes", "", "2", "truee", "on"):
            r = c.post("/v1/chat/completions", json=CHAT, headers={"x-trajectory-id": "bad", "x-eval": value})
            assert r.status_code == 400, r.text
            assert r.json()["error"] == {
                "message": "X-Eval must be true, false, 1 or 0",
                "type": "invalid_request_error",
                "param": "X-Eval",
                "code": "invalid_eval",
            }
            r = c.post("/eval/t/bad/v1/messages", json=MESSAGES, headers={"x-eval": value})
            assert r.status_code == 400, r.text
            assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "X-Eval must be true, false, 1 or 0"}}
        assert c.get("/v1/trajectories/bad").status_code == 404  # nothing recorded
    assert upstream.requests == []  # nothing forwarded


# ---- never trained on, in the store ----------------------------------------------------------


async def _group(writer: Writer, name: str, rewards: list[float], held_out: list[bool], *, close: bool = True) -> None:
    for i, marked in enumerate(held_out):
        await writer.write(record(f"{name}-{i}", group=name, policy="agent", policy_step=0, eval=marked))
    for i, r in enumerate(rewards):
        await writer.write(PostReward(f"{name}-{i}", r))
    if close:
        await writer.write(CloseGroup(name))


async def test_held_out_groups_are_never_claimed_nor_waiting(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny"))
    await _group(writer, "train", [0.0, 1.0], [False, False])
    await _group(writer, "held", [0.0, 1.0], [True, True])  # closed, spread: would be ready
    await _group(writer, "mixed", [0.0, 1.0, 0.5], [False, True, False])  # one member marked
    await _group(writer, "open-eval", [0.0], [True, True], close=False)
    # A trajectory marked before it joins a group: the group's row is unmarked, its member is not.
    await writer.write(record("joined-0", policy="agent", policy_step=0, eval=True))
    await writer.write(record("joined-0", group="joined", policy="agent", policy_step=0))
    await writer.write(record("joined-1", group="joined", policy="agent", policy_step=0))
    for i, r in enumerate((0.0, 1.0)):
        await writer.write(PostReward(f"joined-{i}", r))
    await writer.write(CloseGroup("joined"))

    async with db.reader.connect() as conn:
        marks = dict((await conn.execute(select(Group.id, Group.eval))).all())
    assert marks == {"train": False, "held": True, "mixed": True, "open-eval": True, "joined": False}
    assert await db.transaction(count_ready, "agent") == 1
    status = await db.read(policy_status, "agent")
    # The status counts "joined" held out too: a held-out member keeps it from training (its lack).
    assert (status.groups_ready, status.groups_open, status.groups_closed, status.groups_eval) == (1, 0, 1, 4)
    assert await db.transaction(claim_groups, "agent", "w", 5, DEFAULT_LEASE_S, 1) == ["train"]
    assert await db.transaction(claim_groups, "agent", "w", 1) == []
    # A mark that arrives after a claim still keeps its trajectory out of the step (a call with
    # no group key: the trajectory is marked, its group's row is not)...
    await writer.write(record("train-1", policy="agent", policy_step=0, eval=True))
    assert [r.trajectory_id for r in await db.read(group_calls, ["train"])] == ["train-0"]
    # The status counts the claimed group held out now, and closed nowhere (never below zero).
    status = await db.read(policy_status, "agent")
    assert (status.groups_closed, status.groups_eval) == (0, 5)
    # ...and a marked call into the group keeps all of it out.
    await writer.write(record("train-0", group="train", policy="agent", policy_step=0, eval=True))
    assert await db.read(group_calls, ["train"]) == []
    # The group view counts a member's mark.
    from burnish_server.store.reads import get_group

    view = await db.read(get_group, "joined")
    assert view is not None and view.eval is True


async def test_the_mark_sticks_in_one_batch_and_across_batches(store) -> None:
    """Both write paths (SQLite's prepared statements, PostgreSQL's upserts), in one commit and in two."""
    db, writer = store
    now = utcnow()
    await asyncio.gather(
        writer.write(record("b1", group="bg", eval=True, started_at=now, finished_at=now)),
        writer.write(record("b1", group="bg", started_at=now, finished_at=now)),
        writer.write(record("b2", group="bg", started_at=now, finished_at=now)),
    )
    await writer.write(record("b1", group="bg"))
    await writer.write(record("b2", group="bg"))
    async with db.reader.connect() as conn:
        trajectories = dict((await conn.execute(select(Trajectory.id, Trajectory.eval))).all())
        groups = dict((await conn.execute(select(Group.id, Group.eval))).all())
    assert trajectories == {"b1": True, "b2": False} and groups == {"bg": True}


# ---- the score per version -------------------------------------------------------------------


def _call(c: httpx.Client, trajectory: str, model: str, *, marked: bool = True, **headers: str) -> None:
    prefix = "/eval" if marked else ""
    r = c.post(f"{prefix}/t/{trajectory}/v1/chat/completions", json={**CHAT, "model": model}, headers=headers)
    assert r.status_code in (200, 500), r.text


def _step(gw: Gateway, step: int, parent: int) -> None:
    """A trained step as the trainer records it (no groups: only its number matters here)."""

    async def write() -> None:
        db = Database(gw.settings.resolved_database_url)
        try:
            await db.transaction(record_step, "agent", step, parent, [], "w", StepMetrics(loss=0.25, reward_mean=0.5), f"/ckpt/{step}")
        finally:
            await db.dispose()

    asyncio.run(write())


def test_held_out_scores_per_version_are_exact(make_gateway, upstream: Upstream, database_url: str) -> None:
    gw = make_gateway(database_url)
    gw.create_policy("agent", "tiny")
    _step(gw, 1, 0)
    _step(gw, 2, 1)
    set_served_step(gw, 1)
    rewards: dict[str, float] = {}
    with gw.client() as c:
        # Pinned versions: the base, and step 1.
        for i, reward in enumerate((0.25, 0.75)):
            _call(c, f"base-{i}", "agent@0")
            rewards[f"base-{i}"] = reward
        for i, reward in enumerate((1.0, 0.5, 0.75)):
            _call(c, f"one-{i}", "agent@1")
            rewards[f"one-{i}"] = reward
        _call(c, "served", "agent")  # unpinned: the served version, step 1
        rewards["served"] = 0.0
        # Calls that span versions count for the latest ok one; a failed call at step 2 does not.
        _call(c, "span", "agent@0")
        _call(c, "span", "agent@1")
        _call(c, "span", "agent@2", **{"x-fault": "status:500"})
        rewards["span"] = 0.5
        _call(c, "unrewarded", "agent@1")  # held out but never rewarded: not counted
        _call(c, "trained", "agent@1", marked=False)  # rewarded but not held out: not counted
        rewards["trained"] = -1.0
        _call(c, "other-model", "tiny")  # held out, but no call to the policy
        rewards["other-model"] = 1.0
        for t, reward in rewards.items():
            assert c.post(f"/v1/trajectories/{t}/reward", json={"reward": reward}).status_code == 200
    assert gw.trajectory("span")["calls"][-1]["status"] == "upstream_error"

    base = {"object": "policy.eval", "step": 0, "version": "agent@0", "serving": False, "trajectories": 2, "score": 0.5}
    one = {"object": "policy.eval", "step": 1, "version": "agent@1", "serving": True, "trajectories": 5, "score": (1.0 + 0.5 + 0.75 + 0.0 + 0.5) / 5}
    two = {"object": "policy.eval", "step": 2, "version": "agent@2", "serving": False, "trajectories": 0, "score": None}
    with gw.admin() as admin:
        assert admin.get("/admin/policies/agent/evals").json() == {"object": "list", "data": [base, one, two]}
        status = admin.get("/admin/policies/agent").json()
        assert status["eval"] == [base, one]  # only the versions with a score
        history = admin.get("/admin/policies/agent/metrics").json()["data"]
        assert [(h["step"], h["eval_score"], h["eval_trajectories"], h["loss"]) for h in history] == [(1, one["score"], 5, 0.25), (2, None, None, 0.25)]
        assert admin.get("/admin/policies/ghost/evals").json()["error"]["code"] == "policy_not_found"
        assert admin.get("/admin/policies/bad%20name/evals").status_code == 400

    m = scrape(gw)
    assert m[("burnish_eval_score", (("policy", "agent"), ("step", "0")))] == 0.5
    assert m[("burnish_eval_trajectories", (("policy", "agent"), ("step", "0")))] == 2
    assert m[("burnish_eval_score", (("policy", "agent"), ("step", "1")))] == one["score"]
    assert m[("burnish_eval_trajectories", (("policy", "agent"), ("step", "1")))] == 5
    assert ("burnish_eval_score", (("policy", "agent"), ("step", "2"))) not in m  # no score, no series

    # The SDK's one-liner: the base against the served version, or any two.
    client = Client(gw.url, admin_token=ADMIN_TOKEN)
    assert client.eval_scores("agent")["data"] == [base, one, two]
    assert client.compare("agent") == {"policy": "agent", "base": base, "current": one, "delta": one["score"] - 0.5}
    assert client.compare("agent", step=2)["delta"] is None
    far = client.compare("agent", base=1, step=9)
    assert far["base"] == one and far["current"]["score"] is None and far["current"]["version"] == "agent@9"


async def test_metrics_keep_the_base_the_served_and_the_newest_versions(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny"))
    await db.transaction(lambda conn: update_policy(conn, "agent", step=2, head=2))
    for step in range(8):
        await writer.write(record(f"v{step}", policy="agent", policy_step=step, eval=True))
        await writer.write(PostReward(f"v{step}", step / 8))
    kept = await db.read(for_metrics)
    newest = list(range(8))[-METRICS_NEWEST:]
    assert sorted(step for _, step in kept) == sorted({0, 2, *newest})
    assert kept[("agent", 2)] == (1, 0.25)


# ---- the SDK and Langfuse -----------------------------------------------------------------


def test_the_sdk_marks_trajectories_and_groups(gateway: Gateway, upstream: Upstream) -> None:
    client = Client(gateway.url)
    held = client.trajectory(eval=True)
    assert held.headers["X-Eval"] == "true" and held.base_url == f"{gateway.url}/eval/t/{held.id}/v1"
    held.openai().chat.completions.create(model="tiny", messages=HI)
    assert "x-eval" not in upstream.requests[-1]["headers"]
    assert held.reward(0.5)["eval"] is True
    plain = client.trajectory()
    assert "X-Eval" not in plain.headers and plain.base_url == f"{gateway.url}/t/{plain.id}/v1"
    plain.openai().chat.completions.create(model="tiny", messages=HI)
    assert client.get_trajectory(plain.id)["eval"] is False
    with client.group(size=2, eval=True) as group:
        first, second = group.trajectory(), group.trajectory()
        assert second.base_url == f"{gateway.url}/eval/g/{group.id}/t/{second.id}/v1"
        first.openai().chat.completions.create(model="tiny", messages=HI)
        assert httpx.post(second.base_url + "/chat/completions", json=CHAT).status_code == 200  # the prefix alone
        first.reward(0.0)
        second.reward(1.0)
    got = client.get_group(group.id)
    assert got["eval"] is True and [m["eval"] for m in got["members"]] == [True, True] and got["state"] == "closed"

    async def main() -> dict[str, Any]:
        async with AsyncClient(gateway.url, admin_token=ADMIN_TOKEN) as aclient:
            await aclient.create_policy("agent", "tiny")
            async with aclient.group(eval=True) as agroup:
                t = agroup.trajectory()
                await t.async_openai().chat.completions.create(model="agent", messages=HI)
                await t.reward(0.75)
            lone = aclient.trajectory(eval=True)
            await lone.async_openai().chat.completions.create(model="agent@0", messages=HI)
            await lone.reward(0.25)
            assert (await aclient.get_trajectory(lone.id))["eval"] is True
            assert (await aclient.eval_scores("agent"))["data"][0]["trajectories"] == 2
            return await aclient.compare("agent")

    compared = asyncio.run(main())
    assert compared["base"]["score"] == 0.5 and compared["current"] == compared["base"] and compared["delta"] == 0.0


def test_held_out_traces_are_tagged_in_langfuse(make_gateway, langfuse: LangfuseStandIn, langfuse_server: tuple[LangfuseStandIn, str]) -> None:
    gw = make_gateway(**langfuse_settings(langfuse_server[1]))
    with gw.client() as c:
        assert c.post("/eval/g/lg/t/held/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/t/trained/v1/chat/completions", json=CHAT).status_code == 200
    wait_for(lambda: len(langfuse.generations()) == 2)
    by_trace = {g["traceId"]: g["attributes"] for g in langfuse.generations()}
    held, trained = by_trace[Langfuse.create_trace_id(seed="held")], by_trace[Langfuse.create_trace_id(seed="trained")]
    assert held["langfuse.trace.tags"] == ["eval"]
    assert held["langfuse.trace.metadata"] == {"trajectory_id": "held", "group_id": "lg", "eval": True}
    assert held["langfuse.observation.metadata"]["eval"] is True
    assert "langfuse.trace.tags" not in trained and "eval" not in trained["langfuse.trace.metadata"]
    assert "eval" not in trained["langfuse.observation.metadata"]


# ---- the migration -------------------------------------------------------------------------


async def test_the_migration_upgrades_a_database_with_data(database_url: str) -> None:
    db = Database(database_url)
    try:
        await db.migrate("0006")

        def insert_old(conn: Any) -> None:
            # Rows as a gateway before held-out trajectories wrote them (0006's columns only).
            conn.exec_driver_sql("INSERT INTO groups (id, created_at) VALUES ('old-g', CURRENT_TIMESTAMP)")
            conn.exec_driver_sql(
                "INSERT INTO trajectories (id, group_id, created_at, updated_at) VALUES ('old-t', 'old-g', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )

        await db.transaction(insert_old)
        await db.migrate()
        async with db.reader.connect() as conn:
            assert (await conn.execute(select(Trajectory.eval).where(Trajectory.id == "old-t"))).scalar_one() is False
            assert (await conn.execute(select(Group.eval).where(Group.id == "old-g"))).scalar_one() is False
        writer = Writer(db)
        writer.start()
        try:
            await writer.write(record("old-t", group="old-g", eval=True))
        finally:
            await writer.close()
        async with db.reader.connect() as conn:
            assert (await conn.execute(select(Trajectory.eval).where(Trajectory.id == "old-t"))).scalar_one() is True
            assert (await conn.execute(select(Group.eval).where(Group.id == "old-g"))).scalar_one() is True
        # And back down, with the data in place, and up again.
        await db.transaction(_downgrade, "0006")
        await db.migrate()
        async with db.reader.connect() as conn:
            assert (await conn.execute(select(Trajectory.eval).where(Trajectory.id == "old-t"))).scalar_one() is False
    finally:
        await db.dispose()


def _downgrade(conn: Any, revision: str) -> None:
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.downgrade(cfg, revision)
