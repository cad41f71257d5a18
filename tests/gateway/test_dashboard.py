"""The dashboard (/ui) in a real browser: Debian's Chromium driven by Playwright, on data from a
real run through vLLM (the tiny model), the gateway, RULER's judge and the trainer.

One run is made per module (``run``): a policy under the ``manual`` promotion rule; four groups
of four multi-step trajectories (a forced tool call, its result, an answer; the Responses and
Messages surfaces too), rewarded over HTTP, one group scored by RULER, one call rewarded on its
own; held-out tasks answered by the base and, after one training step, by the candidate. Then
each page is opened as a user would, and what it shows is checked against the store.

Screenshots of each page go to ``$BURNISH_SCREENSHOTS`` when it is set (docs/dashboard.md's
come from there).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright import sync_api as playwright_sync
from playwright.sync_api import expect

from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.app import create_app
from burnish_server.serving.process import VLLMServer
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
from tests.conftest import ADMIN_TOKEN, PG_REQUIRED
from tests.e2e.test_clients import CHAT_FORCED, CHAT_TOOL, QUESTION_MESSAGES, TOOL_MAX
from tests.judge import Judge, scores
from tests.servers import ServerThread

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SIZE = 4
# tests/e2e/test_clients.py's forced call: a strict tool without arguments, and the prompt with which
# the random model (greedy) closes it within TOOL_MAX tokens. The grammar forces most of it.
TOOLS = [CHAT_TOOL]
TASKS = ["spell 12", "spell 7", "spell 40"]


@dataclass
class Run:
    url: str
    read_key: str
    groups: list[str]
    trajectories: list[str]


def _browser_or_skip() -> None:
    if not Path(CHROMIUM).exists():
        if PG_REQUIRED:
            pytest.fail("Debian's chromium is not installed; `make test` installs it")
        pytest.skip("chromium is not installed (make test installs it)")


async def _trajectory(c: httpx.AsyncClient, group: str, name: str, surface: str) -> None:
    """One multi-step trajectory: a forced tool call, the tool's result, then an answer; or one
    call on the Responses or Messages surface (translated to chat for the policy)."""
    prefix = f"/g/{group}/t/{name}/v1"
    headers = {"x-group-size": str(SIZE)}
    if surface == "responses":
        r = await c.post(f"{prefix}/responses", json={"model": "agent", "input": f"say {name}", "max_output_tokens": 8}, headers=headers)
        assert r.status_code == 200, r.text
        return
    if surface == "messages":
        r = await c.post(
            f"{prefix}/messages", json={"model": "agent", "max_tokens": 8, "messages": [{"role": "user", "content": f"say {name}"}]}, headers=headers
        )
        assert r.status_code == 200, r.text
        return
    messages: list[dict[str, Any]] = list(QUESTION_MESSAGES)
    body = {"model": "agent", "messages": messages, "tools": TOOLS, "tool_choice": CHAT_FORCED, "max_tokens": TOOL_MAX, "temperature": 0}
    r = await c.post(f"{prefix}/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message.get("tool_calls"), r.text
    call = message["tool_calls"][0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": f"{name} means {len(name)}"},
    ]
    r = await c.post(f"{prefix}/chat/completions", json={"model": "agent", "messages": messages, "tools": TOOLS, "max_tokens": 8}, headers=headers)
    assert r.status_code == 200, r.text


async def _make_run(url: str, settings: Settings, judge: Judge) -> Run:
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=admin) as c:
        groups, trajectories = ["ga", "gb", "gc", "gd"], []
        for g, group in enumerate(groups):
            for i in range(SIZE):
                name = f"{group}-{i}"
                trajectories.append(name)
                await _trajectory(c, group, name, "responses" if (g, i) == (1, 0) else "messages" if (g, i) == (1, 1) else "chat")
                if name == "ga-3":  # a reward for one call alone (credit per turn), before the group closes
                    assert (await c.post("/v1/trajectories/ga-3/calls/0/reward", json={"reward": 0.5})).status_code == 200
                if group != "gd":
                    assert (
                        await c.post(f"/v1/trajectories/{name}/reward", json={"reward": float(i), "components": {"correct": float(i > 1)}})
                    ).status_code == 200
        # RULER's verdict for the last group.
        judge.script = [scores({f"gd-{i}": i / 4 for i in range(SIZE)})]
        r = await c.post("/v1/groups/gd/ruler")
        assert r.status_code == 200, r.text
        # Held-out tasks, answered by the base.
        for k, task in enumerate(TASKS):
            r = await c.post(f"/eval/t/base-{k}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": task}], "max_tokens": 6})
            assert r.status_code == 200, r.text
            await c.post(f"/v1/trajectories/base-{k}/reward", json={"reward": 0.25 * k})
        worker = TrainerWorker(settings, WorkerSettings(worker_id="dashboard-test"))
        await worker.recover()
        assert await worker.run_once()
        # The step is a candidate (manual): the same tasks, asked of it by its pinned name.
        for k, task in enumerate(TASKS):
            r = await c.post(
                f"/eval/t/cand-{k}/v1/chat/completions", json={"model": "agent@1", "messages": [{"role": "user", "content": task}], "max_tokens": 6}
            )
            assert r.status_code == 200, r.text
            await c.post(f"/v1/trajectories/cand-{k}/reward", json={"reward": 0.5 + 0.25 * k})
        worker.held.stop()
        # A key that may read, not administer: the gateway is closed from here on.
        r = await c.post("/admin/keys", json={"name": "viewer", "scopes": ["read"]})
        assert r.status_code == 201, r.text
        return Run(url, r.json()["secret"], groups, trajectories)


@pytest.fixture(scope="module")
def run(vllm: VLLMServer, tiny_model: Path, judge_server: tuple[Judge, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    _browser_or_skip()
    data = tmp_path_factory.mktemp("dashboard")
    settings = Settings.load(
        {}, upstream=vllm.url, data_dir=str(data), admin_token=ADMIN_TOKEN, upstream_timeout=120, judge_base_url=judge_server[1], judge_model="judge-1"
    )
    server = ServerThread(create_app(settings)).start()
    try:
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
            r = c.post(
                "/admin/policies",
                json={
                    "name": "agent",
                    "base_model": "tiny",
                    "model_path": str(tiny_model),
                    "lora": {"rank": 8, "alpha": 16},
                    "train": {"learning_rate": 5e-3, "groups_per_step": 4},
                    "promotion": {"rule": "manual"},
                },
            )
            assert r.status_code == 201, r.text
        yield asyncio.run(_make_run(server.url, settings, judge_server[0]))
        for step in (1,):
            httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": f"agent@{step}"})
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(run: Run) -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _signed_in(browser: Any, run: Run, token: str) -> Any:
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    page.goto(run.url + "/ui")
    expect(page).to_have_url(re.compile(r"/ui/login"))  # the gateway has keys now: sign in first
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui$"))
    return page


def _shot(page: Any, name: str) -> None:
    if folder := os.environ.get("BURNISH_SCREENSHOTS"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def test_each_page_shows_the_run(browser: Any, run: Run) -> None:
    page = _signed_in(browser, run, ADMIN_TOKEN)
    row = page.locator("#policies tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("agent@0")  # the base serves; step 1 is the candidate
    expect(row).to_contain_text("agent@1")
    _shot(page, "policies")

    page.click("text=agent >> nth=0")
    expect(page.locator("#served")).to_have_text("agent@0")
    expect(page.locator("svg.chart")).to_have_count(2)
    expect(page.locator("svg.chart").first.locator("circle")).not_to_have_count(0)  # train reward and held-out points
    steps = page.locator("#steps tbody tr")
    expect(steps).to_have_count(1)
    expect(steps.first).to_contain_text("0.750")  # step 1's held-out score: (0.5 + 0.75 + 1.0) / 3
    expect(page.locator("#controls")).to_contain_text("Reject agent@1")
    _shot(page, "policy")

    page.goto(run.url + "/ui/groups")
    expect(page.locator("#groups tbody tr")).to_have_count(4)
    expect(page.locator("#groups tbody tr", has_text="gd")).to_contain_text("trained")
    _shot(page, "groups")

    page.goto(run.url + "/ui/trajectories")
    expect(page.locator("#trajectories tbody tr")).to_have_count(4 * SIZE + 2 * len(TASKS))
    _shot(page, "trajectories")

    page.goto(run.url + "/ui/policies/agent/compare?a=0&b=1")
    rows = page.locator("#compare tbody tr")
    expect(rows).to_have_count(len(TASKS))
    expect(page.locator("#scores")).to_contain_text("0.250")  # the base: (0 + 0.25 + 0.5) / 3
    expect(page.locator("#scores")).to_contain_text("0.750")
    _shot(page, "compare")


def test_filters_narrow_the_lists_in_the_store(browser: Any, run: Run) -> None:
    page = _signed_in(browser, run, ADMIN_TOKEN)
    page.goto(run.url + "/ui/trajectories")
    page.select_option("select[name=eval]", "true")
    page.click("form.filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"eval=true"))
    expect(page.locator("#trajectories tbody tr")).to_have_count(2 * len(TASKS))
    # The candidate's answers only: version 1 of the policy.
    page.select_option("select[name=policy]", "agent")
    page.fill("input[name=version]", "1")
    page.click("form.filters button[type=submit]")
    expect(page.locator("#trajectories tbody tr")).to_have_count(len(TASKS))
    expect(page.locator("#trajectories tbody")).to_contain_text("cand-0")
    # Rewards at least 2: members 2 and 3 of the groups rewarded over HTTP, none held out.
    page.goto(run.url + "/ui/trajectories?reward_min=2&eval=false")
    expect(page.locator("#trajectories tbody tr")).to_have_count(2 * 3)
    page.goto(run.url + "/ui/groups?state=trained")
    expect(page.locator("#groups tbody tr")).to_have_count(4)
    page.goto(run.url + "/ui/groups?state=open")
    expect(page.locator("#groups tbody")).to_have_text("No group matches.")
    # A filter that does not parse is a page that says so, not an error.
    page.goto(run.url + "/ui/trajectories?reward_min=lots")
    expect(page.locator("p.error")).to_contain_text("reward_min")


def test_a_trajectory_shows_its_turns_tokens_mask_and_advantage(browser: Any, run: Run) -> None:
    page = _signed_in(browser, run, ADMIN_TOKEN)
    page.goto(run.url + "/ui/trajectories/ga-3")
    calls = page.locator("article.call")
    expect(calls).to_have_count(2)
    first, second = calls.nth(0), calls.nth(1)
    expect(first.locator(".toolcall")).to_contain_text("calculator")  # the forced tool call
    expect(second.locator(".msg.role-tool")).to_contain_text("ga-3 means 4")  # its result, as the next call sent it
    # Merged with the first call, or split and why: as the trainer read it (the API says which).
    recorded = httpx.get(run.url + "/v1/trajectories/ga-3", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()["calls"][1]
    expect(second.locator(".merge")).to_contain_text(
        "merged" if recorded["extends_previous"] else f"split: a new sequence starts here ({recorded['split_reason']})"
    )
    expect(first.locator(".train-state")).to_contain_text("trained in step 1")
    # Rewards 0..3 in the group: member 3's advantage is (3 - 1.5) / std; its first call adds its own 0.5.
    expect(second.locator(".advantage")).to_have_text("+1.162")
    expect(first.locator(".advantage")).to_have_text("+1.662")
    # The tokens: the tool call was forced by the grammar (not trained); the answer was sampled (trained).
    expect(first.locator(".tok.context")).not_to_have_count(0)
    expect(second.locator(".tok.trained")).not_to_have_count(0)
    expect(second.locator(".tok.context")).to_have_count(0)
    # Their text, asked of vLLM, replaces the ids once loaded.
    expect(second.locator(".tok").first).not_to_have_text(re.compile(r"^‹\d+›$"))
    _shot(page, "trajectory")

    page.goto(run.url + "/ui/trajectories/gd-3")
    expect(page.locator("#rewards")).to_contain_text("ruler")
    expect(page.locator("blockquote.explanation")).to_contain_text("judged")
    page.goto(run.url + "/ui/trajectories/gb-0")  # the Responses surface, as one conversation
    expect(page.locator("article.call .msg.role-user")).to_contain_text("say gb-0")
    expect(page.locator("article.call .msg.role-assistant")).to_have_count(1)


def test_the_controls_work_for_an_admin_and_are_refused_to_a_read_key(browser: Any, run: Run) -> None:
    reader = _signed_in(browser, run, run.read_key)
    reader.goto(run.url + "/ui/policies/agent")
    expect(reader.locator("#served")).to_have_text("agent@0")
    expect(reader.locator("#controls")).to_have_count(0)  # no controls shown...
    refused = reader.request.post(run.url + "/ui/policies/agent/pause")  # ...and none obeyed
    assert refused.status == 403 and "admin" in refused.text()
    anyone = httpx.post(run.url + "/ui/policies/agent/pause")
    assert anyone.status_code == 401

    admin = _signed_in(browser, run, ADMIN_TOKEN)
    admin.goto(run.url + "/ui/policies/agent")
    admin.click("text=Pause training")
    expect(admin.locator("#state")).to_have_text("paused")
    # The reader's page follows without a reload (htmx fetches the live part again).
    expect(reader.locator("#state")).to_have_text("paused", timeout=15_000)
    admin.click("text=Resume training")
    expect(admin.locator("#state")).to_have_text("running")
    admin.click("text=Reject agent@1")
    expect(admin.locator("#steps")).to_contain_text("rejected")
    expect(admin.locator("#controls")).not_to_contain_text("Reject")
    with httpx.Client(base_url=run.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        status = c.get("/admin/policies/agent").json()
    assert status["paused"] is False and status["candidate"] is None and status["step"] == 0
