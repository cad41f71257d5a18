"""Peak resident memory and time of an agent's training step on SmolLM2-135M, on the CPU.

Run from the repository root (a few minutes; each setting in a fresh process)::

    .venv/bin/python bench/agent_memory.py                              # micro-batches of 8192 and 2048 tokens
    .venv/bin/python bench/agent_memory.py --micro-batch-tokens 8192 --checkpointing on
    .venv/bin/python bench/agent_memory.py --objective grpo,distill     # the same batch, a GRPO step and a distillation step

The step is ``PolicyModel.step`` (trainer/policy_model.py) as ``burnish up`` runs it on the
demo's model: SmolLM2-135M-Instruct (converted once from the embedded GGUF file, fp32 on the
CPU), LoRA r=16 on every projection, on an agent's batch: 32 sequences of 300-400 tokens, each
two turns (a tool prompt of 200-260 tokens, a sampled answer of 30-50, a tool result of 20-40,
a sampled answer of 30-50), seeded, with recorded logprobs. Two steps are taken, the second
timed. ``--objective distill``: the step distills instead (``train.objective`` "distill"), from
the base shown a context of 240 tokens before each call's prompt (the lookup agent's worked
episode is about that long), taking the teacher's top 16 at each sampled position as
``burnish up``'s default does; the teacher's forward runs inside the step, as in the trainer. Reported per setting: the process's peak resident set (``VmHWM``: the most it held at
any moment, weights included) before the first step and after both, and the second step's
seconds. A setting whose resident set passes ``--rss-limit`` GB is stopped there (a watchdog
thread) and reported as over it, so that a run never takes the machine down.

Writes bench/results/agent_memory.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "agent_memory.json"
MODEL = ROOT / "bench" / "results" / ".smollm2"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OVER = 3  # a worker's exit status when the watchdog stopped it


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def watchdog(limit_gb: float) -> None:
    def watch() -> None:
        while True:
            if status_kb("VmRSS") > limit_gb * 1e6:
                print(json.dumps({"over_gb": limit_gb}), flush=True)
                os._exit(OVER)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def agent_batch(seed: int, sequences: int = 32) -> list:
    from burnish_server.trainer.sequences import Sequence

    rng = random.Random(seed)
    vocab = 49152
    items = []
    for i in range(sequences):
        seq = Sequence()
        for context, answer in ((rng.randint(200, 260), rng.randint(30, 50)), (rng.randint(20, 40), rng.randint(30, 50))):
            ids = [rng.randrange(vocab) for _ in range(context)]
            sampled = [rng.randrange(vocab) for _ in range(answer)]
            seq.add(ids, sampled, [-rng.uniform(0.01, 3.0) for _ in sampled])
        items.append((seq, (-1.0) ** i * rng.uniform(0.2, 1.0)))
    return items


# The teacher's context in a distillation step: worked examples shown before each call's prompt.
CONTEXT_TOKENS = 240


def with_teacher_prompts(items: list, seed: int) -> None:
    """Each call's teacher prompt: a fixed context, then the prompt the call saw (its tokens
    before its span), as trainer/teacher.py renders a base teacher's."""
    rng = random.Random(seed + 1)
    context = [rng.randrange(49152) for _ in range(CONTEXT_TOKENS)]
    for seq, _ in items:
        seq.spans = [dataclasses.replace(span, teacher_prompt=context + seq.tokens[: span.start]) for span in seq.spans]


def worker(args: argparse.Namespace) -> None:
    import torch

    from burnish_server.core.learning.policies import LoraSettings, Teacher, TrainSettings
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.policy_model import PolicyModel

    watchdog(args.rss_limit)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = SharedBase(str(MODEL), holding=Holding(checkpointing=args.checkpointing))
    lora = LoraSettings(rank=16, alpha=32, target_modules=TARGETS)
    train = TrainSettings(learning_rate=5e-4, micro_batch_tokens=args.micro_batch_tokens)
    if args.objective == "distill":
        train = TrainSettings(learning_rate=5e-4, micro_batch_tokens=args.micro_batch_tokens, objective="distill", teacher=Teacher())
    policy = PolicyModel(base, lora, train)
    items = agent_batch(args.seed)
    if args.objective == "distill":
        with_teacher_prompts(items, args.seed)
    loaded = status_kb("VmHWM")
    policy.step(items)
    if args.objective == "distill":  # the teacher scores every step's samples afresh
        for seq, _ in items:
            seq.teacher_logprobs = seq.taught = seq.teacher_top = None
    t0 = time.perf_counter()
    metrics = policy.step(items)
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "loaded_gb": loaded / 1e6,
                "peak_gb": status_kb("VmHWM") / 1e6,
                "step_s": seconds,
                "tokens": sum(len(s.tokens) for s, _ in items),
                "sampled": metrics.tokens,
                "loss": metrics.loss,
                "checkpointing": args.checkpointing if base.checkpointing else "off",
                "objective": args.objective,
            }
        ),
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--micro-batch-tokens", default="8192,2048", help="comma-separated; one fresh process each")
    ap.add_argument("--checkpointing", default="auto", choices=("auto", "on", "selective", "off"), help="BURNISH_TRAINER_CHECKPOINTING (auto: off on the CPU)")
    ap.add_argument("--objective", default="grpo", help="comma-separated, grpo or distill; one fresh process each")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rss-limit", type=float, default=14.0, help="GB of resident memory at which a setting is stopped")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.micro_batch_tokens = int(args.micro_batch_tokens)
        if args.objective not in ("grpo", "distill"):
            raise SystemExit(f"--objective: grpo or distill, not {args.objective!r}")
        worker(args)
        return 0
    if not (MODEL / "config.json").exists():
        from burnish_server.serving.models import embedded_gguf
        from burnish_server.trainer.gguf_model import convert_gguf

        convert_gguf(embedded_gguf(), MODEL)
    rows = []
    for objective, tokens in ((o, t) for o in args.objective.split(",") for t in args.micro_batch_tokens.split(",")):
        cmd = [sys.executable, __file__, "--worker", "--micro-batch-tokens", tokens, "--checkpointing", args.checkpointing, "--objective", objective]
        cmd += ["--threads", str(args.threads), "--seed", str(args.seed), "--rss-limit", str(args.rss_limit)]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode not in (0, OVER) or not lines:
            print(done.stdout, done.stderr, file=sys.stderr)
            raise SystemExit(f"micro-batch {tokens}: the worker failed ({done.returncode})")
        row = {"micro_batch_tokens": int(tokens), "checkpointing": args.checkpointing, "objective": objective, **json.loads(lines[-1])}
        rows.append(row)
        if "over_gb" in row:
            print(f"{objective}, micro-batches of {tokens:>5} tokens: stopped, resident set over {row['over_gb']:.1f} GB")
        else:
            print(
                f"{objective}, micro-batches of {tokens:>5} tokens (checkpointing {row['checkpointing']}): peak resident "
                f"{row['peak_gb']:.2f} GB (loaded: {row['loaded_gb']:.2f} GB), step {row['step_s']:.1f} s, "
                f"{row['tokens']} tokens, {row['sampled']:.0f} sampled"
            )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, indent=2))
    print(f"wrote {args.results.relative_to(ROOT) if args.results.is_relative_to(ROOT) else args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
