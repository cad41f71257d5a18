"""When the upstream or the client misbehaves: clear errors, retries only before the first byte, every call recorded."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from tests.conftest import Gateway
from tests.servers import free_port
from tests.upstream import Upstream, choice_text, words

MESSAGES = [{"role": "user", "content": "tell me"}]


def fault(kind: str) -> dict[str, str]:
    return {"x-fault": kind}


def test_refused_connection_is_503_with_retry_after_and_recorded(make_gateway, upstream: Upstream) -> None:
    """vLLM down (nothing listens): the answer every client's retry logic waits on."""
    gw = make_gateway(upstream=f"http://127.0.0.1:{free_port()}")
    r = httpx.post(gw.url + "/t/refused/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert r.json()["error"]["code"] == "upstream_unavailable" and r.json()["error"]["type"] == "api_error"
    assert r.headers["x-trajectory-id"] == "refused"
    (call,) = gw.trajectory("refused")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 503
    assert call["attempts"] == gw.settings.upstream_attempts and "could not reach" in call["error"]


def test_503_then_200_is_retried_and_recorded_once(gateway: Gateway, upstream: Upstream) -> None:
    key = uuid.uuid4().hex
    client = openai.OpenAI(base_url=gateway.url + "/t/retry/v1", api_key="k", max_retries=0, default_headers=fault(f"503-once:{key}"))
    got = client.chat.completions.create(model="tiny", messages=MESSAGES)
    assert got.choices[0].message.content == choice_text({"messages": MESSAGES}, 0)
    assert upstream.fault_hits[key] == 2
    (call,) = gateway.trajectory("retry")["calls"]
    assert call["status"] == "ok" and call["attempts"] == 2


def test_streamed_request_is_retried_before_the_first_byte(gateway: Gateway, upstream: Upstream) -> None:
    key = uuid.uuid4().hex
    client = openai.OpenAI(base_url=gateway.url + "/t/retry-s/v1", api_key="k", max_retries=0, default_headers=fault(f"503-once:{key}"))
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True) if c.choices)
    assert text == choice_text({"messages": MESSAGES}, 0)
    (call,) = gateway.trajectory("retry-s")["calls"]
    assert call["status"] == "ok" and call["attempts"] == 2


def test_persistent_503_is_relayed_after_the_last_attempt(gateway: Gateway, upstream: Upstream) -> None:
    before = len(upstream.requests)
    r = httpx.post(gateway.url + "/t/busy/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES}, headers=fault("status:503"))
    assert r.status_code == 503 and r.json()["error"]["message"] == "fault 503"
    assert len(upstream.requests) - before == gateway.settings.upstream_attempts
    (call,) = gateway.trajectory("busy")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 503 and call["attempts"] == 3


def test_upstream_4xx_is_relayed_as_is_and_not_retried(gateway: Gateway, upstream: Upstream) -> None:
    before = len(upstream.requests)
    r = httpx.post(gateway.url + "/t/bad/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES}, headers=fault("status:400"))
    assert r.status_code == 400 and r.json() == {"error": {"message": "fault 400", "type": "server_error", "code": 400}}
    assert len(upstream.requests) - before == 1
    assert gateway.trajectory("bad")["calls"][0]["error"] == "fault 400"


def test_non_json_upstream_error_becomes_an_openai_error(gateway: Gateway) -> None:
    r = httpx.post(gateway.url + "/t/html/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES}, headers=fault("html:500"))
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["code"] == "upstream_error" and "bad gateway" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_stall_past_the_timeout_is_504_and_recorded(make_gateway, upstream: Upstream, stream: bool) -> None:
    gw = make_gateway(upstream_timeout=0.3)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/t/stall/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": stream}, headers=fault("stall:2"))
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - t0 < 1.5  # a read time-out is not retried
    (call,) = gw.trajectory("stall")["calls"]
    assert call["status"] == "upstream_error" and call["http_status"] == 504


def test_stream_cut_midway_reaches_the_client_as_an_error_and_is_recorded(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/t/cut/v1", api_key="k", default_headers=fault("cut:4"))
    pieces = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True):
            pieces.append(chunk.choices[0].delta.content or "")
    text = choice_text({"messages": MESSAGES}, 0)
    assert "".join(pieces) == "".join(words(text)[:3])  # event 0 is the role, then three words
    (call,) = gateway.trajectory("cut")["calls"]
    assert call["status"] == "upstream_cut"
    assert call["response"]["choices"][0]["message"]["content"] == "".join(words(text)[:3])


def test_client_disconnect_midway_is_recorded(gateway: Gateway) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "stream": True}
    with httpx.Client() as c, c.stream("POST", gateway.url + "/t/gone/v1/chat/completions", json=body, headers=fault("slow:0.5")) as r:
        first = next(r.iter_raw())
        assert first.startswith(b"data: ")
    # The gateway notices the closed socket and records what it had, without waiting for the rest.
    deadline = time.monotonic() + 10
    while True:
        listing = httpx.get(gateway.url + "/v1/trajectories/gone")
        if listing.status_code == 200:
            break
        assert time.monotonic() < deadline, "disconnected call never recorded"
        time.sleep(0.05)
    (call,) = listing.json()["calls"]
    assert call["status"] == "client_disconnected"
    # Recorded at the disconnect, not after the ~3.5 s the whole slow stream would take.
    assert call["upstream_ms"] < 2500
    assert len(call["response"]["choices"][0]["message"]["content"] or "") < len(choice_text({"messages": MESSAGES}, 0))
