"""Sampling paused for a step (trainer/turns.py), on a real vLLM started as burnish up starts it:
calls wait and none is dropped, the cap resumes a long step's sampling, a trainer's start
resumes what a killed one left paused, and a vLLM that cannot pause is said once."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from burnish_server.core.platform.settings import Settings
from burnish_server.serving.adapters import VLLMAdapters
from burnish_server.serving.fleet import Fleet
from burnish_server.serving.process import VLLMServer
from burnish_server.trainer.turns import Turns

TOKENS = 24


def sample(url: str) -> httpx.Response:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": TOKENS, "ignore_eos": True, "temperature": 1.0}
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


@pytest.fixture
def fleet(vllm: VLLMServer):
    fleet = Fleet(Settings(upstream=vllm.url))
    yield fleet
    fleet.close()


def test_calls_wait_out_a_step_and_none_is_dropped(vllm: VLLMServer, fleet: Fleet) -> None:
    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(sample, vllm.url) for _ in range(4)]  # in flight as the step begins
        time.sleep(0.2)
        with Turns(fleet, pause_s=30).paused():
            arriving = [pool.submit(sample, vllm.url) for _ in range(4)]
            time.sleep(2.0)
            assert not any(f.done() for f in arriving), "answered while sampling was paused"
            paused_at = time.monotonic()
        answers = [f.result(timeout=120) for f in running + arriving]
    assert time.monotonic() - paused_at < 60
    assert [a.status_code for a in answers] == [200] * 8
    assert all(a.json()["usage"]["completion_tokens"] == TOKENS for a in answers), "a paused request lost its tokens"


def test_a_step_longer_than_the_cap_samples_beside_it(vllm: VLLMServer, fleet: Fleet) -> None:
    with ThreadPoolExecutor(2) as pool, Turns(fleet, pause_s=1.0).paused():
        call = pool.submit(sample, vllm.url)
        answer = call.result(timeout=60)  # inside the step: answered once the cap resumed sampling
    assert answer.status_code == 200


def test_a_trainers_start_resumes_what_a_killed_one_left_paused(vllm: VLLMServer, fleet: Fleet) -> None:
    VLLMAdapters(vllm.url).pause()  # a trainer killed mid-step
    Turns(fleet, pause_s=30).release()
    assert sample(vllm.url).status_code == 200


def test_a_vllm_that_cannot_pause_is_said_once_and_steps_go_on(caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet(Settings(upstream="http://127.0.0.1:9"))  # nothing listens: refused
    turns = Turns(fleet, pause_s=30)
    with caplog.at_level(logging.WARNING, logger="burnish.trainer"):
        for _ in range(3):
            with turns.paused():
                pass
    said = [r.getMessage() for r in caplog.records if "sampling on" in r.getMessage()]
    assert len(said) == 1 and "could not pause sampling on http://127.0.0.1:9" in said[0]
    fleet.close()
