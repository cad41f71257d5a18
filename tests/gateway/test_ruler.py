"""RULER against a deterministic judge on a loopback socket: scores stored exactly, retries,
failures that store nothing, the verdict cache, deduplication, combining, automatic runs;
and the judge's endpoint taken only from the server's configuration, its answers never echoed.

The real-judge test (vLLM's guided decoding on the tiny model) is in tests/serving/test_vllm.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import httpx
import pytest

from burnish_server.core.protocols.transcript import Message, conversation
from burnish_server.gateway.groups.ruler import DEFAULT_RUBRIC, build_prompt
from tests.conftest import Gateway, wait_for
from tests.judge import Judge, raw, scores
from tests.records import chat_call
from tests.servers import ServerThread, free_port
from tests.upstream import Upstream

# Written by the judge into its failed answers: never to reach a caller or the store.
MARKER = "SECRET-MARKER-7f3a"


@pytest.fixture
def gw(make_gateway, upstream: Upstream, judge_server: tuple[Judge, str], database_url: str) -> Gateway:
    """A gateway whose configured judge is the loopback one, on SQLite and on PostgreSQL."""
    return make_gateway(database_url, judge_base_url=judge_server[1], judge_model="judge-1", judge_api_key="judge-key")


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
    # As an agent on the open gateway (the "call" scope); tests/gateway/test_access.py tries it with keys.
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
    with gw.admin() as c:
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
    from burnish_server.gateway.groups.ruler import TRAJECTORY_CHAR_BUDGET

    long = "start " + "x" * (3 * TRAJECTORY_CHAR_BUDGET) + " the end"
    prompt = build_prompt({"a": [Message("user", "task"), Message("assistant", long)], "b": [Message("user", "task"), Message("assistant", "short")]})
    user = prompt.messages[1]["content"]
    assert "start " in user and " the end" in user and "characters omitted" in user
    assert len(user) < 2 * TRAJECTORY_CHAR_BUDGET


@pytest.fixture
def target() -> Iterator[tuple[Judge, str]]:
    """A second loopback server: where a request naming a judge URL would have sent the gateway."""
    app = Judge()
    app.script = [scores(lambda t: 0.5)]
    with ServerThread(app, log_level="critical") as server:
        yield app, server.url + "/v1"


@pytest.mark.parametrize(
    ("field", "value", "code", "setting"),
    [
        ("judge_base_url", "{target}", "judge_url_not_allowed", "BURNISH_JUDGE_BASE_URL"),
        ("judge_base_url", "{target}/internal/admin?", "judge_url_not_allowed", "BURNISH_JUDGE_BASE_URL"),
        ("judge_base_url", None, "judge_url_not_allowed", "BURNISH_JUDGE_BASE_URL"),
        ("judge_api_key", "sk-mine", "judge_key_not_allowed", "BURNISH_JUDGE_API_KEY"),
    ],
    ids=["url", "url-with-query-trick", "url-null", "key"],
)
def test_a_judge_endpoint_in_the_body_is_refused(gw: Gateway, judge: Judge, target, field, value, code, setting) -> None:
    """The route is open to agents: a URL in the body would let anyone aim the gateway at any
    host (and read the answer back). It is refused before anything is read, asked or stored."""
    ids = play(gw, "s1", ["a", "b"])
    r = ruler(gw, "s1", **{field: value.format(target=target[1]) if value else value, "judge_model": "judge-1"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, field, "invalid_request_error")
    assert setting in error["message"] and "not accepted" in error["message"]
    assert target[0].requests == [] and judge.requests == []  # nothing was asked, of either server
    with gw.client() as c:
        group = c.get("/v1/groups/s1").json()
    assert (group["ruler_error"], group["ruler_at"], group["closed_at"]) == (None, None, None)
    assert all(gw.trajectory(t)["reward"] is None for t in ids)


def test_the_configured_judge_key_goes_only_to_the_configured_judge(gw: Gateway, judge: Judge, judge_server, upstream: Upstream) -> None:
    """BURNISH_JUDGE_API_KEY goes to BURNISH_JUDGE_BASE_URL and nowhere else, even to a
    judge URL an admin set on a policy; the URL an admin sets must be an http(s) base URL."""
    ids = play(gw, "k1", ["a", "b"])
    judge.script = [scores({ids[0]: 0.5, ids[1]: 0.5})]
    assert ruler(gw, "k1").status_code == 200
    assert judge.requests[-1]["_headers"]["authorization"] == "Bearer judge-key"

    other = judge_server[1].replace("127.0.0.1", "localhost")  # the same server under another name
    gw.create_policy("agent", "tiny", ruler={"judge_base_url": other, "judge_model": "judge-p"})
    with gw.client() as c:
        for i in range(2):
            c.post(f"/g/k2/t/k2-{i}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": str(i)}]})
    judge.script = [scores(lambda t: 0.5)]
    r = ruler(gw, "k2")
    assert r.status_code == 200, r.text
    assert r.json()["judge"] == {"model": "judge-p", "base_url": other}
    assert judge.requests[-1]["model"] == "judge-p" and "authorization" not in judge.requests[-1]["_headers"]

    with gw.admin() as c:
        for bad in ("ftp://example/v1", "http://example/v1?", "http://example/v1#x", "example/v1"):
            r = c.patch("/admin/policies/agent", json={"ruler": {"judge_base_url": bad}})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_ruler", (bad, r.text)
            r = c.post("/admin/policies", json={"name": "other", "base_model": "tiny", "ruler": {"judge_base_url": bad}})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_policy", (bad, r.text)


def test_the_allow_list_bounds_what_a_policy_may_name(make_gateway, upstream: Upstream, judge: Judge, judge_server, target) -> None:
    """BURNISH_JUDGE_ALLOWED_URLS, where set: a policy's judge_base_url must be in it (or be the
    configured judge or the upstream)."""
    other = judge_server[1].replace("127.0.0.1", "localhost")
    gw = make_gateway(judge_base_url=judge_server[1], judge_model="judge-1", judge_allowed_urls=f" {other}/ ,http://127.0.0.1:9/v1")
    gw.create_policy("allowed", "tiny", ruler={"judge_base_url": other})
    gw.create_policy("elsewhere", "tiny", ruler={"judge_base_url": target[1]})
    gw.create_policy("configured", "tiny", ruler={"judge_base_url": judge_server[1] + "/"})
    with gw.client() as c:
        for policy in ("allowed", "elsewhere", "configured"):
            for i in range(2):
                r = c.post(f"/g/{policy}/t/{policy}-{i}/v1/chat/completions", json={"model": policy, "messages": [{"role": "user", "content": str(i)}]})
                assert r.status_code == 200, r.text
    judge.script = [scores(lambda t: 0.5)]
    assert ruler(gw, "allowed").status_code == 200 and len(judge.requests) == 1
    assert ruler(gw, "configured").status_code == 200 and len(judge.requests) == 2
    r = ruler(gw, "elsewhere")
    assert r.status_code == 409 and r.json()["error"]["code"] == "judge_url_not_allowed", r.text
    assert "BURNISH_JUDGE_ALLOWED_URLS" in r.json()["error"]["message"] and target[1] not in r.json()["error"]["message"]
    assert target[0].requests == [] and len(judge.requests) == 2


@pytest.mark.parametrize(
    ("answer", "said", "attempts", "in_log"),
    [
        (raw(500, json.dumps({"error": {"message": f"internal details {MARKER}"}})), "the judge answered HTTP 500", 3, True),
        (raw(401, f"bad key {MARKER}"), "refused the request: it answered HTTP 401", 1, True),
        (raw(200, f"<html>{MARKER}</html>"), "the judge's answer was not a chat completion", 3, True),
        # A completion's text reaches the log only with BURNISH_LOG_BODIES.
        (lambda ids: f"here you go: {MARKER}", "the judge's answer was not valid JSON", 3, False),
        (lambda ids: json.dumps({MARKER: {"explanation": 1, "score": 0.5}}), "not JSON matching the schema", 3, False),
        (
            lambda ids: json.dumps({**{t: {"explanation": "x", "score": 0.5} for t in ids}, MARKER: {"explanation": "x", "score": 0.1}}),
            "1 unknown id",
            3,
            False,
        ),
    ],
    ids=["http-500", "http-401", "not-a-completion", "not-json", "off-schema", "unknown-id"],
)
def test_a_failing_judge_is_described_never_echoed(gw: Gateway, judge: Judge, caplog, answer, said, attempts, in_log) -> None:
    """What the judge said stays in the gateway's log (cut short): the caller's 502 and the
    group's ruler_error say what failed in our words."""
    ids = play(gw, "e1", ["a", "b"])
    judge.script = [answer]
    with caplog.at_level(logging.WARNING, logger="burnish.ruler"):
        r = ruler(gw, "e1")
    assert r.status_code == 502, r.text
    assert MARKER not in r.text and said in r.json()["error"]["message"], r.text
    assert r.json()["error"]["code"] == "ruler_failed" and len(judge.requests) == attempts
    with gw.client() as c:
        group = c.get("/v1/groups/e1").json()
        export = c.get("/v1/trajectories/export", params={"group_id": "e1"}).text
    assert said in group["ruler_error"] and MARKER not in json.dumps(group) and MARKER not in export
    assert all(gw.trajectory(t)["reward"] is None for t in ids)
    logged = [rec.getMessage() for rec in caplog.records if rec.name == "burnish.ruler"]
    assert len(logged) == attempts and all(len(m) < 1000 for m in logged)
    assert all((MARKER in m) == in_log for m in logged)


