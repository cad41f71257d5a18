"""The admin API against a real gateway (deterministic upstream): auth, policy CRUD, controls, errors.

Training through these controls, with a real trainer and vLLM, is in tests/trainer/test_admin_training.py.
"""

from __future__ import annotations

import time

import httpx
import msgspec
import pytest

from burnish_server.core.learning.policies import LoraSettings, TrainSettings
from burnish_server.gateway.policies.routing import REFRESH_EVERY_S
from tests.conftest import ADMIN_TOKEN, Gateway
from tests.upstream import Upstream


def error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["code"] == code and body["message"], body
    return body


@pytest.fixture
def gw(make_gateway, upstream: Upstream, database_url: str) -> Gateway:
    return make_gateway(database_url)


def test_every_route_needs_the_token(gw: Gateway) -> None:
    routes = [
        ("GET", "/admin/policies"), ("POST", "/admin/policies"), ("GET", "/admin/policies/agent"), ("PATCH", "/admin/policies/agent"),
        ("POST", "/admin/policies/agent/pause"), ("POST", "/admin/policies/agent/resume"), ("POST", "/admin/policies/agent/train"),
        ("GET", "/admin/policies/agent/checkpoints"), ("POST", "/admin/policies/agent/rollback"), ("GET", "/admin/policies/agent/metrics"),
    ]  # fmt: skip
    with gw.client() as c:
        for method, path in routes:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": ADMIN_TOKEN}, {"authorization": f"Basic {ADMIN_TOKEN}"}):
                r = c.request(method, path, headers=headers, json={})
                error(r, 401, "invalid_admin_token")
                assert r.headers["www-authenticate"] == "Bearer"
    with gw.admin() as c:
        assert c.get("/admin/policies").json() == {"object": "list", "data": []}


def test_no_token_configured_closes_the_admin_api(make_gateway, upstream: Upstream) -> None:
    gw = make_gateway(admin_token="")
    with gw.client() as c:
        error(c.get("/admin/policies"), 401, "admin_disabled")
        error(c.get("/admin/policies", headers={"authorization": "Bearer x"}), 401, "admin_disabled")


def test_create_list_inspect_and_change_a_policy(gw: Gateway) -> None:
    created = gw.create_policy("agent", "tiny", model_path="/models/tiny", lora={"rank": 8}, train={"learning_rate": 5e-3})
    assert created["object"] == "policy" and created["served_version"] == "agent@0" and created["pending_version"] is None
    assert created["lora"] == {**_defaults(LoraSettings), "rank": 8}
    assert created["train"] == {**_defaults(TrainSettings), "learning_rate": 5e-3}
    assert (created["step"], created["head"], created["paused"], created["groups_ready"], created["last_step"]) == (0, 0, False, 0, None)
    gw.create_policy("second", "tiny")
    with gw.admin() as c:
        assert [p["name"] for p in c.get("/admin/policies").json()["data"]] == ["agent", "second"]
        # PATCH merges: only kl_coef changes in train, the learning rate stays.
        changed = c.patch("/admin/policies/agent", json={"train": {"kl_coef": 0.05}, "lora": {"alpha": 8}}).json()
        assert changed["train"]["kl_coef"] == 0.05 and changed["train"]["learning_rate"] == 5e-3
        assert changed["lora"]["alpha"] == 8 and changed["lora"]["rank"] == 8
        assert changed["ruler"] == {"auto": False, "rubric": None, "judge_model": None, "judge_base_url": None, "combine": "set", "next_message": False}
        ruled = c.patch("/admin/policies/agent", json={"ruler": {"auto": True, "combine": "add"}}).json()["ruler"]
        assert (ruled["auto"], ruled["combine"], ruled["rubric"]) == (True, "add", None)
        assert c.post("/admin/policies/agent/pause").json()["paused"] is True
        assert c.get("/admin/policies/agent").json()["paused"] is True
        assert c.post("/admin/policies/agent/resume").json()["paused"] is False
        assert c.get("/admin/policies/agent/checkpoints").json() == {"object": "list", "data": []}
        assert c.get("/admin/policies/agent/metrics").json() == {"object": "list", "data": []}
        # Step 0 (the base model) is always there to roll back to.
        back = c.post("/admin/policies/agent/rollback", json={"step": 0})
        assert back.status_code == 202 and back.json()["pending_version"] is None


def _defaults(kind: type) -> dict:
    """The struct's defaults as they come back in JSON."""
    return msgspec.json.decode(msgspec.json.encode(kind()))


