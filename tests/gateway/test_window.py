"""The served window, as each client understands it, against a real vLLM (the tiny model,
served with a 2,048-token window as ``burnish up`` serves it).

A prompt past the window gets the protocol's own error, with the prompt's tokens as vLLM
counts them: ``context_length_exceeded`` on chat completions and the Responses API (what the
Codex CLI reads), "prompt is too long: N tokens > M maximum" on Messages (what Claude Code reads).
A ``max_tokens`` past the window is lowered to it and served, and the recorded call says so.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest

from burnish_server.serving.process import VLLMServer
from tests.conftest import Gateway
from tests.gateway.test_translated import anthropic_client, openai_client

WINDOW = 2048  # tests/conftest.py: tiny_vllm
LONG = "the quick brown fox jumps over the lazy dog " * 400  # far past 2,048 tokens


@pytest.fixture
def gw(make_gateway, vllm: VLLMServer) -> Gateway:
    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    gw.create_policy("agent", "tiny")
    return gw


def counted(message: str) -> tuple[int, int]:
    """The prompt's tokens and the window, as an error message names them."""
    if found := re.search(r"(\d+) tokens > (\d+) maximum", message):
        return int(found[1]), int(found[2])
    found = re.search(r"context length is (\d+) tokens\. However, your messages resulted in (\d+)", message)
    assert found, message
    return int(found[2]), int(found[1])


def test_a_prompt_past_the_window_gets_each_protocols_own_error(gw: Gateway) -> None:
    client = openai_client(gw, "long-chat")
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model="agent", messages=[{"role": "user", "content": LONG}], max_tokens=8)
    assert chat.value.code == "context_length_exceeded"
    prompt, window = counted(chat.value.message)
    assert window == WINDOW and prompt > WINDOW + 100  # counted whole, not "at least 2049"

    with pytest.raises(openai.BadRequestError) as responses:
        openai_client(gw, "long-resp").responses.create(model="agent", input=LONG, stream=True)
    assert responses.value.code == "context_length_exceeded"

    with pytest.raises(anthropic.BadRequestError) as messages:
        # Claude Code's budget, refused first, then lowered: the prompt is refused on the resend.
        anthropic_client(gw, "long-msg").messages.create(model="agent", max_tokens=32000, messages=[{"role": "user", "content": LONG}], stream=True)
    assert messages.value.body["error"]["type"] == "invalid_request_error"
    assert messages.value.body["error"]["message"].startswith("prompt is too long: ")
    assert counted(messages.value.body["error"]["message"])[1] == WINDOW

    for trajectory in ("long-chat", "long-resp", "long-msg"):  # each refused call recorded as such
        (call,) = gw.trajectory(trajectory)["calls"]
        assert call["status"] == "upstream_error" and call["http_status"] == 400 and ("too long" in call["error"] or "context length" in call["error"])


def test_max_tokens_past_the_window_is_lowered_and_said(gw: Gateway) -> None:
    """Claude Code asks 32,000 tokens of every call: served with what the window leaves, the
    first call after a refusal vLLM makes, the later ones lowered before they go."""
    client = anthropic_client(gw, "budget")
    for _ in range(2):
        with client.messages.stream(model="agent", max_tokens=32000, messages=[{"role": "user", "content": "hi"}]) as stream:
            assert stream.get_final_message().content
    calls = gw.trajectory("budget")["calls"]
    assert [c["adjustments"] for c in calls] == [{"max_tokens_asked": 32000, "max_tokens_sent": WINDOW}] * 2
    assert all(c["status"] == "ok" and c["tokens"]["completion_token_ids"] for c in calls)

    chat = openai_client(gw, "budget-chat").chat.completions.create(
        model="agent", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=10_000, temperature=0
    )
    assert chat.choices[0].message is not None
    assert gw.trajectory("budget-chat")["calls"][0]["adjustments"] == {"max_tokens_asked": 10_000, "max_tokens_sent": WINDOW}


def test_window_refusals_under_concurrent_lora_traffic(gw: Gateway) -> None:
    """What the window's handling sends vLLM (a resend, /tokenize) beside a batch of other
    calls: every call answered as it should be, and vLLM still serving afterwards."""

    def short(i: int) -> str:
        return openai_client(gw, f"busy-{i}").chat.completions.create(model="agent", messages=[{"role": "user", "content": f"n {i}"}], max_tokens=16).id

    def long(i: int) -> str | None:
        try:
            openai_client(gw, f"busy-long-{i}").chat.completions.create(model="agent", messages=[{"role": "user", "content": LONG}], max_tokens=16)
        except openai.BadRequestError as exc:
            return exc.code
        return None

    with ThreadPoolExecutor(8) as pool:
        shorts = [pool.submit(short, i) for i in range(8)]
        longs = [pool.submit(long, i) for i in range(4)]
        assert all(f.result() for f in shorts)
        assert [f.result() for f in longs] == ["context_length_exceeded"] * 4
    assert short(99)
