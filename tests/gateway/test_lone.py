"""Traffic as it comes, through the gateway: a call that names no group is a lone attempt.

Each request answered once, with no trajectory or group id: the call is filed in a group of its
own (its trajectory's id, size 1), which its reward closes and makes ready; one whose reward
never comes expires after the policy's ``group_idle_close_s``, never blocks a step, and a
reward posted after is kept and answered ``expired``. The status counts each kind."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import Gateway, wait_for

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


def test_a_lone_attempt_is_a_group_of_its_own_that_its_reward_makes_ready(gw: Gateway) -> None:
    first, second, never = ask(gw), ask(gw), ask(gw)
    assert gw.trajectory(first)["group_id"] == first
    assert (group(gw, first)["expected_size"], group(gw, first)["state"]) == (1, "open")
    assert gw.policy()["lone"] == {"waiting": 3, "ready": 0, "trained": 0, "expired": 0}
    answer = reward(gw, first, 1.0)
    assert answer.status_code == 200 and answer.json()["group_closed"] is True and answer.json()["expired"] is False
    assert reward(gw, second, 0.0).status_code == 200
    closed = group(gw, first)
    assert (closed["state"], closed["close_reason"], closed["cannot_train"]) == ("closed", "complete", None)
    # Two lone attempts weigh one group (lone_per_group 2): a step's worth, however long `never` waits.
    assert gw.policy()["groups_ready"] == 2
    # Its reward never comes: it expires, and counts so.
    wait_for(lambda: group(gw, never)["state"] == "closed", 15, "the lone attempt did not expire")
    expired = group(gw, never)
    assert expired["close_reason"] == "expired" and "expired" in expired["cannot_train"]
    assert gw.policy()["lone"] == {"waiting": 0, "ready": 2, "trained": 0, "expired": 1}
    # A verdict after all: kept, said to be too late, never trained on.
    late = reward(gw, never, 1.0)
    assert late.status_code == 200 and late.json()["expired"] is True and late.json()["reward"] == 1.0
    assert gw.trajectory(never)["reward"] == 1.0 and gw.policy()["groups_ready"] == 2
    # A second reward for one already closed by its first is refused, as for any closed group.
    assert reward(gw, first, 0.5).status_code == 409


def test_a_call_to_a_model_that_is_no_policy_stays_out_of_any_group(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=HI)
    assert gw.trajectory(raw.headers["x-trajectory-id"])["group_id"] is None
