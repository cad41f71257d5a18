"""The coding agents people run, unchanged but for their documented base-URL settings, on the
default ``burnish up`` (SmolLM2-135M-Instruct, served with its 8,192-token window).

The Codex CLI (Responses API) and Claude Code (Messages) each run a small task by themselves,
twice, in a group named by a header their settings carry; mini-swe-agent (chat completions,
through LiteLLM) does the same with the gateway's path prefix. Every call must be answered and
recorded with vLLM's token ids under its session's trajectory; rewards are posted and one step
trains on the three groups, every sampled token inside the trained window. A prompt past the
window gets the error each CLI acts on, and each says so. What a 135M model writes is not
judged: that is what training is for (docs/coding-agents.md).

The CLIs come from npm, pinned (``make test`` installs them into ``.tools/clis``);
mini-swe-agent from PyPI (the test extra).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import PG_REQUIRED, Up, burnish_up, real_model_parts

CLIS = Path(__file__).resolve().parents[2] / ".tools" / "clis" / "node_modules" / ".bin"
TASK = "Create a file named hello.txt that contains the word hi."
BUDGET = 96  # tokens a call: what a small model's answer needs, and a quick test
LEAN_CODEX = ["--disable", "multi_agent", "--disable", "goals"]  # docs/coding-agents.md


def cli(name: str) -> Path:
    path = CLIS / name
    if not path.exists():
        if PG_REQUIRED:  # CI
            pytest.fail(f"{path} is missing: `make .tools/clis/.installed` installs the coding CLIs")
        pytest.skip(f"{path} is missing (make .tools/clis/.installed)")
    return path


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    real_model_parts()
    cli("codex"), cli("claude")
    # A coding session is a long sequence (6,000 tokens and more): recomputed activations keep
    # the step within a few GB on the CPU (docs/coding-agents.md).
    os.environ.setdefault("BURNISH_TRAINER_CHECKPOINTING", "selective")
    with burnish_up(tmp_path_factory.mktemp("coding-up"), timeout=900) as running:
        with httpx.Client(base_url=running.url, headers=running.admin, timeout=30) as admin:
            # Groups wait for the module's last test to reward them: on a loaded machine that is
            # past the default 600 s idle close, which would refuse the rewards (409).
            r = admin.patch("/admin/policies/agent", json={"serving": {"max_tokens": BUDGET}, "train": {"group_idle_close_s": None}})
            assert r.status_code == 200, r.text
        yield running


@dataclass
class Ran:
    code: int  # the exit code
    out: str  # stdout, then stderr


def run(command: list[str | Path], env: dict[str, str], cwd: Path, timeout: float = 600) -> Ran:
    out = subprocess.run([str(c) for c in command], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return Ran(out.returncode, out.stdout + out.stderr)


def codex_home(up: Up, home: Path, group: str) -> Path:
    """The Codex CLI's documented provider block (docs/coding-agents.md), a group in its headers."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        'model = "agent"\nmodel_provider = "burnish"\n\n[model_providers.burnish]\nname = "burnish"\n'
        f'base_url = "{up.url}/v1"\nwire_api = "responses"\n'
        f'http_headers = {{ "X-Group-Id" = "{group}", "X-Group-Size" = "2" }}\n'
    )
    return home


def codex(up: Up, tmp: Path, group: str, *args: str) -> Ran:
    work = tmp / "work"
    work.mkdir(parents=True, exist_ok=True)
    env = {"CODEX_HOME": str(codex_home(up, tmp / "codex", group))}
    return run([cli("codex"), "exec", "--skip-git-repo-check", *args], env, work)


def claude(up: Up, tmp: Path, group: str, prompt: str, *args: str) -> Ran:
    work, home = tmp / "work", tmp / "claude"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": up.url,
        "ANTHROPIC_API_KEY": "none",
        "ANTHROPIC_CUSTOM_HEADERS": f"X-Group-Id: {group}\nX-Group-Size: 2",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(BUDGET),
    }
    return run([cli("claude"), "-p", prompt, "--model", "agent", "--permission-mode", "acceptEdits", *args], env, work)