def test_a_long_failed_answer_is_logged_cut_short(gw: Gateway, judge: Judge, caplog) -> None:
    play(gw, "e2", ["a", "b"])
    judge.script = [raw(503, MARKER + "x" * 100_000)]
    with caplog.at_level(logging.WARNING, logger="burnish.ruler"):
        assert ruler(gw, "e2").status_code == 502
    logged = [rec.getMessage() for rec in caplog.records if rec.name == "burnish.ruler" and "HTTP 503" in rec.getMessage()]
    assert len(logged) == 3 and all(MARKER in m and len(m) < 1000 for m in logged)


def test_a_failed_automatic_run_stores_our_words(gw: Gateway, judge: Judge) -> None:
    gw.create_policy("agent", "tiny", ruler={"auto": True, "judge_model": "judge-2"})
    judge.script = [raw(500, MARKER)]
    with gw.client() as c:
        for i in range(2):
            c.post(f"/g/auto-e/t/auto-e-{i}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": str(i)}]})
        c.post("/v1/groups/auto-e/close")
        wait_for(lambda: c.get("/v1/groups/auto-e").json()["ruler_error"] is not None, 20, "the automatic run stored no error")
        error = c.get("/v1/groups/auto-e").json()["ruler_error"]
    assert "the judge answered HTTP 500" in error and MARKER not in error


