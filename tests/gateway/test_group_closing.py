"""Groups that close themselves, and closed groups that say why they cannot train.

A group closes at its size (``X-Group-Size``, every member rewarded), when told (``POST
/close``), or after its policy's ``group_idle_close_s`` with no member's call and no reward.
A closed group that can never train (a member unrewarded, one member, every reward equal)
says why in its own view, and the policy's health says so when none of its last groups can."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import Gateway, wait_for

CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}


def call(gw: Gateway, group: str, trajectory: str) -> None:
    with gw.client() as c:
        assert c.post(f"/g/{group}/t/{trajectory}/v1/chat/completions", json=CHAT).status_code == 200


def reward(gw: Gateway, trajectory: str, value: float) -> Any:
    with gw.client() as c:
        return c.post(f"/v1/trajectories/{trajectory}/reward", json={"reward": value})


def group(gw: Gateway, group_id: str) -> dict[str, Any]:
    with gw.client() as c:
        r = c.get(f"/v1/groups/{group_id}")
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def gw(make_gateway, upstream, database_url: str) -> Gateway:
    gateway = make_gateway(database_url)
    gateway.create_policy("agent", train={"group_idle_close_s": 1.5})
    return gateway


def test_an_idle_group_closes_by_itself_and_trains(gw: Gateway) -> None:
    for i, r in enumerate((0.0, 1.0)):
        call(gw, "task-1", f"a-{i}")
        assert reward(gw, f"a-{i}", r).status_code == 200
    assert group(gw, "task-1")["state"] == "open"  # no size given: nothing says it is complete
    wait_for(lambda: group(gw, "task-1")["state"] == "closed", 15, "the idle group did not close")
    closed = group(gw, "task-1")
    assert closed["close_reason"] == "idle" and closed["cannot_train"] is None
    assert gw.policy()["groups_ready"] == 1
    # Closed: its rewards are final, and the refusal says why it closed.
    refused = reward(gw, "a-0", 0.5)
    assert refused.status_code == 409 and "idle" in refused.json()["error"]["message"] and "group_idle_close_s" in refused.json()["error"]["message"]


def test_a_group_still_in_use_stays_open(gw: Gateway) -> None:
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < 4:  # a call every half second: never idle for 1.5 s
        call(gw, "busy", f"b-{i}")
        i += 1
        time.sleep(0.5)
    assert group(gw, "busy")["state"] == "open"
    # A reward is activity too.
    for j in range(3):
        time.sleep(0.8)
        assert reward(gw, f"b-{j}", float(j)).status_code == 200
    assert group(gw, "busy")["state"] == "open"


def test_closed_groups_that_cannot_train_say_why_and_the_policy_warns(gw: Gateway) -> None:
    with gw.admin() as c:  # a lone attempt trains by default (tests/gateway/test_lone.py); not here
        assert c.patch("/admin/policies/agent", json={"train": {"lone_baseline": None}}).status_code == 200
    call(gw, "half", "h-0")
    call(gw, "half", "h-1")
    assert reward(gw, "h-0", 1.0).status_code == 200
    call(gw, "alone", "l-0")
    assert reward(gw, "l-0", 1.0).status_code == 200
    wait_for(lambda: all(group(gw, g)["state"] == "closed" for g in ("half", "alone")), 15, "the idle groups did not close")
    assert group(gw, "half")["cannot_train"].startswith("1 of its 2 members have no reward")
    assert group(gw, "alone")["cannot_train"].startswith("one member, and the policy's train.lone_baseline is off")
    with gw.admin() as c:  # the dashboard's group page says it too
        page = c.get("/ui/groups/half")
        assert page.status_code == 200 and "Will not train" in page.text and "1 of its 2 members have no reward" in page.text
    health = gw.policy()["health"]
    assert (health["recent_groups"], health["recent_unrewarded"], health["recent_lone"]) == (2, 1, 1)
    assert health["warning"].startswith("nothing to train: of the last 2 closed groups, 1 closed with members that have no reward")
    # A tie says so too, and a group that can train says nothing.
    for name, rewards in (("tie", (0.5, 0.5)), ("apart", (0.0, 1.0))):
        for i, r in enumerate(rewards):
            call(gw, name, f"{name}-{i}")
            assert reward(gw, f"{name}-{i}", r).status_code == 200
        with gw.client() as c:
            assert c.post(f"/v1/groups/{name}/close").status_code == 200
    assert group(gw, "tie")["cannot_train"].startswith("every member has the same reward (0.5)")
    assert group(gw, "apart")["cannot_train"] is None and group(gw, "apart")["close_reason"] == "closed"
    assert gw.policy()["health"]["warning"] is None  # one of the last groups can train


def test_without_an_idle_time_a_group_waits_to_be_closed(make_gateway, upstream) -> None:
    gw = make_gateway()
    gw.create_policy("agent", train={"group_idle_close_s": None})
    call(gw, "waits", "w-0")
    time.sleep(2)
    assert group(gw, "waits")["state"] == "open"
    assert gw.policy()["train"]["group_idle_close_s"] is None


TEACHER = {"context": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]}


def test_a_policy_that_distills_trains_on_every_closed_group_rewarded_or_not(gw: Gateway) -> None:
    """Distillation needs no reward (the teacher scores the samples): a closed group is ready as it
    is, says nothing against itself, and the health does not warn of ties; SFT needs rewards but
    not their spread. A distilling objective without a teacher is refused, naming the field."""
    with gw.admin() as c:
        refused = c.patch("/admin/policies/agent", json={"train": {"objective": "distill"}})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "conflicting_settings", refused.text
        assert "train.teacher" in refused.json()["error"]["message"]
        zero = c.patch("/admin/policies/agent", json={"train": {"objective": {"grpo": 0}}})
        assert zero.status_code == 400 and "weighs every objective 0" in zero.json()["error"]["message"]
        assert c.patch("/admin/policies/agent", json={"train": {"objective": {"grpo": 1, "distill": 0.5}, "teacher": TEACHER}}).status_code == 200
    for name in ("quiet", "tie"):
        for i in range(2):
            call(gw, name, f"{name}-{i}")
    for i in range(2):
        assert reward(gw, f"tie-{i}", 0.5).status_code == 200
    for name in ("quiet", "tie"):
        with gw.client() as c:
            assert c.post(f"/v1/groups/{name}/close").status_code == 200
    assert group(gw, "quiet")["cannot_train"] is None and group(gw, "tie")["cannot_train"] is None
    status = gw.policy()
    assert status["groups_ready"] == 2 and status["health"]["warning"] is None
    assert status["train"]["objective"] == {"grpo": 1.0, "sft": 0.0, "distill": 0.5}
    with gw.admin() as c:  # SFT alone: the tie is ready (its members are all the best), the unrewarded group not
        assert c.patch("/admin/policies/agent", json={"train": {"objective": "sft", "sft_min_reward": 0.5}}).status_code == 200
    assert gw.policy()["groups_ready"] == 1
    assert group(gw, "quiet")["cannot_train"].startswith("2 of its 2 members have no reward")
