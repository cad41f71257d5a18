"""RULER against a deterministic judge on a loopback socket: scores stored exactly, retries,
failures that store nothing, the verdict cache, deduplication, combining, automatic runs.

The real-judge test (vLLM's guided decoding on the tiny model) is in tests/test_vllm.py.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from burnish_server.core.transcript import Message, conversation
from burnish_server.gateway.ruler import DEFAULT_RUBRIC, build_prompt
from tests.conftest import Gateway, wait_for
from tests.judge import Judge, scores
from tests.records import chat_call
from tests.upstream import Upstream


@pytest.fixture
def gw(make_gateway, upstream: Upstream, judge_server: tuple[Judge, str]) -> Gateway:
    return make_gateway(judge_base_url=judge_server[1], judge_model="judge-1", judge_api_key="judge-key")


def play(gw: Gateway, group: str, answers: list[str], *, size: int | None = None, rewards: list[float] | None = None) -> list[str]:
    """One trajectory per answer: the same task, then a different user turn each (the upstream echoes it)."""
    ids = [f"{group}-{i}" for i in range(len(answers))]
    headers = {"x-group-size": str(size)} if size else {}
    with gw.client() as c:
        for t, text in zip(ids, answers):
            messages = [{"role": "system", "content": "Solve the task."}, {"role": "user", "content": text}]
            r = c.post(f"/g/{group}/t/{t}/v1/chat/completions", json={"model": "tiny", "messages": messages}, headers=headers)
            assert r.status_code == 200, r.text
        for t, reward in zip(ids, rewards or []):
            assert c.post(f"/v1/trajectories/{t}/reward", json={"reward": reward, "components": {"tests": reward}}).status_code == 200
    return ids


def ruler(gw: Gateway, group: str, **body) -> httpx.Response:
    with gw.client() as c:
        return c.post(f"/v1/groups/{group}/ruler", json=body)


def test_scores_are_stored_exactly_as_rewards(gw: Gateway, judge: Judge) -> None:
    ids = play(gw, "g1", ["try a", "try b", "try c"])
    judge.script = [scores({ids[0]: 0.2, ids[1]: 0.9, ids[2]: 0.55})]
    r = ruler(gw, "g1")
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["cached"], out["judge_calls"], out["combine"], out["judge"]["model"]) == (False, 1, "set", "judge-1")
    assert {s["trajectory_id"]: s["score"] for s in out["scores"]} == {ids[0]: 0.2, ids[1]: 0.9, ids[2]: 0.55}
    for t, expected in zip(ids, (0.2, 0.9, 0.55)):
        traj = gw.trajectory(t)
        assert traj["reward"] == expected and traj["reward_components"] == {"ruler": expected}
        assert traj["rewards"][-1]["source"] == "ruler" and traj["rewards"][-1]["explanation"] == f"{t} judged"
    with gw.client() as c:
        group = c.get("/v1/groups/g1").json()
    assert group["close_reason"] == "ruler" and group["ruler_error"] is None

    # What the judge was sent: the schema names every id, the shared system prompt is shown once.
    sent = judge.requests[0]
    assert sent["model"] == "judge-1" and sent["_headers"]["authorization"] == "Bearer judge-key"
    assert sent["response_format"]["type"] == "json_schema"
    assert sorted(sent["response_format"]["json_schema"]["schema"]["required"]) == sorted(ids)
    user = sent["messages"][1]["content"]
    assert user.count("Solve the task.") == 1 and "<shared_context>" in user
    assert all(f'<trajectory id="{t}">' in user for t in ids) and "You said: try b ok" in user
    assert DEFAULT_RUBRIC.splitlines()[0] in sent["messages"][0]["content"]


def test_a_wrong_count_is_retried(gw: Gateway, judge: Judge) -> None:
    ids = play(gw, "g2", ["one", "two"])
    judge.script = [lambda got: json.dumps({got[0]: {"explanation": "only one", "score": 0.5}}), scores({ids[0]: 0.1, ids[1]: 0.7})]
    r = ruler(gw, "g2")
    assert r.status_code == 200, r.text
    assert r.json()["judge_calls"] == 2 and len(judge.requests) == 2
    assert gw.trajectory(ids[1])["reward"] == 0.7


@pytest.mark.parametrize(
    "answer",
    [
        lambda ids: "not json at all",
        lambda ids: json.dumps({t: {"explanation": "x", "score": 1.5} for t in ids}),
        lambda ids: json.dumps({**{t: {"explanation": "x", "score": 0.5} for t in ids}, "intruder": {"explanation": "x", "score": 0.1}}),
        lambda ids: 503,
    ],
    ids=["invalid-json", "out-of-range", "unknown-id", "status-503"],
)
def test_malformed_every_time_is_a_clear_error_and_stores_nothing(gw: Gateway, judge: Judge, answer) -> None:
    ids = play(gw, "g3", ["a", "b"])
    judge.script = [answer]
    with gw.client() as c:
        before = c.get("/v1/trajectories/export", params={"group_id": "g3"}).text
    r = ruler(gw, "g3")
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "ruler_failed" and "3 attempts" in error["message"] and error["type"] == "api_error"
    assert len(judge.requests) == 3  # bounded retries
    with gw.client() as c:
        assert c.get("/v1/trajectories/export", params={"group_id": "g3"}).text == before  # no reward, nothing changed
        group = c.get("/v1/groups/g3").json()
    assert "3 attempts" in group["ruler_error"] and group["closed_at"] is None
    assert all(gw.trajectory(t)["reward"] is None for t in ids)


def test_a_cached_verdict_costs_no_judge_call(gw: Gateway, judge: Judge) -> None:
    ids = play(gw, "g4", ["x", "y"])
    judge.script = [scores({ids[0]: 0.3, ids[1]: 0.6})]
    first = ruler(gw, "g4").json()
    again = ruler(gw, "g4")
    assert again.status_code == 200 and again.json()["cached"] is True and again.json()["judge_calls"] == 0
    assert again.json()["scores"] == first["scores"]
    assert len(judge.requests) == 1
    # Another rubric is another question.
    judge.script = [scores({ids[0]: 0.8, ids[1]: 0.1})]
    other = ruler(gw, "g4", rubric="Shorter is better.").json()
    assert other["cached"] is False and len(judge.requests) == 2
    assert "Shorter is better." in judge.requests[1]["messages"][0]["content"]
    assert gw.trajectory(ids[0])["reward"] == 0.8


def test_identical_trajectories_are_judged_once(gw: Gateway, judge: Judge) -> None:
    ids = play(gw, "g5", ["same", "same", "different"])
    judge.script = [scores(lambda t: 0.25 if t == ids[0] else 0.75)]
    out = ruler(gw, "g5").json()
    asked = judge.ids(judge.requests[0])
    assert sorted(asked) == sorted([ids[0], ids[2]]) and out["distinct_trajectories"] == 2
    assert {s["trajectory_id"]: s["score"] for s in out["scores"]} == {ids[0]: 0.25, ids[1]: 0.25, ids[2]: 0.75}


def test_add_combines_with_the_users_reward(gw: Gateway, judge: Judge) -> None:
    ids = play(gw, "g6", ["p", "q"], rewards=[1.0, 0.0])
    judge.script = [scores({ids[0]: 0.5, ids[1]: 0.25})]
    out = ruler(gw, "g6", combine="add").json()
    assert {s["trajectory_id"]: s["reward"] for s in out["scores"]} == {ids[0]: 1.5, ids[1]: 0.25}
    assert gw.trajectory(ids[0])["reward_components"] == {"tests": 1.0, "ruler": 0.5}


def test_bad_requests(gw: Gateway, judge: Judge, make_gateway, upstream: Upstream) -> None:
    play(gw, "g7", ["a", "b"])
    error = ruler(gw, "nobody").json()["error"]
    assert error["code"] == "group_not_found"
    assert ruler(gw, "g7", combine="multiply").json()["error"]["code"] == "invalid_request"
    assert ruler(gw, "g7", colour="red").json()["error"]["code"] == "invalid_request"
    with gw.client() as c:
        assert c.post("/v1/groups/g7/ruler", content=b"{", headers={"content-type": "application/json"}).json()["error"]["code"] == "invalid_json"
    # No judge model anywhere (no setting, not a policy's group): a clear 400.
    plain = make_gateway(judge_base_url="http://127.0.0.1:9/v1")
    play(plain, "g8", ["a", "b"])
    r = ruler(plain, "g8")
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_judge_model"
    assert judge.requests == []


def test_a_trained_group_is_refused(gw: Gateway, judge: Judge) -> None:
    import asyncio

    from burnish_server.store.database import Database
    from burnish_server.store.training import claim_groups

    gw.create_policy("agent", "tiny")
    with gw.client() as c:
        for i in range(2):
            c.post(f"/g/g9/t/g9-{i}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": str(i)}]})
            c.post(f"/v1/trajectories/g9-{i}/reward", json={"reward": float(i)})
        c.post("/v1/groups/g9/close")

    async def claim() -> list[str]:
        db = Database(gw.settings.resolved_database_url)
        try:
            return await db.transaction(claim_groups, "agent", "trainer-x", 1)
        finally:
            await db.dispose()

    assert asyncio.run(claim()) == ["g9"]
    r = ruler(gw, "g9", judge_model="judge-1")
    assert r.status_code == 409 and r.json()["error"]["code"] == "group_trained"
    assert judge.requests == []


def test_a_policy_can_run_ruler_by_itself(gw: Gateway, judge: Judge) -> None:
    """auto: a group of the policy that closes without rewards is judged in the background."""
    gw.create_policy("agent", "tiny", ruler={"auto": True, "judge_model": "judge-2", "rubric": "Longer is better."})
    with gw.client() as c:
        for i, text in enumerate(["short", "a much longer answer"]):
            c.post(f"/g/auto/t/auto-{i}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": text}]})
        judge.script = [scores({"auto-0": 0.1, "auto-1": 0.9})]
        c.post("/v1/groups/auto/close")
        wait_for(lambda: gw.trajectory("auto-1")["reward"] is not None, 10, "no automatic RULER")
    assert [gw.trajectory(f"auto-{i}")["reward"] for i in range(2)] == [0.1, 0.9]
    assert judge.requests[0]["model"] == "judge-2" and "Longer is better." in judge.requests[0]["messages"][0]["content"]
    assert gw.policy()["groups_ready"] == 1  # now trainable
    time.sleep(1.5)
    assert len(judge.requests) == 1  # judged once


# ---- the prompt, as a unit ----------------------------------------------------------


def test_conversations_merge_turns_and_render_tool_calls() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}
    first = chat_call({"messages": [{"role": "user", "content": "add 1"}]}, {"choices": [{"message": call}]})
    second_messages = [{"role": "user", "content": "add 1"}, {**call, "refusal": None}, {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    second = chat_call({"messages": second_messages}, {"choices": [{"message": {"role": "assistant", "content": "It is 1."}}]})
    conv = conversation([first, second])
    assert [m.role for m in conv] == ["user", "assistant", "tool", "assistant"]  # the second call adds only what is new
    assert conv[1].render() == '[assistant]\n-> calls add({"a": 1})' and conv[2].render() == "[tool c1]\n1"


def test_long_trajectories_are_cut_from_the_middle() -> None:
    from burnish_server.gateway.ruler import TRAJECTORY_CHAR_BUDGET

    long = "start " + "x" * (3 * TRAJECTORY_CHAR_BUDGET) + " the end"
    prompt = build_prompt({"a": [Message("user", "task"), Message("assistant", long)], "b": [Message("user", "task"), Message("assistant", "short")]})
    user = prompt.messages[1]["content"]
    assert "start " in user and " the end" in user and "characters omitted" in user
    assert len(user) < 2 * TRAJECTORY_CHAR_BUDGET


def test_the_configured_judge_key_goes_only_to_the_configured_judge(gw: Gateway, judge: Judge, judge_server) -> None:
    """A request naming another judge URL must not receive BURNISH_JUDGE_API_KEY (the route is open to agents)."""
    ids = play(gw, "k1", ["a", "b"])
    judge.script = [scores({ids[0]: 0.5, ids[1]: 0.5})]
    other = judge_server[1].replace("127.0.0.1", "localhost")  # the same server under another name
    assert ruler(gw, "k1", judge_base_url=other).status_code == 200
    assert "authorization" not in judge.requests[-1]["_headers"]
    assert ruler(gw, "k1", judge_base_url="ftp://example/v1").json()["error"]["code"] == "invalid_request"


def test_groups_that_need_no_judge_do_not_hold_up_those_that_do(gw: Gateway, judge: Judge) -> None:
    """Under combine "set", closed groups whose members all carry a user reward are skipped in
    the query itself: nine of them (more than one pass takes) do not starve the tenth."""
    gw.create_policy("agent", "tiny", ruler={"auto": True, "judge_model": "judge-3"})
    with gw.client() as c:
        for g in range(9):
            for i in range(2):
                c.post(f"/g/tie{g}/t/tie{g}-{i}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": "x"}]})
                c.post(f"/v1/trajectories/tie{g}-{i}/reward", json={"reward": 0.0})
            c.post(f"/v1/groups/tie{g}/close")
        for i in range(2):
            c.post(f"/g/late/t/late-{i}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": str(i)}]})
        judge.script = [scores({"late-0": 0.2, "late-1": 0.8})]
        c.post("/v1/groups/late/close")
    wait_for(lambda: gw.trajectory("late-1")["reward"] is not None, 10, "the late group was never judged")
    assert len(judge.requests) == 1 and gw.trajectory("tie0-0")["rewards"][-1]["source"] == "user"
