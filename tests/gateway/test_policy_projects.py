"""Policies owned by projects: a key calls, sees and trains only the policies its project may use.

A policy belongs to one project, or is shared by an admin with named others, or (made with
no project, as every policy made before projects owned them) by every project. Another
project's policy does not exist for a key: 404 ``model_not_found`` in the surface's own
format, pinned or not, from the real openai and anthropic clients; ``/v1/models`` leaves it
and its adapters out; and its groups do not train it. On SQLite and PostgreSQL, against the
deterministic upstream (the routing is the gateway's; vLLM plays no part in it).
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Gateway
from tests.gateway.test_access import bearer, make_key
from tests.upstream import Upstream

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def teams(make_gateway, database_url: str, upstream: Upstream) -> dict[str, Any]:
    gw = make_gateway(database_url)
    keys = {team: make_key(gw, name=team, project=f"team-{team}", scopes=["call", "read"]) for team in "ab"}
    gw.create_policy("agent", "m", project="team-a")
    gw.create_policy("common", "m")  # no project: every project's
    return {"gw": gw, "keys": keys}


def chat(gw: Gateway, key: str | None, model: str, trajectory: str = "t", group: str | None = None, **headers: str) -> httpx.Response:
    prefix = f"/g/{group}/t/{trajectory}" if group else f"/t/{trajectory}"
    with gw.client(headers={**bearer(key), **headers}) as c:
        return c.post(f"{prefix}/v1/chat/completions", json={"model": model, "messages": MESSAGES})


def test_another_projects_policy_does_not_exist_for_a_key(teams: dict[str, Any]) -> None:
    gw, keys = teams["gw"], teams["keys"]
    assert chat(gw, keys["a"], "agent").headers["x-policy-version"] == "agent@0"
    for model in ("agent", "agent@0", "agent@7"):
        r = chat(gw, keys["b"], model, trajectory=f"b-{model.replace('@', '-')}")
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["param"] == "model"
        assert "does not exist" in r.json()["error"]["message"]
    # Nothing of the refused calls is recorded.
    with gw.client(headers=bearer(keys["b"])) as c:
        assert c.get("/v1/trajectories/b-agent").status_code == 404
    # The clients people use raise their own not-found errors.
    with pytest.raises(openai.NotFoundError) as found:
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key=keys["b"], max_retries=0).chat.completions.create(model="agent", messages=MESSAGES)
    assert found.value.code == "model_not_found"
    with pytest.raises(anthropic.NotFoundError) as missing:
        anthropic.Anthropic(base_url=gw.url, api_key=keys["b"], max_retries=0).messages.create(model="agent", max_tokens=4, messages=MESSAGES)
    assert missing.value.body["error"]["type"] == "not_found_error"
    # A policy of no project is everyone's; the admin token calls any.
    assert chat(gw, keys["b"], "common").headers["x-policy-version"] == "common@0"
    assert chat(gw, None, "agent", authorization=f"Bearer {gw.settings.admin_token}").status_code == 200


def test_models_lists_only_what_the_key_may_call(teams: dict[str, Any], upstream: Upstream) -> None:
    gw, keys = teams["gw"], teams["keys"]
    upstream.models = ["m", "agent@3", "common@2"]  # vLLM lists each loaded adapter

    def listed(key: str) -> list[str]:
        with gw.client(headers=bearer(key)) as c:
            return [m["id"] for m in c.get("/v1/models").json()["data"]]

    assert {"agent", "common", "agent@3", "common@2"} <= set(listed(keys["a"]))
    seen_by_b = listed(keys["b"])
    assert "common" in seen_by_b and "common@2" in seen_by_b and "m" in seen_by_b
    assert "agent" not in seen_by_b and "agent@3" not in seen_by_b


def test_sharing_opens_a_policy_and_unsharing_stops_its_groups_training(teams: dict[str, Any]) -> None:
    gw, keys = teams["gw"], teams["keys"]
    admin = gw.admin()
    r = admin.patch("/admin/policies/agent", json={"shared_with": ["team-b", "team-b"]})
    assert r.status_code == 200 and (r.json()["project"], r.json()["shared_with"]) == ("team-a", ["team-b"])
    # Team B's group on the shared policy: called, rewarded, ready to train.
    for i, reward in enumerate((0.0, 1.0)):
        assert chat(gw, keys["b"], "agent", trajectory=f"b{i}", group="gb", **{"x-group-size": "2"}).status_code == 200
        with gw.client(headers=bearer(keys["b"])) as c:
            assert c.post(f"/v1/trajectories/b{i}/reward", json={"reward": reward}).status_code == 200
    assert gw.policy()["groups_ready"] == 1
    # Unshared: team B calls it no more, and its group waits, untrained.
    assert admin.patch("/admin/policies/agent", json={"shared_with": []}).json()["shared_with"] == []
    assert chat(gw, keys["b"], "agent", trajectory="b-after").status_code == 404
    assert gw.policy()["groups_ready"] == 0
    # Given to no project (null): every project's again, team B's group with it.
    assert admin.patch("/admin/policies/agent", json={"project": None}).json()["project"] is None
    assert gw.policy()["groups_ready"] == 1
    # A project's name is checked like a key's.
    assert admin.patch("/admin/policies/agent", json={"shared_with": ["a/b"]}).status_code == 400
