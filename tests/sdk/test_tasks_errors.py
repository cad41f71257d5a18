"""``burnish-tasks`` answers bad input with one line that says the fix and a non-zero exit,
never a traceback: an unknown suite or task, a setting the generator refuses, no admin token,
a wrong one, no gateway, a policy that does not exist. The suites raise ``TaskError`` and the
SDK ``MissingAdminToken`` with the same words, for code that calls them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from burnish import AsyncClient, MissingAdminToken
from burnish.tasks import TaskError
from burnish.tasks.reasoning_gym import ReasoningGym
from tests.conftest import ADMIN_TOKEN, Gateway

COMMAND = [sys.executable, "-m", "burnish.tasks"]


def failed(args: list[str], cwd: Path) -> str:
    """Run the command; it must fail with one line on stderr and no traceback. That line."""
    done = subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("burnish-tasks: "), done.stderr
    return lines[0]


def test_bad_tasks_and_settings_say_what_the_suite_has(tmp_path: Path) -> None:
    assert "did you mean word_sorting" in failed(["eval", "reasoning-gym", "word_sortin"], tmp_path)
    assert "reasoning-gym has no task 'no_such_task': it has" in failed(["eval", "reasoning-gym", "no_such_task"], tmp_path)
    refused = failed(["eval", "reasoning-gym", "number_format", "--set", "max_n=1000"], tmp_path)
    assert "refused the settings {'max_n': 1000}: min_n must be less than max_n" in refused and "its settings: " in refused and "max_n" in refused
    assert "unexpected keyword argument 'foo'" in failed(["eval", "reasoning-gym", "gcd", "--set", "foo=1"], tmp_path)
    assert "TextArena cannot make 'NoSuchGame-v0'" in failed(["eval", "textarena", "NoSuchGame-v0"], tmp_path)
    assert "cannot load the suite 'nosuch:thing'" in failed(["eval", "nosuch:thing", "x"], tmp_path)
    with pytest.raises(TaskError, match="did you mean word_sorting"):
        ReasoningGym("word_sortin")


def test_a_gateway_missing_refusing_or_without_the_policy_says_the_fix(make_gateway, tmp_path: Path) -> None:
    gw: Gateway = make_gateway()
    gw.create_policy("agent")
    nowhere = ["eval", "reasoning-gym", "gcd", "--gateway", "http://127.0.0.1:9", "--admin-token", "x"]
    assert failed(nowhere, tmp_path).startswith("burnish-tasks: no gateway answers at http://127.0.0.1:9 (ConnectError): start one with `burnish up`")
    here = ["eval", "reasoning-gym", "gcd", "--gateway", gw.url]
    assert "no admin token: pass --admin-token" in failed(here, tmp_path)  # nothing given, and no burnish-data/admin-token here
    assert "the gateway refused the admin token" in failed([*here, "--admin-token", "wrong"], tmp_path)
    missing = failed([*here, "--admin-token", ADMIN_TOKEN, "--policy", "nosuch"], tmp_path)
    assert missing == "burnish-tasks: no policy 'nosuch': `burnish status` lists the policies; name one with --policy"


async def test_the_sdk_says_an_admin_call_needs_the_token(make_gateway) -> None:
    gw: Gateway = make_gateway()
    async with AsyncClient(gw.url) as client:
        with pytest.raises(MissingAdminToken, match="needs the admin token"):
            await client.status("agent")