def test_a_new_policy_is_routed_at_once(gw: Gateway, upstream: Upstream) -> None:
    with gw.client() as c:
        before = c.post("/t/before/v1/chat/completions", json={"model": "fresh", "messages": [{"role": "user", "content": "x"}]})
        assert before.headers["x-policy-version"] == "fresh"  # no such policy: passed through
        gw.create_policy("fresh", "tiny")
        after = c.post("/t/after/v1/chat/completions", json={"model": "fresh", "messages": [{"role": "user", "content": "x"}]})
        assert after.headers["x-policy-version"] == "fresh@0"
        assert [m["id"] for m in c.get("/v1/models").json()["data"]][:1] == ["fresh"]


def test_other_gateways_follow_the_store(make_gateway, upstream: Upstream, database_url: str) -> None:
    """A policy created on one gateway is routed by another on the same store within the refresh period."""
    first, second = make_gateway(database_url), make_gateway(database_url)
    first.create_policy("shared", "tiny")
    time.sleep(REFRESH_EVERY_S * 2 + 0.1)
    with second.client() as c:
        r = c.post("/t/shared-1/v1/chat/completions", json={"model": "shared", "messages": [{"role": "user", "content": "x"}]})
    assert r.headers["x-policy-version"] == "shared@0"


def test_bad_requests_get_clear_errors_and_change_nothing(gw: Gateway) -> None:
    gw.create_policy("agent", "tiny")
    before = gw.policy()
    with gw.admin() as c:
        error(c.post("/admin/policies", json={"name": "agent", "base_model": "tiny"}), 409, "policy_exists")
        error(c.post("/admin/policies", json={"name": "a@1", "base_model": "tiny"}), 400, "invalid_id")
        error(c.post("/admin/policies", json={"name": "x"}), 400, "invalid_policy")
        error(c.post("/admin/policies", json={"name": "x", "base_model": ""}), 400, "invalid_policy")
        error(c.post("/admin/policies", json={"name": "x", "base_model": "t", "colour": 1}), 400, "invalid_policy")
        error(c.post("/admin/policies", content=b"{not json", headers={"content-type": "application/json"}), 400, "invalid_json")
        body = error(c.post("/admin/policies", json={"name": "x", "base_model": "t", "train": {"learning_rate": -1}}), 400, "invalid_policy")
        assert "learning_rate" in body["message"]
        error(c.patch("/admin/policies/agent", json={"train": {"groups_per_step": 0}}), 400, "invalid_train")
        error(c.patch("/admin/policies/agent", json={"lora": {"rnak": 4}}), 400, "invalid_lora")
        error(c.patch("/admin/policies/agent", json={"ruler": {"combine": "multiply"}}), 400, "invalid_ruler")
        error(c.patch("/admin/policies/agent", json={"name": "renamed"}), 400, "invalid_policy")
        error(c.get("/admin/policies/nobody"), 404, "policy_not_found")
        error(c.patch("/admin/policies/nobody", json={}), 404, "policy_not_found")
        error(c.post("/admin/policies/nobody/pause"), 404, "policy_not_found")
        error(c.post("/admin/policies/agent/train"), 409, "no_ready_groups")
        error(c.post("/admin/policies/agent/rollback", json={"step": 3}), 404, "checkpoint_not_found")
        error(c.post("/admin/policies/agent/rollback", json={"step": -1}), 400, "invalid_rollback")
        error(c.post("/admin/policies/agent/rollback", json={}), 400, "invalid_rollback")
        error(c.get("/admin/policies/bad%20name"), 400, "invalid_id")
        # A trailing newline is no part of an id (Python's `$` alone would let it through).
        error(c.post("/admin/policies", json={"name": "x\n", "base_model": "tiny"}), 400, "invalid_id")
        error(c.get("/admin/policies/agent%0A"), 400, "invalid_id")
        c.post("/admin/policies/agent/pause")
        error(c.post("/admin/policies/agent/train"), 409, "policy_paused")
        c.post("/admin/policies/agent/resume")
    after = gw.policy()
    assert {k: v for k, v in after.items() if k != "updated_at"} == {k: v for k, v in before.items() if k != "updated_at"}