def group(up: Up, name: str) -> dict[str, Any]:
    r = httpx.get(f"{up.url}/v1/groups/{name}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def served_and_recorded(up: Up, name: str, surface: str) -> list[str]:
    """The group's two sessions: every call answered by the policy and recorded with vLLM's ids."""
    members = group(up, name)["members"]
    assert len(members) == 2, [m["id"] for m in members]
    for member in members:
        calls = httpx.get(f"{up.url}/v1/trajectories/{member['id']}", timeout=30).json()["calls"]
        assert calls, member["id"]
        for call in calls:
            assert (call["endpoint"], call["status"], call["upstream_model"]) == (surface, "ok", "smollm2"), call.get("error")
            tokens = call["tokens"]
            assert tokens["prompt_token_ids"] and tokens["completion_token_ids"][0]
            assert len(tokens["completion_logprobs"][0]) == len(tokens["completion_token_ids"][0])
    return [m["id"] for m in members]


# How each CLI reports an answer cut at its budget (the Responses API's status "incomplete",
# Anthropic's stop_reason "max_tokens"): as an error, though the call was served as the protocol has it.
CUT_AT_BUDGET = ("reason: max_output_tokens", "output token maximum")


def errors(out: str) -> list[str]:
    """A CLI's error lines, but for an answer cut at its budget."""
    return [line for line in out.splitlines() if line.startswith(("ERROR", "API Error")) and not any(cut in line for cut in CUT_AT_BUDGET)]


def served_its_turn(ran: Ran) -> None:
    """The CLI ran its task to the end: exit 0, or 1 where its last answer was cut at the budget
    (each CLI calls that a failed turn); no other error on the way."""
    assert ran.code == 0 or (ran.code == 1 and any(cut in ran.out for cut in CUT_AT_BUDGET)), f"exit {ran.code}:\n{ran.out[-4000:]}"
    assert not errors(ran.out), ran.out


def test_codex_cli_runs_a_task_on_the_policy(up: Up, tmp_path: Path) -> None:
    for run_dir in ("one", "two"):
        served_its_turn(codex(up, tmp_path / run_dir, "codex", *LEAN_CODEX, TASK))
    served_and_recorded(up, "codex", "responses")


def test_claude_code_runs_a_task_on_the_policy(up: Up, tmp_path: Path) -> None:
    for run_dir in ("one", "two"):
        ran = claude(up, tmp_path / run_dir, "claude", TASK, "--tools", "Bash")
        served_its_turn(ran)
        assert "too long" not in ran.out, ran.out
    # A second turn of the first session (`claude -p --continue`): the same trajectory, more calls.
    before = {s: len(httpx.get(f"{up.url}/v1/trajectories/{s}").json()["calls"]) for s in served_and_recorded(up, "claude", "messages")}
    served_its_turn(claude(up, tmp_path / "one", "claude", "Now say done.", "--continue", "--tools", "Bash"))
    after = {s: len(httpx.get(f"{up.url}/v1/trajectories/{s}").json()["calls"]) for s in served_and_recorded(up, "claude", "messages")}
    grew = sorted(after[s] - before[s] for s in before)
    assert grew[0] == 0 and grew[1] >= 1, (before, after)


def test_mini_swe_agent_runs_a_task_on_the_policy(up: Up, tmp_path: Path) -> None:
    """A chat-completions agent from PyPI, through LiteLLM: a base URL with the gateway's path prefix."""
    for n in range(2):
        work = tmp_path / f"mini-{n}"
        work.mkdir()
        base = f"{up.url}/g/mini/t/mini-{n}/v1"
        env = {"OPENAI_API_KEY": "none", "MSWEA_CONFIGURED": "true", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": str(work)}
        settings = [f"model.model_kwargs.api_base={base}", f"model.model_kwargs.max_tokens={BUDGET}", "agent.step_limit=2", "model.cost_tracking=ignore_errors"]
        mini = Path(sys.executable).parent / "mini"
        ran = run(
            [mini, "-y", "--exit-immediately", "-t", TASK, "-m", "openai/agent", "-l", "0", "-c", "mini.yaml", *[a for s in settings for a in ("-c", s)]],
            env,
            work,
        )
        assert ran.code == 0 and "Traceback" not in ran.out, f"exit {ran.code}:\n{ran.out[-4000:]}"
    served_and_recorded(up, "mini", "chat.completions")


def test_a_prompt_past_the_window_gets_the_error_each_cli_acts_on(up: Up, tmp_path: Path) -> None:
    """Codex's whole default toolset (8,800 tokens) and Claude Code's (past 8,192) do not fit:
    each hears it in its own protocol's words, and says so instead of failing on an error."""
    ran = codex(up, tmp_path / "codex-long", "long-codex", TASK)
    assert ran.code == 1 and "ran out of room in the model's context window" in ran.out, f"exit {ran.code}:\n{ran.out}"
    ran = claude(up, tmp_path / "claude-long", "long-claude", TASK)
    assert ran.code == 1 and "Prompt is too long" in ran.out, f"exit {ran.code}:\n{ran.out}"


def test_one_step_trains_on_every_cli_group(up: Up) -> None:
    """Last: each group rewarded (one session 1, the other 0), one step on the three groups:
    every call's sampled tokens trained, none past the window or left untokenised."""
    for name in ("codex", "claude", "mini"):
        for reward, member in zip((1.0, 0.0), group(up, name)["members"], strict=True):
            assert httpx.post(f"{up.url}/v1/trajectories/{member['id']}/reward", json={"reward": reward}).status_code == 200
    assert httpx.post(f"{up.url}/v1/groups/mini/close").status_code == 200  # the path prefix names no size
    assert [group(up, name)["state"] for name in ("codex", "claude", "mini")] == ["closed"] * 3
    with httpx.Client(base_url=up.url, headers=up.admin, timeout=30) as admin:
        assert admin.post("/admin/policies/agent/train").status_code in (200, 202)
        from burnish import Client

        # 40,000 tokens of context, 1,000 of them trained: 620 s alone on two cores (compute-bound:
        # forward and backward over every session's 6,000-token prompts), 1,400-1,800 s and more
        # beside the rest of `make test`.
        assert Client(up.url).wait_for_step("agent", 1, timeout=3600) == 1
        (metrics,) = admin.get("/admin/policies/agent/metrics").json()["data"]
    assert metrics["groups"] == 3 and metrics["tokens"] > 0, metrics
    assert metrics["forced_tokens"] == 0 and metrics["untokenized_calls"] == 0, metrics
