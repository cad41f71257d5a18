"""Policies against the deterministic upstream: routing, token-id injection, and scrubbing."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from burnish_server.core.learning.policies import Policy
from burnish_server.gateway.policies.routing import Registry
from tests.conftest import Gateway, set_served_step
from tests.upstream import Upstream, choice_text, token_ids

MESSAGES = [{"role": "user", "content": "policy please"}]


@pytest.fixture
def policy_gateway(make_gateway, upstream: Upstream) -> Gateway:
    gw = make_gateway()
    gw.create_policy("agent", "tiny")
    set_served_step(gw, 2)
    return gw


def test_registry_routes_current_and_pinned_steps() -> None:
    reg = Registry([Policy(name="agent", base_model="base-model", step=3)])
    assert reg.resolve("agent").upstream_model == "agent@3"
    assert reg.resolve("agent@0").upstream_model == "base-model"
    assert reg.resolve("agent@7").version == "agent@7"
    assert reg.resolve("other") is None and reg.resolve("agent@x") is None and reg.resolve(None) is None


@pytest.mark.parametrize("stream", [False, True])
def test_policy_call_is_routed_injected_and_scrubbed(policy_gateway: Gateway, upstream: Upstream, stream: bool) -> None:
    client = openai.OpenAI(base_url=policy_gateway.url + f"/t/pol-{stream}/v1", api_key="k")
    raw = client.chat.completions.with_raw_response.create(model="agent", messages=MESSAGES, stream=stream)
    assert raw.headers["x-policy-version"] == "agent@2"
    result = raw.parse()
    if stream:
        chunks = list(result)
        assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        dumped = [c.model_dump() for c in chunks]
        assert all(d.get("prompt_token_ids") is None for d in dumped)
        assert all(ch.get("token_ids") is None for d in dumped for ch in d["choices"])
    else:
        text = result.choices[0].message.content
        assert result.choices[0].logprobs is None
        assert result.model_dump().get("prompt_token_ids") is None
        assert result.choices[0].model_dump().get("token_ids") is None
    assert text == choice_text({"messages": MESSAGES}, 0)

    sent = json.loads(upstream.requests[-1]["body"])
    assert sent["model"] == "agent@2" and sent["return_token_ids"] is True and sent["logprobs"] is True

    call = policy_gateway.trajectory(f"pol-{stream}")["calls"][0]
    assert (call["model"], call["request"]["model"]) == ("agent", "agent")  # what the client sent
    assert call["tokens"]["completion_token_ids"] == [token_ids(text)]
    assert call["response"]["choices"][0].get("token_ids") is None  # stored packed, not as JSON
    assert call["response"]["choices"][0]["logprobs"] is None


def test_what_the_client_asked_for_is_left_in(policy_gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=policy_gateway.url + "/t/asked/v1", api_key="k")
    result = client.chat.completions.create(model="agent@0", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True})
    assert result.choices[0].logprobs is not None and result.choices[0].logprobs.content
    assert result.model_dump()["choices"][0]["token_ids"] == token_ids(result.choices[0].message.content)


def test_pinned_step_zero_is_the_base_model_and_other_models_pass_through(policy_gateway: Gateway, upstream: Upstream) -> None:
    with policy_gateway.client() as c:
        r = c.post("/t/pin/v1/chat/completions", json={"model": "agent@0", "messages": MESSAGES})
        assert r.headers["x-policy-version"] == "agent@0"
        assert json.loads(upstream.requests[-1]["body"])["model"] == "tiny"
        body = b'{"model": "someone-else", "messages": [{"role": "user", "content": "x"}]}'
        r = c.post("/t/pass/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.headers["x-policy-version"] == "someone-else"
        assert upstream.requests[-1]["body"] == body  # untouched
        models = c.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["agent", "tiny"]
    calls = [policy_gateway.trajectory(t)["calls"][0] for t in ("pin", "pass")]
    assert [(c["policy"], c["policy_step"], c["upstream_model"]) for c in calls] == [("agent", 0, "tiny"), (None, None, "someone-else")]


def test_completions_policy_call_gets_sampled_logprobs(policy_gateway: Gateway, upstream: Upstream) -> None:
    r = httpx.post(policy_gateway.url + "/t/cpol/v1/completions", json={"model": "agent", "prompt": "hi"})
    assert r.status_code == 200 and r.json()["choices"][0].get("token_ids") is None
    sent = json.loads(upstream.requests[-1]["body"])
    assert sent["logprobs"] == 0 and sent["return_token_ids"] is True
