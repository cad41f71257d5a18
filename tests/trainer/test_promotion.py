"""Promotion: candidates on trial, the test that decides them, and the automatic rollback.

The test itself (core/learning/promotion.py) is checked against Student's t table and, by simulation,
against its stated error rates. Then the whole trial runs on the tiny model through vLLM, the
gateway and the trainer (in this process, one pass at a time, as tests/trainer/test_admin_training.py
does), on SQLite and PostgreSQL:
- a step trained on inverted rewards (a reward bug) writes worse answers; the agent's true
  rewards reject it, and it never serves more than its share; a step trained on the true
  rewards is promoted;
- the mechanics, with rewards the agent posts per version: a candidate serves its share of
  trajectories, sticky; a rejected one serves no one; a promoted one serves everyone; a
  regression of the served version is rolled back by itself; under ``eval`` the SDK's held-out
  run decides; under ``manual``, an admin.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from langfuse import Langfuse as LangfuseClient

from burnish import Client
from burnish_server.core.learning.policies import Policy, PromotionSettings, in_canary
from burnish_server.core.learning.promotion import Sample, compare, regressed, t_quantile
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.policies.routing import REFRESH_EVERY_S
from burnish_server.serving.process import VLLMServer
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
from tests.conftest import ADMIN_TOKEN, Gateway, langfuse_settings, wait_for
from tests.judge import first_token
from tests.langfuse_server import Langfuse as LangfuseStandIn
from tests.trainer.test_trainer_recovery import TINY, ready_group

# ---- the test ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [(0.95, 4, 2.132), (0.95, 10, 1.812), (0.95, 30, 1.697), (0.975, 5, 2.571), (0.99, 4, 3.747), (0.99, 20, 2.528), (0.9, 8, 1.397)],
)
def test_the_t_quantile_matches_the_table(p: float, df: float, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, rel=1.5e-3)


def test_nothing_is_decided_before_the_minimum_on_each_side() -> None:
    worse = Sample.of([0.0] * 50)
    result = compare(Sample.of([1.0] * 50), Sample.of([0.0] * 9), margin=0.1, confidence=0.95, min_n=10)
    assert result.decision is None and "waiting for 10" in result.reason
    assert compare(Sample.of([1.0] * 50), worse, margin=0.1, confidence=0.95, min_n=10).decision == "reject"


def test_promote_reject_and_undecided() -> None:
    rng = random.Random(0)
    served = Sample.of([rng.gauss(0.5, 0.2) for _ in range(200)])
    alike = compare(served, Sample.of([rng.gauss(0.5, 0.2) for _ in range(200)]), margin=0.1, confidence=0.95, min_n=30)
    assert alike.decision == "promote" and alike.lower is not None and alike.lower > -0.1
    worse = compare(served, Sample.of([rng.gauss(0.2, 0.2) for _ in range(200)]), margin=0.1, confidence=0.95, min_n=30)
    assert worse.decision == "reject" and worse.upper is not None and worse.upper < -0.1
    # Worse by about the margin, on little evidence: the interval straddles it, no decision...
    close = compare(served, Sample.of([rng.gauss(0.4, 0.2) for _ in range(30)]), margin=0.1, confidence=0.95, min_n=30)
    assert close.decision is None and "undecided" in close.reason
    # ...until the cap on evidence, where a tie is not worth a new version.
    assert compare(served, Sample.of([0.4, 0.4, 0.0, 0.8] * 50), margin=0.1, confidence=0.95, min_n=30, max_n=200).decision == "reject"


def test_the_error_rates_are_the_stated_ones() -> None:
    """A candidate worse than the margin is promoted, and one not worse is rejected, at most
    1 - confidence of the time (simulated: 2,000 trials each, 30 trajectories a side)."""
    rng = random.Random(1)

    def trials(shift: float) -> dict[str | None, int]:
        counts: dict[str | None, int] = {"promote": 0, "reject": 0, None: 0}
        for _ in range(2000):
            served = Sample.of([rng.gauss(0.5, 0.3) for _ in range(30)])
            candidate = Sample.of([rng.gauss(0.5 + shift, 0.3) for _ in range(30)])
            counts[compare(served, candidate, margin=0.1, confidence=0.95, min_n=30).decision] += 1
        return counts

    assert trials(-0.1)["promote"] / 2000 <= 0.05 + 0.015  # worse by exactly the margin: the boundary
    assert trials(-0.1)["reject"] / 2000 <= 0.05 + 0.015
    assert trials(-0.3)["promote"] == 0
    assert trials(0.0)["reject"] / 2000 <= 0.01


def test_a_regression_is_only_a_rejection() -> None:
    before = Sample.of([0.8, 0.9, 1.0] * 10)
    assert regressed(before, Sample.of([0.1, 0.2, 0.3] * 10), margin=0.1, confidence=0.95, min_n=10).decision == "reject"
    assert regressed(before, Sample.of([0.8, 0.9, 1.0] * 10), margin=0.1, confidence=0.95, min_n=10).decision is None


def test_the_canary_is_its_share_and_sticky() -> None:
    policy = Policy(name="agent", base_model="tiny", promotion=PromotionSettings(rule="canary", canary_share=0.2), step=3, head=4, candidate=4)
    ids = [f"t-{i}" for i in range(20_000)]
    share = sum(in_canary(policy, t) for t in ids) / len(ids)
    assert 0.19 < share < 0.21
    assert [in_canary(policy, t) for t in ids[:100]] == [in_canary(policy, t) for t in ids[:100]]
    # Another candidate is tried on other trajectories.
    other = Policy(name="agent", base_model="tiny", promotion=PromotionSettings(rule="canary", canary_share=0.2), step=3, head=5, candidate=5)
    assert 0.03 < sum(in_canary(policy, t) and in_canary(other, t) for t in ids) / len(ids) < 0.05  # as chance has it: 0.2 x 0.2
    # Only under canary, and only with a candidate.
    replace = msgspec.structs.replace
    assert not any(in_canary(replace(policy, promotion=PromotionSettings(rule="eval", canary_share=0.2)), t) for t in ids[:1000])
    assert not any(in_canary(replace(policy, candidate=None), t) for t in ids[:1000])


# ---- the trial, through vLLM, the gateway and the trainer ----------------------------------------

# The trial's traffic is one-call trajectories, each rewarded: lone attempts, which would train
# steps between the decisions these tests read (tests/gateway/test_lone.py has them); groups alone train here.
TRIAL = {**TINY, "train": {**TINY["train"], "lone_baseline": None}}
# rollback_window at min_trajectories: the smallest window allowed (core/learning/policies.py: settings_conflicts).
RULE = {"canary_share": 0.5, "min_trajectories": 8, "margin": 0.1, "rollback_window": 8}
CALL = {"model": "agent", "messages": [{"role": "user", "content": "digits"}], "max_tokens": 4}


def version_of(gw: Gateway, trajectory: str, model: str = "agent") -> str:
    with gw.client(timeout=120) as c:
        r = c.post(f"/t/{trajectory}/v1/chat/completions", json={**CALL, "model": model})
    assert r.status_code == 200, r.text
    return r.headers["x-policy-version"]


def reward(gw: Gateway, trajectory: str, value: float) -> None:
    with gw.client() as c:
        assert c.post(f"/v1/trajectories/{trajectory}/reward", json={"reward": value}).status_code == 200


def traffic(gw: Gateway, prefix: str, n: int, score: dict[str, float]) -> list[str]:
    """``n`` one-call trajectories, each rewarded by the version that answered it (``score``,
    with a little spread so that the test has a variance to read); returns the versions."""
    versions = []
    for i in range(n):
        trajectory = f"{prefix}-{i}"
        version = version_of(gw, trajectory)
        reward(gw, trajectory, score[version] + 0.05 * (i % 3))
        versions.append(version)
    return versions


async def follow() -> None:
    await asyncio.sleep(REFRESH_EVERY_S * 2 + 0.1)  # the gateway re-reads the policies


@pytest.fixture
def trial(make_gateway, vllm: VLLMServer, tiny_model: Path, database_url: str, langfuse: LangfuseStandIn, langfuse_server):
    gw = make_gateway(database_url=database_url, upstream=vllm.url, upstream_timeout=120)
    # The trainer also sends each decision to Langfuse, as an event in the trace of the step it decides.
    lf = langfuse_settings(langfuse_server[1])
    settings = Settings.load({}, data_dir=gw.settings.data_dir, database_url=database_url, upstream=vllm.url, trainer_review_every=0, **lf)
    worker = TrainerWorker(settings, WorkerSettings(worker_id="promotion-test"))
    yield gw, worker, tiny_model, langfuse
    asyncio.run(worker.close())


async def step_to_candidate(gw: Gateway, worker: TrainerWorker, prefix: str) -> dict[str, Any]:
    await ready_group(gw, f"{prefix}-a")
    await ready_group(gw, f"{prefix}-b")
    assert await worker.run_once()
    await follow()
    return gw.policy()


async def test_a_worse_candidate_is_rejected_a_good_one_promoted_and_a_regression_rolled_back(trial) -> None:
    gw, worker, tiny_model, langfuse = trial
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), promotion={"rule": "canary", **RULE}, **TRIAL)
    await worker.recover()
    admin = gw.admin()
    # One less and the regression test could never decide: refused.
    assert admin.patch("/admin/policies/agent", json={"promotion": {"rollback_window": 7}}).json()["error"]["code"] == "conflicting_settings"

    # A step trains; it is a candidate, not served.
    status = await step_to_candidate(gw, worker, "s1")
    assert (status["step"], status["head"], status["candidate"]["step"], status["candidate"]["share"]) == (0, 1, 1, 0.5)
    assert status["candidate"]["test"]["decision"] is None and "waiting for 8" in status["candidate"]["test"]["reason"]

    # No step trains while a candidate is on trial, however many groups are ready.
    await ready_group(gw, "waiting-a")
    await ready_group(gw, "waiting-b")
    assert not await worker.run_once()
    assert gw.policy()["groups_ready"] == 2

    # Half of the trajectories go to it, each trajectory always to the same version.
    versions = traffic(gw, "bad", 40, {"agent@0": 0.8, "agent@1": 0.2})
    assert 8 <= versions.count("agent@1") <= 32, versions
    assert [version_of(gw, f"bad-{i}") for i in range(10)] == versions[:10]
    # Pinned calls go where they are pinned, whatever the canary.
    assert version_of(gw, "pinned", "agent@1") == "agent@1" and version_of(gw, "pinned-0", "agent@0") == "agent@0"

    # The agent's rewards for it are worse by more than the margin: rejected. In the same pass
    # the groups that waited train the next step, from the served version (train_from
    # "served"), and it goes on trial in turn.
    assert await worker.run_once()
    status = gw.policy()
    assert (status["step"], status["head"], status["candidate"]["step"], status["last_step"]["parent"]) == (0, 2, 2, 0)
    step = admin.get("/admin/policies/agent/checkpoints").json()["data"][0]
    assert step["decision"] == "rejected" and step["decisions"][-1]["by"] == "test"
    test = step["decisions"][-1]["test"]
    assert test["decision"] == "reject" and test["upper"] < -0.1 and test["candidate"]["n"] >= 8 and test["served"]["n"] >= 8
    await follow()
    assert "agent@1" not in {version_of(gw, f"after-{i}") for i in range(12)}  # it serves no one now

    traffic(gw, "good", 40, {"agent@0": 0.5, "agent@2": 0.5})
    assert not await worker.run_once()
    status = gw.policy()
    assert (status["step"], status["head"], status["candidate"]) == (2, 2, None)
    history = admin.get("/admin/policies/agent/metrics").json()["data"]
    assert [(h["step"], h["decision"]) for h in history] == [(1, "rejected"), (2, "promoted")]
    assert "not worse" in history[1]["decisions"][-1]["reason"]
    await follow()
    assert {version_of(gw, f"promoted-{i}") for i in range(8)} == {"agent@2"}

    # The served version's rewards fall below those of the version it replaced: rolled back.
    traffic(gw, "regressed", 10, {"agent@2": 0.0})
    await worker.run_once()  # decides the rollback
    await worker.run_once()  # serves the base model again
    status = gw.policy()
    assert (status["step"], status["head"]) == (0, 0)
    history = admin.get("/admin/policies/agent/metrics").json()["data"]
    assert history[1]["decision"] == "rolled_back" and "regressed against step 0" in history[1]["decisions"][-1]["reason"]
    assert [d["decision"] for d in history[1]["decisions"]] == ["promoted", "rolled_back"]  # the promotion's figures kept
    # /metrics counts the decisions.
    text = httpx.get(gw.url + "/metrics").text
    for decision in ("promoted", "rejected", "rolled_back"):
        assert f'burnish_policy_decisions{{decision="{decision}",policy="agent"}} 1.0' in text, decision
    assert 'burnish_policy_candidate_step{policy="agent"} -1.0' in text

    # In Langfuse: each decision an event in its step's trace, with who decided, why and the figures.
    def decisions() -> dict[tuple[int, str], dict[str, Any]]:
        return {(meta["step"], meta["decision"]): e for e in langfuse.events() if "decision" in (meta := e["attributes"]["langfuse.observation.metadata"])}

    deadline = time.monotonic() + 15
    while len(decisions()) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    decided = decisions()
    assert set(decided) == {(1, "rejected"), (2, "promoted"), (2, "rolled_back")}
    rejected = decided[(1, "rejected")]
    assert rejected["traceId"] == LangfuseClient.create_trace_id(seed="train:agent@1")
    assert rejected["attributes"]["langfuse.observation.output"]["test"]["decision"] == "reject"

    # An admin rolls back to the rejected step: it serves outright, promoted by the admin; and
    # as its rewards were worse than the base's, the watch rolls it back in the same pass.
    assert admin.post("/admin/policies/agent/rollback", json={"step": 1}).status_code == 202
    await worker.run_once()
    assert (gw.policy()["step"], gw.policy()["head"], gw.policy()["candidate"]) == (1, 0, None)
    first = next(s for s in admin.get("/admin/policies/agent/checkpoints").json()["data"] if s["step"] == 1)
    assert [(d["decision"], d["by"]) for d in first["decisions"]] == [("rejected", "test"), ("promoted", "admin"), ("rolled_back", "test")]


# The task: answer in words, no digits; the reward is the share of characters that are not digits.
# The tiny model writes ~7% digits (top_k 50, 16 tokens). One step at lr 0.1 on 4 groups of 8
# trained on the inverted reward (a bug that pays for digits) takes that to ~13% through vLLM
# (rewards 0.93 against 0.87); one on the true reward leaves it as it was. A margin of 0.03
# tells them apart within a few dozen trajectories on each side.
NO_DIGITS = [{"role": "user", "content": "Write some words."}]
LEARNS = {"lora": {"rank": 8, "alpha": 16}, "train": {"learning_rate": 0.1, "groups_per_step": 4, "lone_baseline": None}}  # as TRIAL
STRICT = {"rule": "canary", "canary_share": 0.5, "min_trajectories": 16, "margin": 0.03}


def no_digits(text: str) -> float:
    return 1 - sum(ch.isdigit() for ch in text) / max(len(text), 1)


async def answer(client: httpx.AsyncClient, path: str, seed: int, model: str = "agent", **headers: str) -> tuple[str, str]:
    body = {"model": model, "messages": NO_DIGITS, "max_tokens": 16, "temperature": 1.0, "top_k": 50, "seed": seed}
    r = await client.post(f"{path}/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"] or "", r.headers["x-policy-version"]


async def task_groups(gw: Gateway, prefix: str, count: int, *, inverted: bool) -> None:
    """``count`` groups of 8 answers to the task, rewarded truly or inverted (the reward bug)."""
    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        for g in range(count):
            for i in range(8):
                trajectory = f"{prefix}-{g}-{i}"
                text, _ = await answer(client, f"/g/{prefix}-{g}/t/{trajectory}", seed=100 * g + i, **{"x-group-size": "8"})
                value = 1 - no_digits(text) if inverted else no_digits(text)
                assert (await client.post(f"/v1/trajectories/{trajectory}/reward", json={"reward": value})).status_code == 200


async def until_decided(gw: Gateway, worker: TrainerWorker, prefix: str, candidate: str) -> tuple[dict[str, Any], list[str]]:
    """The agent at work, rewarded truly, 16 trajectories at a time, until the trial is decided;
    returns the policy's status then and the version each trajectory was served by."""
    versions: list[str] = []
    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        while gw.policy()["candidate"] is not None:
            assert len(versions) < 640, (versions.count(candidate), gw.policy()["candidate"]["test"])
            for _ in range(16):
                trajectory = f"{prefix}-{len(versions)}"
                text, version = await answer(client, f"/t/{trajectory}", seed=len(versions))
                assert (await client.post(f"/v1/trajectories/{trajectory}/reward", json={"reward": no_digits(text)})).status_code == 200
                versions.append(version)
            await worker.run_once()
    return gw.policy(), versions


