"""Traffic as it comes, through the gateway: a call that names no group is a lone attempt.

Each request answered once, with no trajectory or group id: the call is filed in a group of its
own (its trajectory's id, size 1), which its reward closes and makes ready; one whose reward
never comes expires after the policy's ``group_idle_close_s``, never blocks a step, and a
reward posted after is kept and answered ``expired``. The status counts each kind."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import openai
import pytest

from burnish_server.cli.status import render
from burnish_server.core.api.views import PolicyView
from tests.conftest import Gateway, wait_for
from tests.judge import first_token

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def gw(make_gateway, upstream, database_url: str) -> Gateway:
    gateway = make_gateway(database_url)
    gateway.create_policy("agent", train={"group_idle_close_s": 1.5, "groups_per_step": 1, "lone_per_group": 2})
    return gateway


def ask(gw: Gateway) -> str:
    """One request as a user's agent sends it: the base URL alone; the trajectory's id comes back in a header."""
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="agent", messages=HI)
    return raw.headers["x-trajectory-id"]


def reward(gw: Gateway, trajectory: str, value: float) -> Any:
    with gw.client() as c:
        return c.post(f"/v1/trajectories/{trajectory}/reward", json={"reward": value})


def group(gw: Gateway, group_id: str) -> dict[str, Any]:
    with gw.client() as c:
        r = c.get(f"/v1/groups/{group_id}")
        assert r.status_code == 200, r.text
        return r.json()


def made(gw: Gateway, group_id: str) -> dict[str, Any]:
    """The group once made (a lone attempt's is made when something happens to it), else {}."""
    with gw.client() as c:
        r = c.get(f"/v1/groups/{group_id}")
        return r.json() if r.status_code == 200 else {}


def followed_of(gw: Gateway, trajectory: str) -> Any:
    """What the store keeps for the teacher of what followed an answer (no view shows it)."""
    from sqlalchemy import select

    from burnish_server.store.database import Database
    from burnish_server.store.models import Trajectory

    async def read() -> Any:
        db = Database(gw.settings.resolved_database_url)
        try:
            return await db.read(lambda conn: conn.execute(select(Trajectory.followed).where(Trajectory.id == trajectory)).scalar_one())
        finally:
            await db.dispose()

    return asyncio.run(read())


def test_a_lone_attempt_is_a_group_of_its_own_that_its_reward_makes_ready(gw: Gateway) -> None:
    first, second, never = ask(gw), ask(gw), ask(gw)
    assert gw.trajectory(first)["group_id"] is None  # recorded as ever: a group comes with its reward
    assert gw.policy()["lone"] == {"waiting": 3, "ready": 0, "trained": 0, "expired": 0, "judged": 0, "unreadable": 0}
    answer = reward(gw, first, 1.0)
    assert answer.status_code == 200 and answer.json()["group_closed"] is True and answer.json()["expired"] is False
    assert reward(gw, second, 0.0).status_code == 200
    closed = group(gw, first)
    assert (closed["expected_size"], closed["state"], closed["close_reason"], closed["cannot_train"]) == (1, "closed", "complete", None)
    assert gw.trajectory(first)["group_id"] == first
    # Two lone attempts weigh one group (lone_per_group 2): a step's worth, however long `never` waits.
    assert gw.policy()["groups_ready"] == 2
    # Its reward never comes: it expires after group_idle_close_s, and counts so.
    wait_for(lambda: gw.policy()["lone"]["expired"] == 1, 15, "the lone attempt did not expire")
    assert gw.policy()["lone"] == {"waiting": 0, "ready": 2, "trained": 0, "expired": 1, "judged": 0, "unreadable": 0}
    # A verdict after all: kept, said to be too late, never trained on.
    late = reward(gw, never, 1.0)
    assert late.status_code == 200 and late.json()["expired"] is True and late.json()["reward"] == 1.0
    assert group(gw, never)["close_reason"] == "expired" and "expired" in group(gw, never)["cannot_train"]
    assert gw.trajectory(never)["reward"] == 1.0 and gw.policy()["groups_ready"] == 2 and gw.policy()["lone"]["expired"] == 1
    # The user's verdict puts a lone attempt's reward right until a trainer takes it.
    again = reward(gw, first, 0.5)
    assert again.status_code == 200 and gw.trajectory(first)["reward"] == 0.5
    # Where a user looks: burnish status and the dashboard's policy page.
    shown = render(msgspec.convert(gw.policy(), PolicyView))
    assert "lone attempts: 0 waiting for a reward, 2 ready, 0 trained, 1 expired unrewarded" in shown
    with gw.admin() as c:
        page = c.get("/ui/policies/agent")
        assert page.status_code == 200 and "2 ready · 0 trained · 1 expired unrewarded" in page.text


def test_a_call_to_a_model_that_is_no_policy_stays_out_of_any_group(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=HI)
    assert gw.trajectory(raw.headers["x-trajectory-id"])["group_id"] is None


@pytest.fixture
def judged(make_gateway, upstream, judge_server, database_url: str) -> Gateway:
    gateway = make_gateway(database_url, judge_base_url=judge_server[1], judge_model="judge-1")
    gateway.create_policy("agent", ruler={"next_message": True})
    return gateway


def converse(gw: Gateway, question: str, reply: str | None = None) -> tuple[str, str]:
    """A user's turn, and where given their next one, each sent with no ids: (first trajectory, its answer)."""
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": question}]
    raw = client.chat.completions.with_raw_response.create(model="agent", messages=messages)
    answer = raw.parse().choices[0].message.content
    if reply is not None:
        client.chat.completions.create(model="agent", messages=[*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": reply}])
    return raw.headers["x-trajectory-id"], answer


def test_the_users_next_message_is_judged_into_the_answers_reward(judged: Gateway, judge) -> None:
    judge.script = [first_token({"yes": -0.105, "no": -2.3, "maybe": -5.0})]
    thanked, answer = converse(judged, "What is 2 + 2?", "Thanks, that's right.")
    wait_for(lambda: judged.trajectory(thanked)["reward"] is not None, 20, "the answer was not judged")
    got = judged.trajectory(thanked)
    assert got["reward"] == pytest.approx(0.9 / (0.9 + 0.1003), abs=1e-3)
    assert got["rewards"][-1]["source"] == "next_message" and "P(yes)" in got["rewards"][-1]["explanation"]
    assert group(judged, thanked)["close_reason"] == "complete"  # a lone attempt, rewarded: ready to train
    asked = judge.requests[-1]
    assert asked["model"] == "judge-1" and asked["max_tokens"] == 1 and asked["top_logprobs"] == 20
    shown = asked["messages"][-1]["content"]
    assert "Thanks, that's right." in shown and "Is the user happy?" in shown and "What is 2 + 2?" not in shown
    # A reward the user posts first stands: the judge leaves the answer alone.
    mine, _ = converse(judged, "What is 3 + 3?")
    assert reward(judged, mine, 0.25).status_code == 200
    seen = len(judge.requests)
    client = openai.OpenAI(base_url=f"{judged.url}/v1", api_key="unused", max_retries=0)
    before = judged.trajectory(mine)["calls"][0]
    followup = [*before["request"]["messages"], {"role": "assistant", "content": before["response"]["choices"][0]["message"]["content"]}]
    client.chat.completions.create(model="agent", messages=[*followup, {"role": "user", "content": "No, that's wrong."}])
    # An answer with no follow-up is not judged; one whose judge answers neither yes nor no says so.
    judge.script = [first_token({"maybe": -0.1, "perhaps": -2.0})]
    unsure, _ = converse(judged, "What is 4 + 4?", "Hm.")
    wait_for(lambda: made(judged, unsure).get("ruler_error") is not None, 20, "the unreadable verdict was not said")
    assert "neither yes nor no" in group(judged, unsure)["ruler_error"] and judged.trajectory(unsure)["reward"] is None
    assert judged.trajectory(mine)["reward"] == 0.25 and len(judge.requests) == seen + 1  # the unsure one alone
    lone = judged.policy()["lone"]
    assert (lone["judged"], lone["unreadable"]) == (1, 1)
    assert "next-message judge: 1 answers scored by what followed, 1 unreadable verdicts" in render(msgspec.convert(judged.policy(), PolicyView))


def test_with_hindsight_what_followed_is_kept_for_the_teacher_and_completes_the_attempt(make_gateway, upstream, database_url: str) -> None:
    gw = make_gateway(database_url)
    gw.create_policy("agent", train={"objective": {"grpo": 1, "distill": 1}, "teacher": {"hindsight": True}})
    corrected, _ = converse(gw, "What is 9 + 8?", "No, it is 17.")
    wait_for(lambda: made(gw, corrected).get("state") == "closed", 20, "the follow-up did not complete the attempt")
    closed = group(gw, corrected)
    assert (closed["close_reason"], closed["cannot_train"]) == ("followed", None)  # it distills, with no reward
    assert gw.policy()["groups_ready"] >= 1
    with gw.client() as c:
        got = c.get(f"/v1/trajectories/{corrected}").json()
    assert got["reward"] is None and got["group_id"] == corrected
    late = reward(gw, corrected, 1.0)  # a verdict after the follow-up: kept, never trained on
    assert late.status_code == 200 and late.json()["expired"] is True
    # A verdict first, then the next turn: the attempt trains on its reward, and the teacher is
    # shown what followed too, so that the step sees whether the two agree.
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    asked = [{"role": "user", "content": "What is 2 + 3?"}]
    raw = client.chat.completions.with_raw_response.create(model="agent", messages=asked)
    rewarded = raw.headers["x-trajectory-id"]
    assert reward(gw, rewarded, 0.0).json()["expired"] is False
    then = [*asked, {"role": "assistant", "content": raw.parse().choices[0].message.content}, {"role": "user", "content": "No, it is 5."}]
    client.chat.completions.create(model="agent", messages=then)
    wait_for(lambda: followed_of(gw, rewarded) is not None, 20, "what followed the rewarded answer was not kept")
    assert followed_of(gw, rewarded)[-1] == {"role": "user", "content": "No, it is 5."}
    assert group(gw, rewarded)["close_reason"] == "complete" and gw.trajectory(rewarded)["reward"] == 0.0
    # A follow-up within one trajectory (an agent that sends its ids) is no lone attempt's: nothing is paired.
    with gw.client() as c:
        first = c.post("/t/mine/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": "hi"}]}).json()
        answer = first["choices"][0]["message"]["content"]
        turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks."}]
        assert c.post("/t/mine/v1/chat/completions", json={"model": "agent", "messages": turns}).status_code == 200
    time.sleep(5)  # two looks of the watcher
    assert made(gw, "mine") == {}  # never paired, nor made a group of
