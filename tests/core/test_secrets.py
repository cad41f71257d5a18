"""The gateway's configured secrets never leave it: an upstream that quotes the key the gateway
sent it (as OpenAI's does on a 401) is relayed and recorded with the key masked, on every
surface, plain and streamed, and in the export."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from burnish_server.core.platform.secrets import MASK, Redactor
from tests.conftest import Gateway
from tests.upstream import Upstream

UPSTREAM_KEY = "sk-upstream-0123456789abcdef"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def test_the_redactor_masks_each_secret_in_its_raw_and_json_forms() -> None:
    redact = Redactor(["sk-0123456789", 'tok"en/with\\quotes', "short"])
    assert redact(b"Bearer sk-0123456789 refused") == b"Bearer " + MASK + b" refused"
    assert redact(b'{"message": "tok\\"en/with\\\\quotes"}') == b'{"message": "' + MASK + b'"}'
    assert redact.text("short stays") == "short stays"  # under MIN_SECRET_CHARS: not a secret worth garbling text for
    unchanged = b"nothing to see"
    assert redact(unchanged) is unchanged  # callers test identity to skip decoding again
    assert Redactor([]).text("sk-0123456789") == "sk-0123456789"


@pytest.fixture
def keyed_upstream(make_gateway: Callable[..., Gateway], upstream: Upstream) -> Gateway:
    gw = make_gateway(upstream_api_key=UPSTREAM_KEY)
    gw.create_policy("agent")
    return gw


@pytest.mark.parametrize(
    ("path", "body", "fault"),
    [
        ("/v1/chat/completions", CHAT, "echo-key"),
        ("/v1/chat/completions", CHAT, "echo-key:text"),
        ("/v1/chat/completions", {**CHAT, "stream": True}, "echo-key:stream"),
        ("/v1/chat/completions", {**CHAT, "model": "agent"}, "echo-key"),
        ("/v1/chat/completions", {**CHAT, "model": "agent", "stream": True}, "echo-key:stream"),
        ("/v1/messages", {**CHAT, "model": "agent", "max_tokens": 8}, "echo-key"),
        ("/v1/messages", {**CHAT, "model": "agent", "max_tokens": 8, "stream": True}, "echo-key:stream"),
        ("/v1/responses", {"model": "agent", "input": "hello"}, "echo-key"),
        ("/v1/responses", {"model": "m", "input": "hello"}, "echo-key"),
        ("/v1/messages", {**CHAT, "model": "agent", "max_tokens": 8}, "echo-key:late"),
        ("/v1/chat/completions", CHAT, "echo-key:late"),
    ],
)
def test_an_upstream_quoting_the_gateways_key_is_relayed_and_recorded_masked(keyed_upstream: Gateway, path: str, body: dict, fault: str) -> None:
    gw = keyed_upstream
    trajectory = f"t-{abs(hash((path, fault, str(body))))}"
    with gw.client(headers={"x-fault": fault, "x-trajectory-id": trajectory}) as c:
        answer = c.post(path, json=body)
        assert UPSTREAM_KEY[:12] not in answer.text, answer.text  # nor a part of it, where a message is cut
        assert "[redacted]" in answer.text, answer.text  # the message itself is kept
        assert "Traceback" not in answer.text
        recorded = c.get(f"/v1/trajectories/{trajectory}")
        exported = c.get("/v1/trajectories/export")
    assert recorded.status_code == 200 and recorded.json()["calls"], recorded.text
    assert UPSTREAM_KEY[:12] not in recorded.text and UPSTREAM_KEY[:12] not in exported.text


def test_the_models_listing_masks_an_upstreams_error(keyed_upstream: Gateway) -> None:
    with keyed_upstream.client(headers={"x-fault": "echo-key"}) as c:
        answer = c.get("/v1/models")
    assert answer.status_code == 401 and UPSTREAM_KEY not in answer.text and "[redacted]" in answer.text