def history_reason(admin: httpx.Client) -> str:
    return admin.get("/admin/policies/agent/metrics").json()["data"][-1]["decisions"][-1]["reason"]


# The learning is what this test shows, and it is the store's alike: on SQLite alone (the other
# trials run on both stores, the same queries).
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_step_trained_on_inverted_rewards_is_rejected_and_one_on_true_rewards_promoted(trial) -> None:
    gw, worker, tiny_model, _ = trial
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), promotion=STRICT, **LEARNS)
    await worker.recover()
    admin = gw.admin()

    # A reward bug: step 1 trains on groups scored for their digits. It goes on trial.
    await task_groups(gw, "bug", 4, inverted=True)
    assert await worker.run_once()
    await follow()
    assert gw.policy()["candidate"]["step"] == 1
    status, versions = await until_decided(gw, worker, "after-bug", "agent@1")
    (step,) = [s for s in admin.get("/admin/policies/agent/checkpoints").json()["data"] if s["step"] == 1]
    test = step["decisions"][-1]["test"]
    assert step["decision"] == "rejected", test
    assert status["step"] == 0 and test["upper"] < -0.03, test
    # It served its share of the trajectories while on trial, never more, and no one after.
    assert 0.3 < versions.count("agent@1") / len(versions) < 0.7, versions
    print(f"rejected after {len(versions)} trajectories: {test['reason']}")
    await follow()
    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        assert {(await answer(client, f"/t/later-{i}", seed=i))[1] for i in range(8)} == {"agent@0"}

    # The bug fixed: step 2 trains from the served version on the true rewards, and is promoted.
    await task_groups(gw, "fixed", 4, inverted=False)
    assert await worker.run_once()
    await follow()
    assert (gw.policy()["candidate"]["step"], gw.policy()["last_step"]["parent"]) == (2, 0)
    status, versions = await until_decided(gw, worker, "after-fix", "agent@2")
    print(f"promoted after {len(versions)} trajectories: {history_reason(admin)}")
    history = admin.get("/admin/policies/agent/metrics").json()["data"]
    assert [(h["step"], h["decision"]) for h in history] == [(1, "rejected"), (2, "promoted")], history[-1]["decisions"]
    assert status["step"] == 2


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_next_message_judge_that_rewards_wrong_answers_is_caught_by_the_canary(make_gateway, vllm, tiny_model, judge_server, database_url) -> None:
    """Lone traffic judged by what followed it, by a judge that rewards what the task does not
    want (digits): the step it teaches goes on trial, and the verdicts people post, which the
    trial reads (never the judge's rewards), reject it."""
    judge, judge_url = judge_server
    judge.requests = []
    judge.reads = lambda request: first_token({"yes": -0.05, "no": -3.0} if "digits" in request["messages"][-1]["content"] else {"yes": -3.0, "no": -0.05})
    gw = make_gateway(database_url=database_url, upstream=vllm.url, upstream_timeout=120, judge_base_url=judge_url, judge_model="judge-1")
    train = {**LEARNS["train"], "lone_baseline": "step", "groups_per_step": 2, "lone_per_group": 8}
    # No margin: one step of 16 judged attempts moves the tiny model less than a step of inverted groups does.
    promotion = {**STRICT, "margin": 0.0}
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), promotion=promotion, lora=LEARNS["lora"], train=train, ruler={"next_message": True})
    settings = Settings.load({}, data_dir=gw.settings.data_dir, database_url=database_url, upstream=vllm.url, trainer_review_every=0)
    worker = TrainerWorker(settings, WorkerSettings(worker_id="bad-judge"))
    try:
        await worker.recover()
        async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
            for i in range(20):  # each answer once, followed by the user's next message: the judge's alone to score
                text, _ = await answer(client, "", seed=i)
                # The user likes digits, the task's reward does not: a judge of the user's mood rewards the wrong answers.
                said = "Nice digits." if any(ch.isdigit() for ch in text) else "Hm."
                body = {"model": "agent", "messages": [*NO_DIGITS, {"role": "assistant", "content": text}, {"role": "user", "content": said}], "max_tokens": 4}
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        wait_for(lambda: gw.policy()["lone"]["judged"] >= 16, 60, "the judge did not score the answers")
        assert await worker.run_once()
        await follow()
        assert gw.policy()["candidate"]["step"] == 1
        # The verdicts that follow are the trial's evidence; they train nothing more here, so the trial read is step 1's.
        assert gw.admin().patch("/admin/policies/agent", json={"train": {"lone_baseline": None}}).status_code == 200
        await follow()
        status, versions = await until_decided(gw, worker, "verdicts", "agent@1")
        (step,) = [s for s in gw.admin().get("/admin/policies/agent/checkpoints").json()["data"] if s["step"] == 1]
        assert step["decision"] == "rejected", step["decisions"][-1]["test"]
        assert status["step"] == 0
    finally:
        judge.reads = None
        await worker.close()


