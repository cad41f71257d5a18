"""A training step beside vLLM sampling on the same cores: alone, and under a steady load.

Run from the repository root (about 4 minutes a variant on two cores)::

    .venv/bin/python bench/trainer_beside.py [--variants default,passive,pause] [--steps 2]

It starts vLLM as ``burnish up`` starts it for the embedded SmolLM2 (cli/up.py's
``prepare_model``: the converted model, its flags and environment; converted once into
bench/results/.trainer-beside), and for each variant takes the trainer's step as
bench/trainer_step.py takes it (two groups of 8 two-turn trajectories, ~180 sampled tokens
each, the CPU's own settings) twice in a fresh process: once with vLLM idle, once while
``--streams`` requests at a time keep it sampling (``max_tokens`` 64, ``ignore_eos``). It
prints each step's median seconds, the ratio under load to alone, and vLLM's generated tokens a
second during the steps (its ``vllm:generation_tokens`` counter, read every 0.5 s) against
between them.

Variants (what ``burnish up`` could start):

* ``default``: as today: each process's own thread count (both take every core) and
  OpenMP's wait policy (threads spin a while before they sleep);
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` for vLLM and the trainer: a thread waiting at a
  barrier sleeps at once, giving its core to the other process;
* ``pause``: the trainer pauses vLLM's scheduler for each step (``POST /pause?mode=keep``,
  which needs ``VLLM_SERVER_DEV_MODE=1``; requests wait, none is dropped), then resumes it.

Writes bench/results/trainer_beside.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from harness import PYTHON, free_port, install_cleanup  # noqa: E402

from burnish_server.cli.up import prepare_model  # noqa: E402
from burnish_server.core.platform.settings import Settings  # noqa: E402
from burnish_server.serving.process import VLLMServer  # noqa: E402

WORK = ROOT / "bench" / "results" / ".trainer-beside"
RESULTS = ROOT / "bench" / "results" / "trainer_beside.json"
STEP = ["--groups", "2", "--group-size", "8", "--prompt-len", "80", "--answer-len", "90"]
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
VARIANTS = {
    "default": ({}, {}),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "pause": ({"VLLM_SERVER_DEV_MODE": "1"}, {}),
}
clock = time.perf_counter


@dataclass
class Load:
    """``streams`` completions at a time against vLLM, and its generated-token counter sampled every 0.5 s."""

    url: str
    model: str
    streams: int
    samples: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        self._threads = [threading.Thread(target=self._sample, daemon=True)]
        self._threads += [threading.Thread(target=self._sampler, daemon=True) for _ in range(self.streams)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _sampler(self) -> None:
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": 64, "temperature": 1.0, "ignore_eos": True}
        with httpx.Client(timeout=600) as client:
            while not self._stop.is_set():
                client.post(self.url + "/v1/completions", json=body).raise_for_status()

    def _sample(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                self.samples.append((clock(), generated(client, self.url)))
                time.sleep(0.5)


def generated(client: httpx.Client, url: str) -> float:
    text = client.get(url + "/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def rate(samples: list[tuple[float, float]], windows: list[tuple[float, float]], inside: bool) -> float:
    """Tokens a second over the samples' intervals that lie inside (or outside) every window."""
    tokens = seconds = 0.0
    for (t0, n0), (t1, n1) in zip(samples, samples[1:]):
        within = any(a <= t0 and t1 <= b for a, b in windows)
        if within == inside:
            tokens, seconds = tokens + n1 - n0, seconds + t1 - t0
    return tokens / seconds if seconds else float("nan")


def step(model: str, env: dict[str, str], steps: int, pause_url: str | None) -> dict:
    """bench/trainer_step.py in a fresh process; with ``pause_url``, each step waits for vLLM to pause."""
    cmd = [PYTHON, str(ROOT / "bench" / "trainer_step.py"), "--model", model, *STEP, "--steps", str(steps), "--results", str(WORK / "step.json")]
    if pause_url:
        cmd += ["--pause-vllm", pause_url]
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"trainer_step.py failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(name: str, served: VLLMServer, streams: int, steps: int) -> dict:
    vllm_env, trainer_env = VARIANTS[name]
    os.environ.update(vllm_env)  # VLLMServer.environment() starts from os.environ
    try:
        served.port = free_port()
        served.start()
        served.wait_healthy(600)
    finally:
        for key in vllm_env:
            os.environ.pop(key, None)
    model = served.served_model_name or served.model
    pause = served.url if name == "pause" else None
    try:
        alone = step(served.model, trainer_env, steps, pause)
        load = Load(served.url, model, streams).start()
        try:
            time.sleep(5)  # the load settles
            loaded = step(served.model, trainer_env, steps, pause)
        finally:
            load.stop()
    finally:
        served.stop()
    windows = [tuple(w) for w in loaded["step_windows"][1:]]
    row = {
        "alone_s": alone["step_s"],
        "loaded_s": loaded["step_s"],
        "ratio": loaded["step_s"] / alone["step_s"],
        "alone_times": alone["step_times"],
        "loaded_times": loaded["step_times"],
        "sampled": loaded["sampled"],
        "vllm_tokens_per_s_during_steps": rate(load.samples, windows, True),
        "vllm_tokens_per_s_between_steps": rate(load.samples, [(loaded["step_windows"][0][0], windows[-1][1])], False),
    }
    print(
        f"  {name:<8} step alone {row['alone_s']:6.1f} s, under load {row['loaded_s']:6.1f} s ({row['ratio']:.2f}x);"
        f" vLLM {row['vllm_tokens_per_s_during_steps']:6.1f} tokens/s during the steps, {row['vllm_tokens_per_s_between_steps']:6.1f} otherwise",
        flush=True,
    )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up, alone and under load")
    ap.add_argument("--streams", type=int, default=16)
    args = ap.parse_args()
    install_cleanup()
    WORK.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=str(WORK))
    served = prepare_model(settings, None, free_port(), []).vllm
    served.log_path = WORK / "vllm.log"
    print(f"vLLM: {served.model}; step: {' '.join(STEP)}; {args.streams} streams; {os.cpu_count()} cores", flush=True)
    rows = {name: measure(name, served, args.streams, args.steps) for name in args.variants.split(",")}
    RESULTS.write_text(json.dumps({"step": STEP, "streams": args.streams, "cpus": os.cpu_count(), "variants": rows}, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