def test_an_unreachable_judge_is_described(make_gateway, upstream: Upstream) -> None:
    gw = make_gateway(judge_base_url=f"http://127.0.0.1:{free_port()}/v1", judge_model="judge-1", judge_attempts=2)
    play(gw, "u1", ["a", "b"])
    r = ruler(gw, "u1")
    assert r.status_code == 502 and "could not reach the judge: connection refused" in r.json()["error"]["message"], r.text
    assert "2 attempts" in r.json()["error"]["message"]


@pytest.mark.parametrize("slow", [raw(200, "{}", delay_s=3), raw(200, '{"choices": []}' + " " * 40, drip_s=0.1)], ids=["silent", "dripping"])
def test_the_judge_has_its_own_timeout_for_a_whole_call(make_gateway, upstream: Upstream, judge: Judge, judge_server, slow) -> None:
    """BURNISH_JUDGE_TIMEOUT bounds each call whole, not the upstream's 600 s between bytes:
    a judge that drips its answer a byte at a time is cut off too."""
    gw = make_gateway(judge_base_url=judge_server[1], judge_model="judge-1", judge_timeout=1, judge_attempts=2)
    play(gw, "t1", ["a", "b"])
    judge.script = [slow]
    started = time.monotonic()
    r = ruler(gw, "t1")
    assert r.status_code == 502 and "timed out" in r.json()["error"]["message"], r.text
    assert len(judge.requests) == 2 and time.monotonic() - started < 10


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


