"""The trainer's step as ``burnish trainer`` takes it, phase by phase, on one device: recorded calls
to sequences and advantages, the GRPO step, the checkpoint written.

Run from the repository root (on a GPU: ``bench/gpu.sh`` runs it; on the CPU, a small shape)::

    python3 bench/trainer_step.py --model qwen2.5-1.5b [--groups 4 --group-size 8]
    .venv/bin/python bench/trainer_step.py --model qwen2-tiny --steps 1
    .venv/bin/python bench/trainer_step.py --model smollm2 --prompt-len 200 --answer-len 20 --same-prompt --steps 2 [--prompt-sharing off]

The batch is an agent's, made as the gateway records it: ``--groups`` groups of
``--group-size`` trajectories, each of two calls (a tool prompt of ``--prompt-len`` tokens and a
sampled answer of ``--answer-len``, then a tool result of ``--answer-len`` / 2 tokens and a second
answer), with token ids and logprobs packed as in the ``calls`` table (``core/protocols/records.py``) and
random rewards. With ``--same-prompt`` a group's trajectories share their first prompt, as a
group answering one task does (trainer/shared_prompts.py trains it once a group;
``--prompt-sharing off`` does not). Phases, each timed (the device synchronised at its end):

* ``batch``: ``trainer/sequences.py: training_batch``: the calls merged into one sequence per
  trajectory, group-relative advantages (what the worker does after reading the store);
* ``step``: ``PolicyModel.step`` with the trainer's settings for the device (``Holding()``:
  bf16, activation checkpointing and autocast on a GPU), the median of ``--steps`` after a
  warm-up, and the most memory allocated on the device during them;
* ``save``: ``PolicyModel.save``: the adapter, optimizer state and trainer state to disk.

Not measured here: the store's claim and read of the groups' calls, the step's record and the
publish to vLLM. ``bench/trainer_whole.py`` times them with the rest, the real worker's whole
step against a SQLite store and a loopback stand-in for vLLM (the GPU machine has no vLLM;
``bench/swap_latency.py`` times a real vLLM's load). Prints one JSON line; writes ``--results``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def recorded_rows(args: argparse.Namespace, vocab: int) -> list:
    """The claimed groups' calls as ``store/training.py: group_calls`` returns them."""
    import msgspec

    from burnish_server.core.protocols import packed
    from burnish_server.core.protocols.records import CallRecord
    from burnish_server.store.training import TrainingCall

    rng = random.Random(args.seed)
    now = datetime.now(UTC)
    rows = []
    for g in range(args.groups):
        task = [rng.randrange(vocab) for _ in range(args.prompt_len)] if args.same_prompt else []
        for m in range(args.group_size):
            trajectory, reward, history = f"t-{g}-{m}", rng.random(), []
            for context in (args.prompt_len, args.answer_len // 2):
                fresh = [rng.randrange(vocab) for _ in range(context)]
                prompt = history + (task if args.same_prompt and not history else fresh)
                answer = [rng.randrange(vocab) for _ in range(args.answer_len)]
                call = CallRecord(
                    trajectory_id=trajectory,
                    group_id=f"g-{g}",
                    group_size=args.group_size,
                    endpoint="chat.completions",
                    model="agent",
                    stream=False,
                    status="ok",
                    http_status=200,
                    request=msgspec.json.encode({"model": "agent"}),
                    started_at=now,
                    finished_at=now,
                    prompt_token_ids=packed.pack_ids(prompt),
                    completion_token_ids=packed.pack_ids(answer),
                    completion_logprobs=packed.pack_floats([-rng.uniform(0.01, 3.0) for _ in answer]),
                    completion_lengths=packed.pack_ids([len(answer)]),
                    policy="agent",
                    policy_step=0,
                )
                rows.append(TrainingCall(f"g-{g}", trajectory, reward, call))
                history = prompt + answer
    return rows


def model_folder(name: str, work: Path, seed: int) -> tuple[Path, int]:
    """The model to train and its vocabulary's size: a shape of bench/vs_trl.py (random weights,
    built on the device in the step's dtype and saved into ``work``), or a local HF folder."""
    import torch
    import vs_trl

    if name == "smollm2":  # the embedded demo model, converted once from its GGUF file (as bench/vs_trl.py does)
        from burnish_server.serving.models import embedded_gguf
        from burnish_server.trainer.gguf_model import convert_gguf

        folder = ROOT / "bench" / "results" / ".smollm2"
        if not (folder / "config.json").exists():
            convert_gguf(embedded_gguf(), folder)
        name = str(folder)
    if name not in vs_trl.SHAPES:
        from transformers import AutoConfig

        return Path(name), AutoConfig.from_pretrained(name).vocab_size
    cuda = torch.cuda.is_available()
    model = work / name
    built = vs_trl.shape_model(name, model, "cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32, seed)
    vocab = built.config.vocab_size
    del built
    if cuda:
        torch.cuda.empty_cache()
    return model, vocab


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", help="a shape from bench/vs_trl.py (random weights), smollm2 (the demo's model) or a local HF model")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=600)
    ap.add_argument("--answer-len", type=int, default=150)
    ap.add_argument("--same-prompt", action="store_true", help="a group's trajectories share their first prompt")
    ap.add_argument("--prompt-sharing", choices=("auto", "off"), default="auto", help="the trainer's BURNISH_TRAINER_PROMPT_SHARING")
    ap.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pause-vllm", metavar="URL", help="pause this vLLM's scheduler for each step (POST /pause?mode=keep), then resume it")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "trainer_step.json")
    args = ap.parse_args()

    import vs_trl

    if path := vs_trl.import_path():
        sys.path.insert(0, path)
    import httpx
    import torch

    from burnish_server.core.learning.policies import LoraSettings, TrainSettings
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.policy_model import PolicyModel
    from burnish_server.trainer.sequences import training_batch

    cuda = torch.cuda.is_available()

    def sync() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="burnish-step-") as tmp:
        work = Path(tmp)
        model, vocab = model_folder(args.model, work, args.seed)
        t0 = sync()
        policy = PolicyModel(
            SharedBase(str(model), holding=Holding(prompt_sharing=args.prompt_sharing)),
            LoraSettings(rank=16, alpha=32),
            TrainSettings(learning_rate=5e-4, groups_per_step=args.groups),
        )
        load_s = sync() - t0
        rows = recorded_rows(args, vocab)
        t0 = sync()
        batch = training_batch(rows, policy.train)
        batch_s = sync() - t0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times, windows = [], []
        for _ in range(1 + args.steps):
            t0 = sync()
            if args.pause_vllm:
                httpx.post(args.pause_vllm + "/pause", params={"mode": "keep"}, timeout=120).raise_for_status()
            try:
                metrics = policy.step(batch.items)
            finally:
                if args.pause_vllm:
                    httpx.post(args.pause_vllm + "/resume", timeout=120).raise_for_status()
            windows.append((t0, sync()))
            times.append(windows[-1][1] - t0)
        peak = torch.cuda.max_memory_allocated() if cuda else None
        t0 = sync()
        policy.save(work / "checkpoint")
        save_s = sync() - t0
    step_s = statistics.median(times[1:])
    result = {
        "model": args.model,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "calls": len(rows),
        "sequences": len(batch.items),
        "tokens": sum(len(s.tokens) for s, _ in batch.items),
        "sampled": metrics.tokens,
        "checkpointing": policy.base.checkpointing,
        "packed": policy.base.packs,
        "same_prompt": args.same_prompt,
        "prompt_sharing": policy.base.shares_prompts,
        "load_s": load_s,
        "batch_s": batch_s,
        "step_s": step_s,
        "step_times": times,
        # perf_counter is CLOCK_MONOTONIC on Linux: another process's timestamps compare with these
        # (bench/trainer_beside.py reads vLLM's tokens generated during each step).
        "step_windows": windows,
        "sampled_tokens_per_s": metrics.tokens / step_s,
        "save_s": save_s,
        "peak_memory": peak,
        "loss": metrics.loss,
    }
    print(json.dumps(result), flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