def test_concurrent_patches_of_different_keys_all_stand(make_gateway, upstream: Upstream, database_url: str) -> None:
    """Each PATCH merges into the stored settings under the row's lock: none is lost, even
    with the PATCHes spread over two gateways (one gateway's writes are serial anyway)."""
    import asyncio

    gw, other = make_gateway(database_url), make_gateway(database_url)
    gw.create_policy("agent", "tiny")
    changes = {"learning_rate": 0.002, "weight_decay": 0.01, "grad_clip": 0.5, "kl_coef": 0.03, "clip_eps_low": 0.1,
               "clip_eps_high": 0.3, "advantage_eps": 0.001, "groups_per_step": 5, "max_seq_len": 2048, "micro_batch_tokens": 1024}  # fmt: skip

    async def patch_all() -> None:
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
            urls = [gw.url, other.url]
            answers = await asyncio.gather(
                *(c.patch(f"{urls[n % 2]}/admin/policies/agent", json={"train": {k: v}}) for n, (k, v) in enumerate(changes.items()))
            )
        assert all(r.status_code == 200 for r in answers)

    asyncio.run(patch_all())
    train = gw.policy()["train"]
    assert {k: train[k] for k in changes} == changes


def test_settings_that_can_never_decide_are_refused_with_the_smallest_value_that_works(make_gateway, upstream: Upstream) -> None:
    """A rollback window under min_trajectories never rolls back; max_trajectories under it
    rejects every candidate untested; a LoRA rank above vLLM's --max-lora-rank is never served.
    Each is a 400 naming the fields and the value that works, and nothing is stored."""
    gw = make_gateway(max_lora_rank=16)
    admin = gw.admin()

    def refused(r: httpx.Response, *phrases: str) -> None:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "conflicting_settings" and all(p in error["message"] for p in phrases), error

    body = {"name": "p", "base_model": "tiny"}
    refused(
        admin.post("/admin/policies", json={**body, "promotion": {"rule": "manual", "rollback": True, "rollback_window": 24}}),
        "promotion.rollback_window (24) is below promotion.min_trajectories (30)",
        "set rollback_window to at least 30",
    )
    refused(admin.post("/admin/policies", json={**body, "promotion": {"max_trajectories": 10}}), "max_trajectories (10)", "at least 30")
    refused(admin.post("/admin/policies", json={**body, "lora": {"rank": 32}}), "lora.rank (32) is above", "--max-lora-rank 32")
    assert admin.get("/admin/policies/p").status_code == 404  # nothing was stored
    # Under the immediate rule nothing rolls back: a small window is no conflict there ...
    assert admin.post("/admin/policies", json={**body, "promotion": {"rollback_window": 24}, "lora": {"rank": 16}}).status_code == 201
    # ... until a change makes it one: the merged settings are checked, and nothing changes.
    refused(admin.patch("/admin/policies/p", json={"promotion": {"rule": "canary"}}), "rollback_window (24)")
    refused(admin.patch("/admin/policies/p", json={"promotion": {"min_trajectories": 200, "rule": "eval"}}), "min_trajectories (200)")
    assert admin.get("/admin/policies/p").json()["promotion"]["rule"] == "immediate"
    # The smallest values allowed are allowed.
    assert admin.patch("/admin/policies/p", json={"promotion": {"rule": "canary", "rollback_window": 30, "max_trajectories": 30}}).status_code == 200


def test_a_policy_stored_with_conflicting_settings_warns_in_its_status(gw: Gateway) -> None:
    """Made before the check: it still loads and serves, and says what is wrong in its status,
    the dashboard and burnish status."""
    import asyncio
    import subprocess
    import sys

    from burnish_server.core.learning.policies import Policy, PromotionSettings
    from burnish_server.store.database import Database
    from burnish_server.store.policies import create_policy

    async def store_it() -> None:
        db = Database(gw.settings.resolved_database_url)
        await db.transaction(create_policy, Policy(name="old", base_model="tiny", promotion=PromotionSettings(rule="manual", rollback_window=24)))
        await db.dispose()

    asyncio.run(store_it())
    warnings = gw.policy("old")["settings_warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("promotion.rollback_window (24) is below promotion.min_trajectories (30)")
    time.sleep(REFRESH_EVERY_S * 2 + 0.1)  # the gateway's routing table learns of it
    with gw.admin() as c:
        assert "rollback_window (24) is below" in c.get("/ui/policies/old").text
    out = subprocess.run([sys.executable, "-m", "burnish_server.cli", "status", "old", "--url", gw.url, "--token", ADMIN_TOKEN], capture_output=True, text=True)
    assert out.returncode == 0 and "  settings: promotion.rollback_window (24) is below" in out.stdout, out.stderr