async def test_eval_gates_on_held_out_scores_and_manual_waits_for_an_admin(trial) -> None:
    gw, worker, tiny_model, _ = trial
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), promotion={"rule": "eval", **RULE}, **TRIAL)
    await worker.recover()
    status = await step_to_candidate(gw, worker, "e1")
    assert status["candidate"]["step"] == 1 and status["candidate"]["share"] is None
    # Under eval the candidate serves only what is pinned to it.
    assert {version_of(gw, f"unpinned-{i}") for i in range(8)} == {"agent@0"}

    def agent(score: float):
        def run(trajectory, model: str, task: int) -> float:
            answer = trajectory.openai().chat.completions.create(model=model, messages=[{"role": "user", "content": f"task {task}"}], max_tokens=4)
            assert answer.model  # answered
            return score + 0.05 * (task % 3)

        return run

    with Client(gw.url, admin_token=ADMIN_TOKEN) as sdk:
        served = await asyncio.to_thread(sdk.run_held_out, "agent", range(8), agent(0.5), 0)
        assert served["step"] == 0 and served["trajectories"] == 8
        report = await asyncio.to_thread(sdk.run_held_out, "agent", range(8), agent(0.5))
        assert report["step"] == 1 and report["test"]["decision"] == "promote" and report["test"]["candidate"]["n"] == 8
    await worker.run_once()
    assert gw.policy()["step"] == 1

    # Manual: a candidate waits, whatever its evidence, until an admin says.
    admin = gw.admin()
    admin.patch("/admin/policies/agent", json={"promotion": {"rule": "manual"}})
    status = await step_to_candidate(gw, worker, "m1")
    assert status["candidate"]["step"] == 2 and status["candidate"]["test"] is None
    assert not await worker.run_once() and gw.policy()["candidate"]["step"] == 2
    r = admin.post("/admin/policies/agent/promote")
    assert r.status_code == 200 and (r.json()["step"], r.json()["candidate"]) == (2, None)
    assert admin.post("/admin/policies/agent/reject").json()["error"]["code"] == "no_candidate"
    (step,) = [s for s in admin.get("/admin/policies/agent/checkpoints").json()["data"] if s["step"] == 2]
    assert step["decision"] == "promoted" and step["decisions"][-1]["by"] == "admin"
