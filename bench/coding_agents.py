"""The coding CLIs on the default ``burnish up``: their prompt sizes, time a call, and how many of
a session's calls merge into one trained sequence (docs/coding-agents.md).

Run from the repository root, after ``make install`` and ``make .tools/clis/.installed`` (about
ten minutes on two cores)::

    .venv/bin/python bench/coding_agents.py                  # starts its own burnish up
    .venv/bin/python bench/coding_agents.py --sessions 5

Each session is two turns: the Codex CLI (lean flags) runs ``exec`` then ``exec resume --last``;
Claude Code (``--tools Bash``) runs ``-p`` then ``-p --continue``; mini-swe-agent takes up to
three steps of its own. Per CLI it reports the first prompt's tokens, the calls, their seconds,
and the merge share: of the calls after a session's first, those whose prompt extends the
session's sequence so far (``extends_previous``), with the reasons of the others
(core/learning/drift.py). Also the prompt of each CLI with its whole default toolset (refused past the
window: the tokens come from the error), and vLLM's resident memory.

Writes bench/results/coding_agents.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
CLIS = ROOT / ".tools" / "clis" / "node_modules" / ".bin"
RESULTS = ROOT / "bench" / "results" / "coding_agents.json"
TASKS = [
    "Create a file named hello.txt that contains the word hi.",
    "List the files in this directory.",
    "Write a Python script add.py that prints 2 + 3.",
    "Show the current date.",
    "Count the lines of every .txt file here.",
]
BUDGET = 96
LEAN_CODEX = ["--disable", "multi_agent", "--disable", "goals"]


def run(command: list[str], env: dict[str, str], cwd: Path) -> str:
    out = subprocess.run(command, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=900)
    return out.stdout + out.stderr


def codex(url: str, home: Path, work: Path, *args: str) -> str:
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "agent"\nmodel_provider = "burnish"\n\n[model_providers.burnish]\nname = "burnish"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
    )
    return run([str(CLIS / "codex"), "exec", "--skip-git-repo-check", *args], {"CODEX_HOME": str(home)}, work)


def claude(url: str, home: Path, work: Path, *args: str) -> str:
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "none", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(BUDGET)}
    return run([str(CLIS / "claude"), "--model", "agent", "--permission-mode", "acceptEdits", *args], env, work)


def mini(url: str, work: Path, trajectory: str, task: str) -> str:
    work.mkdir(parents=True, exist_ok=True)
    env = {"OPENAI_API_KEY": "none", "MSWEA_CONFIGURED": "true", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": str(work)}
    settings = [
        f"model.model_kwargs.api_base={url}/t/{trajectory}/v1",
        f"model.model_kwargs.max_tokens={BUDGET}",
        "agent.step_limit=3",
        "model.cost_tracking=ignore_errors",
    ]
    command = [str(Path(sys.executable).parent / "mini"), "-y", "--exit-immediately", "-t", task, "-m", "openai/agent", "-l", "0", "-c", "mini.yaml"]
    return run(command + [a for s in settings for a in ("-c", s)], env, work)


def trajectories_since(url: str, since: set[str]) -> list[dict[str, Any]]:
    listed = httpx.get(f"{url}/v1/trajectories", params={"limit": 100}, timeout=30).json()["data"]
    return [httpx.get(f"{url}/v1/trajectories/{t['id']}", timeout=60).json() for t in listed if t["id"] not in since]


def summary(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    calls = [c for t in trajectories for c in t["calls"]]
    ok = [c for c in calls if c["status"] == "ok" and c["tokens"]]
    later = [c for t in trajectories for c in t["calls"][1:] if c["status"] == "ok" and c["tokens"]]
    reasons = collections.Counter(c["split_reason"] for c in later if c["extends_previous"] is False)
    firsts = [t["calls"][0] for t in trajectories if t["calls"] and t["calls"][0]["tokens"]]
    return {
        "sessions": len(trajectories),
        "calls": len(calls),
        "ok": len(ok),
        "first_prompt_tokens": sorted(len(c["tokens"]["prompt_token_ids"]) for c in firsts),
        "sampled_tokens_mean": round(sum(len(c["tokens"]["completion_token_ids"][0]) for c in ok) / max(1, len(ok)), 1),
        "seconds_per_call_mean": round(sum(c["upstream_ms"] or 0 for c in ok) / max(1, len(ok)) / 1000, 2),
        "later_calls": len(later),
        "merged": sum(1 for c in later if c["extends_previous"]),
        "merge_share": round(sum(1 for c in later if c["extends_previous"]) / len(later), 2) if later else None,
        "split_reasons": dict(reasons),
    }


def vllm_rss_mb() -> float:
    out = subprocess.run(["ps", "-eo", "rss,args"], capture_output=True, text=True).stdout
    return round(sum(int(line.split()[0]) for line in out.splitlines()[1:] if "VLLM" in line or "vllm.entrypoints" in line) / 1024, 1)


def measure(url: str, sessions: int, scratch: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"vllm_rss_mb": vllm_rss_mb()}
    seen: set[str] = {t["id"] for t in httpx.get(f"{url}/v1/trajectories", params={"limit": 100}).json()["data"]}

    def collect(name: str) -> None:
        found = trajectories_since(url, seen)
        seen.update(t["id"] for t in found)
        results[name] = summary(found)
        print(name, json.dumps(results[name]), flush=True)

    # The whole default toolsets: refused past the window, the tokens named in the error.
    out = codex(url, scratch / "codex-full", scratch / "w", TASKS[0])
    full = [c for t in trajectories_since(url, seen) for c in t["calls"]]
    seen.update(t["id"] for t in trajectories_since(url, seen))
    numbers = [re.search(r"resulted in (\d+) tokens", c["error"] or "") for c in full]
    results["codex_default_prompt_tokens"] = [int(n[1]) for n in numbers if n]
    results["codex_default_says"] = next((line for line in out.splitlines() if "context window" in line), out[-200:])
    out = claude(url, scratch / "claude-full", scratch / "w", "-p", TASKS[0])
    full = [c for t in trajectories_since(url, seen) for c in t["calls"]]
    seen.update(t["id"] for t in trajectories_since(url, seen))
    numbers = [re.search(r"(\d+) tokens >", c["error"] or "") for c in full]
    results["claude_default_prompt_tokens"] = [int(n[1]) for n in numbers if n]
    results["claude_default_says"] = next((line for line in out.splitlines() if "too long" in line.lower()), out[-200:])

    for i in range(sessions):
        home, work = scratch / f"codex-{i}", scratch / f"codex-{i}-work"
        codex(url, home, work, *LEAN_CODEX, TASKS[i % len(TASKS)])
        codex(url, home, work, *LEAN_CODEX, "resume", "--last", "Now say done.")
    collect("codex")
    for i in range(sessions):
        home, work = scratch / f"claude-{i}", scratch / f"claude-{i}-work"
        claude(url, home, work, "-p", TASKS[i % len(TASKS)], "--tools", "Bash")
        claude(url, home, work, "-p", "Now say done.", "--continue", "--tools", "Bash")
    collect("claude_code")
    for i in range(sessions):
        mini(url, scratch / f"mini-{i}", f"mini-{i}", TASKS[i % len(TASKS)])
    collect("mini_swe_agent")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running burnish up's gateway (default: start one)")
    parser.add_argument("--sessions", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.url:
            results = measure(args.url, args.sessions, Path(scratch))
        else:
            data = Path(scratch) / "data"
            env = {**os.environ, "BURNISH_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1"}
            up = subprocess.Popen(
                [sys.executable, "-m", "burnish_server.cli", "up", "--port", "8089"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            try:
                for line in up.stdout or ():
                    if "burnish is up" in line:
                        break
                with httpx.Client(base_url="http://127.0.0.1:8089", headers={"authorization": f"Bearer {(data / 'admin-token').read_text().strip()}"}) as admin:
                    admin.patch("/admin/policies/agent", json={"serving": {"max_tokens": BUDGET}}).raise_for_status()
                results = measure("http://127.0.0.1:8089", args.sessions, Path(scratch))
            finally:
                up.send_signal(2)
                up.wait(timeout=120)
    results["when"] = time.strftime("%Y-%m-%d %H:%M")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