@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
def test_the_judge_sees_each_multi_turn_tool_trajectory_in_order(gw: Gateway, judge: Judge, surface: str) -> None:
    """Two members of a group, each a tool loop of two calls to a policy on one surface: the task,
    the model's tool call, the tool's result, the model's answer. The judge is shown each
    member's turns in that order, the call with its arguments and the result with its own text,
    whatever the surface the agent spoke."""
    gw.create_policy("agent", "tiny")
    group, ids = f"tools-{surface}", [f"tools-{surface}-{i}" for i in range(2)]
    lookup = {"type": "object", "properties": {"query": {"type": "string"}}}
    with gw.client() as c:
        for i, t in enumerate(ids):
            # A task worded apart per member, so that no turn is shared context shown once.
            base, result, task = f"/g/{group}/t/{t}/v1", f"RESULT-{surface}-{i}", f"Find the secret of apple, try {i}."
            if surface == "chat":
                tools = [{"type": "function", "function": {"name": "lookup", "parameters": lookup}}]
                first = c.post(f"{base}/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": task}], "tools": tools}).json()
                called = first["choices"][0]["message"]
                back = [{"role": "user", "content": task}, called, {"role": "tool", "tool_call_id": called["tool_calls"][0]["id"], "content": result}]
                r = c.post(f"{base}/chat/completions", json={"model": "agent", "messages": back})
            elif surface == "responses":
                tools = [{"type": "function", "name": "lookup", "parameters": lookup}]
                first = c.post(f"{base}/responses", json={"model": "agent", "input": task, "tools": tools}).json()
                (called,) = [item for item in first["output"] if item["type"] == "function_call"]
                output = {"type": "function_call_output", "call_id": called["call_id"], "output": result}
                r = c.post(f"{base}/responses", json={"model": "agent", "input": [{"role": "user", "content": task}, called, output]})
            else:
                tools = [{"name": "lookup", "input_schema": lookup}]
                ask = {"role": "user", "content": task}
                first = c.post(f"{base}/messages", json={"model": "agent", "max_tokens": 32, "messages": [ask], "tools": tools}).json()
                (use,) = [b for b in first["content"] if b["type"] == "tool_use"]
                answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": result}]}
                r = c.post(
                    f"{base}/messages", json={"model": "agent", "max_tokens": 32, "messages": [ask, {"role": "assistant", "content": first["content"]}, answer]}
                )
            assert r.status_code == 200, r.text
    judge.script = [scores({ids[0]: 0.3, ids[1]: 0.7})]
    assert ruler(gw, group).status_code == 200
    shown = judge.requests[0]["messages"][1]["content"]
    for i, t in enumerate(ids):
        member = shown[shown.index(f'<trajectory id="{t}">') :]
        member = member[: member.index("</trajectory>")]
        order = [member.find(piece) for piece in (f"try {i}.", "-> calls lookup(", "[tool ", f"RESULT-{surface}-{i}")]
        assert -1 not in order and order == sorted(order), member
        assert f"try {i}. ok" in member[order[1] : order[2]], member  # the call with its arguments
        assert member.rfind("[assistant]\nYou said:") > order[-1], member  # the answer to the result comes last
    assert {t: gw.trajectory(t)["reward"] for t in ids} == {ids[0]: 0.3, ids[1]: 0.7}


def test_a_nul_in_a_judges_explanation_or_a_request_is_no_500(gw: Gateway, judge: Judge) -> None:
    """PostgreSQL's text cannot hold a NUL character (found by the schema fuzz on PostgreSQL): a
    request's judge_model or rubric with one is refused 400; a judge's explanation loses it."""
    ids = play(gw, "nul", ["try a", "try b"])
    for body in ({"judge_model": "judge\x00"}, {"rubric": "be fair\x00"}):
        r = ruler(gw, "nul", **body)
        assert r.status_code == 400 and r.json()["error"]["param"] in ("judge_model", "rubric"), r.text
    judge.script = [lambda got: json.dumps({t: {"explanation": f"{t}\x00 judged", "score": 0.5 + 0.1 * i} for i, t in enumerate(got)})]
    r = ruler(gw, "nul")
    assert r.status_code == 200, r.text
    with gw.client() as c:
        assert c.get(f"/v1/trajectories/{ids[0]}").json()["rewards"][-1]["explanation"] == f"{ids[0]} judged"
