"""Rewards, groups, reading back, export; and bad input that must change nothing."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import Gateway

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def call(c: httpx.Client, trajectory: str, group: str | None = None, size: int | None = None, content: str = "hi") -> httpx.Response:
    path = f"/g/{group}/t/{trajectory}/v1/chat/completions" if group else f"/t/{trajectory}/v1/chat/completions"
    headers = {"x-group-size": str(size)} if size else {}
    r = c.post(path, json={"model": "tiny", "messages": [{"role": "user", "content": content}]}, headers=headers)
    assert r.status_code == 200, r.text
    return r


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    if code:
        assert body["error"]["code"] == code, body
    return body["error"]


def test_reward_is_stored_with_components_and_history(gateway: Gateway) -> None:
    with gateway.client() as c:
        call(c, "r-1")
        r = c.post("/v1/trajectories/r-1/reward", json={"reward": 0.7, "components": {"format": 1.0}})
        assert r.status_code == 200 and r.json()["reward"] == 0.7
        c.post("/v1/trajectories/r-1/reward", json={"reward": -1.5})
    t = gateway.trajectory("r-1")
    assert t["reward"] == -1.5 and t["reward_components"] == {}
    assert [(x["reward"], x["components"]) for x in t["rewards"]] == [(0.7, {"format": 1.0}), (-1.5, {})]


def test_group_closes_itself_when_every_expected_member_is_rewarded(gateway: Gateway) -> None:
    with gateway.client() as c:
        for i in range(3):
            call(c, f"gm-{i}", group="g-auto", size=3)
        for i in range(3):
            r = c.post(f"/v1/trajectories/gm-{i}/reward", json={"reward": float(i)})
            assert r.json()["group_closed"] is (i == 2)
        group = c.get("/v1/groups/g-auto").json()
        assert group["close_reason"] == "complete" and group["closed_at"] and group["rewarded"] == 3
        # Closed means frozen: a later reward is refused and the stored one stays.
        assert_openai_error(c.post("/v1/trajectories/gm-0/reward", json={"reward": 9.0}), 409, "group_closed")
        assert c.get("/v1/trajectories/gm-0").json()["reward"] == 0.0


def test_close_group_by_hand(gateway: Gateway) -> None:
    with gateway.client() as c:
        call(c, "gc-1", group="g-hand")
        r = c.post("/v1/groups/g-hand/close")
        assert r.status_code == 200 and r.json()["close_reason"] == "closed"
        first = r.json()["closed_at"]
        again = c.post("/v1/groups/g-hand/close")  # idempotent: the first close stands
        assert again.status_code == 200 and again.json()["closed_at"] == first
        assert_openai_error(c.post("/v1/groups/nope/close"), 404, "group_not_found")


def test_group_lists_members_in_order(gateway: Gateway) -> None:
    with gateway.client() as c:
        for name in ("b", "a", "c"):
            call(c, f"mem-{name}", group="g-mem")
        call(c, "mem-a", group="g-mem")  # a second call: still one member
        group = c.get("/v1/groups/g-mem").json()
    assert [m["id"] for m in group["members"]] == ["mem-b", "mem-a", "mem-c"]
    assert [m["call_count"] for m in group["members"]] == [1, 2, 1]
    assert group["size"] == 3 and group["rewarded"] == 0


def test_list_filters_and_pages(gateway: Gateway) -> None:
    with gateway.client() as c:
        for i in range(7):
            call(c, f"ls-{i}", group="g-ls" if i % 2 else None)
        c.post("/v1/trajectories/ls-1/reward", json={"reward": 1})
        ids, after = [], None
        while True:
            page = c.get("/v1/trajectories", params={"limit": 3, "order": "asc", **({"after": after} if after else {})}).json()
            ids += [t["id"] for t in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert ids == [f"ls-{i}" for i in range(7)]
        newest = c.get("/v1/trajectories", params={"limit": 2}).json()
        assert [t["id"] for t in newest["data"]] == ["ls-6", "ls-5"] and newest["has_more"]
        grouped = c.get("/v1/trajectories", params={"group_id": "g-ls", "order": "asc"}).json()["data"]
        assert [t["id"] for t in grouped] == ["ls-1", "ls-3", "ls-5"]
        rewarded = c.get("/v1/trajectories", params={"rewarded": "true"}).json()["data"]
        assert [t["id"] for t in rewarded] == ["ls-1"]
        assert len(c.get("/v1/trajectories", params={"rewarded": "false"}).json()["data"]) == 6
        future = c.get("/v1/trajectories", params={"created_after": time.time() + 60}).json()["data"]
        assert future == []
        assert len(c.get("/v1/trajectories", params={"created_before": time.time() + 60}).json()["data"]) == 7
        assert_openai_error(c.get("/v1/trajectories", params={"limit": 0}), 400)
        assert_openai_error(c.get("/v1/trajectories", params={"after": "missing"}), 404)
        assert_openai_error(c.get("/v1/trajectories", params={"order": "sideways"}), 400)


def test_export_streams_every_trajectory_with_its_calls(gateway: Gateway) -> None:
    # More trajectories than one export page, so the page boundary is crossed.
    from burnish_server.store.reads import EXPORT_PAGE

    n = EXPORT_PAGE + 20
    with gateway.client() as c:
        for i in range(n):
            call(c, f"ex-{i:04d}", group="g-ex" if i < 5 else None, content=f"q{i}")
        call(c, "ex-0003", group="g-ex", content="second")
        with c.stream("GET", "/v1/trajectories/export") as r:
            assert r.headers["content-type"].startswith("application/x-ndjson")
            lines = [json.loads(line) for line in r.iter_lines() if line]
        grouped = [json.loads(line) for line in c.get("/v1/trajectories/export", params={"group_id": "g-ex"}).text.splitlines()]
    assert [t["id"] for t in lines] == [f"ex-{i:04d}" for i in range(n)]
    assert [c["request"]["messages"][0]["content"] for c in lines[3]["calls"]] == ["q3", "second"]
    assert all(len(t["calls"]) == 1 for i, t in enumerate(lines) if i != 3)
    assert lines[7]["calls"][0]["response"]["choices"][0]["message"]["content"] == "You said: q7 ok"
    assert [t["id"] for t in grouped] == [f"ex-{i:04d}" for i in range(5)]


# ---- bad input ------------------------------------------------------------------------------


def _snapshot(gw: Gateway) -> list[dict]:
    with gw.client() as c:
        return [json.loads(line) for line in c.get("/v1/trajectories/export").text.splitlines()]


def test_bad_proxy_requests_are_refused_and_store_nothing(make_gateway, upstream) -> None:
    gw = make_gateway(max_body_bytes=4096)
    with gw.client() as c:
        call(c, "keep")
        before = _snapshot(gw)
        sent_upstream = len(upstream.requests)
        url = "/v1/chat/completions"
        assert_openai_error(c.post(url, content=b'{"model": "tiny", "messages": [', headers={"content-type": "application/json"}), 400, "invalid_json")
        assert_openai_error(c.post(url, content=b"", headers={"content-type": "application/json"}), 400, "invalid_json")
        assert_openai_error(c.post(url, content=b"[1, 2]"), 400, "invalid_request")
        assert_openai_error(c.post(url, json={"model": 5, "messages": []}), 400, "invalid_request")
        too_big = c.post(url, json={**CHAT, "pad": "x" * 5000}, headers={"x-trajectory-id": "big"})
        assert_openai_error(too_big, 413, "body_too_large")
        assert too_big.headers["x-trajectory-id"] == "big"
        assert_openai_error(c.post(url, json=CHAT, headers={"x-trajectory-id": "has space"}), 400, "invalid_id")
        assert_openai_error(c.post(url, json=CHAT, headers={"x-trajectory-id": "x" * 129}), 400, "invalid_id")
        assert_openai_error(c.post(url, json=CHAT, headers={"x-trajectory-id": ""}), 400, "invalid_id")
        assert_openai_error(c.post(url, json=CHAT, headers={"x-group-id": "g/1"}), 400, "invalid_id")
        assert_openai_error(c.post(url, json=CHAT, headers={"x-group-id": "g", "x-group-size": "0"}), 400, "invalid_group_size")
        assert_openai_error(c.post(url, json=CHAT, headers={"x-group-id": "g", "x-group-size": "many"}), 400, "invalid_group_size")
        assert_openai_error(c.post(url, json=CHAT, headers={"x-group-size": "2"}), 400, "invalid_group_size")
        assert_openai_error(c.post(url, json=CHAT, headers={"x-eval": "yes"}), 400, "invalid_eval")
        assert_openai_error(c.post("/eval/t/ok/v1/chat/completions", json=CHAT, headers={"x-eval": ""}), 400, "invalid_eval")
        assert_openai_error(c.post("/eval/t/bad$id/v1/chat/completions", json=CHAT), 400, "invalid_id")
        assert_openai_error(c.post("/t/bad$id/v1/chat/completions", json=CHAT), 400, "invalid_id")
        assert_openai_error(c.post("/g/g%20x/t/ok/v1/chat/completions", json=CHAT), 400, "invalid_id")
        assert_openai_error(c.post("/t//v1/chat/completions", json=CHAT), 404)
        assert_openai_error(c.post("/v1/embeddings", json=CHAT), 404)
        assert_openai_error(c.get("/v1/chat/completions"), 405)
    assert len(upstream.requests) == sent_upstream  # nothing was forwarded
    assert _snapshot(gw) == before


def test_bad_rewards_are_refused_and_change_nothing(gateway: Gateway) -> None:
    with gateway.client() as c:
        call(c, "rb")
        c.post("/v1/trajectories/rb/reward", json={"reward": 0.25, "components": {"a": 1}})
        before = _snapshot(gateway)
        reward = "/v1/trajectories/rb/reward"
        for body in (b'{"reward": NaN}', b'{"reward": Infinity}', b'{"reward": 1e999}', b'{"reward": 1, "components": {"a": 1e999}}'):
            error = assert_openai_error(c.post(reward, content=body), 400)
            assert error["code"] in {"invalid_reward", "invalid_json"}
        assert_openai_error(c.post(reward, json={"reward": "high"}), 400, "invalid_reward")
        assert_openai_error(c.post(reward, json={"reward": True}), 400, "invalid_reward")
        assert_openai_error(c.post(reward, json={}), 400, "invalid_reward")
        assert_openai_error(c.post(reward, json={"reward": 1, "components": {"a": "x"}}), 400, "invalid_reward")
        assert_openai_error(c.post(reward, json={"reward": 1, "extra": 1}), 400, "invalid_reward")
        assert_openai_error(c.post(reward, content=b"{not json"), 400, "invalid_json")
        assert_openai_error(c.post("/v1/trajectories/nope/reward", json={"reward": 1}), 404, "trajectory_not_found")
        assert_openai_error(c.post("/v1/trajectories/bad$id/reward", json={"reward": 1}), 400, "invalid_id")
        assert_openai_error(c.get("/v1/trajectories/nope"), 404, "trajectory_not_found")
        assert_openai_error(c.get("/v1/groups/nope"), 404, "group_not_found")
    assert _snapshot(gateway) == before


@pytest.mark.parametrize("path", ["/v1/trajectories/x/reward", "/g/g/t/x/v1/chat/completions", "/g/g/t/x/v1/messages"])
def test_oversized_admin_body_is_413(make_gateway, upstream, path: str) -> None:
    gw = make_gateway(max_body_bytes=1024)
    with gw.client() as c:
        r = c.post(path, content=b"{" + b" " * 2048 + b"}")
    if path.endswith("/messages"):  # Anthropic's error format on its surface
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large" and r.json()["type"] == "error"
    else:
        assert_openai_error(r, 413)


def test_a_reward_for_one_call_is_kept_beside_the_trajectorys(gateway: Gateway) -> None:
    """Credit per turn: POST /v1/trajectories/{id}/calls/{index}/reward, index in call order
    (-1: the last). The call shows its newest reward; the history says which call each was for;
    the trajectory's own reward and its group's state are untouched."""
    with gateway.client() as c:
        for content in ("one", "two", "three"):
            call(c, "turns", group="g-turns", size=1, content=content)
        r = c.post("/v1/trajectories/turns/calls/1/reward", json={"reward": 0.5, "components": {"tool": 1.0}})
        assert r.status_code == 200, r.text
        assert [x["reward"] for x in r.json()["calls"]] == [None, 0.5, None] and r.json()["reward"] is None
        c.post("/v1/trajectories/turns/calls/-1/reward", json={"reward": -1.0}).raise_for_status()
        c.post("/v1/trajectories/turns/calls/1/reward", json={"reward": 0.25}).raise_for_status()
        assert c.get("/v1/groups/g-turns").json()["state"] == "open"  # a call's reward closes nothing
        t = c.get("/v1/trajectories/turns").json()
        assert [x["reward"] for x in t["calls"]] == [None, 0.25, -1.0]
        assert [(x["call"], x["reward"], x["components"]) for x in t["rewards"]] == [(1, 0.5, {"tool": 1.0}), (2, -1.0, {}), (1, 0.25, {})]
        exported = [json.loads(line) for line in c.get("/v1/trajectories/export", params={"group_id": "g-turns"}).text.splitlines()]
        assert [x["reward"] for x in exported[0]["calls"]] == [None, 0.25, -1.0]

        # Bad input changes nothing: no such call, no such trajectory, not a finite number, a closed group.
        assert_openai_error(c.post("/v1/trajectories/turns/calls/3/reward", json={"reward": 1.0}), 404, "call_not_found")
        assert_openai_error(c.post("/v1/trajectories/turns/calls/-4/reward", json={"reward": 1.0}), 404, "call_not_found")
        assert_openai_error(c.post("/v1/trajectories/nobody/calls/0/reward", json={"reward": 1.0}), 404, "trajectory_not_found")
        assert_openai_error(c.post("/v1/trajectories/turns/calls/0/reward", content=b'{"reward": 1e999}'), 400)
        assert_openai_error(c.post("/v1/trajectories/turns/calls/x/reward", json={"reward": 1.0}), 404)  # no such route
        c.post("/v1/trajectories/turns/reward", json={"reward": 1.0}).raise_for_status()  # closes the group (size 1)
        assert_openai_error(c.post("/v1/trajectories/turns/calls/0/reward", json={"reward": 1.0}), 409, "group_closed")
        t = c.get("/v1/trajectories/turns").json()
        assert [x["reward"] for x in t["calls"]] == [None, 0.25, -1.0] and t["reward"] == 1.0 and len(t["rewards"]) == 4
