"""Several policies on one base model against a base per policy: the trainer's memory and step time.

Run from the repository root (about two minutes on SmolLM2-135M)::

    .venv/bin/python bench/adapters.py [--model smollm2] [--policies 8] [--rows 8 --tokens 256]
    python3 bench/adapters.py --model qwen2.5-1.5b ...   # on a GPU: a random model of that shape

Each setup runs in a fresh process, one after another, so that each peak is its own:

* ``shared 1``: one policy, as a trainer with one policy holds it;
* ``shared N``: N policies' LoRA adapters on one base in memory (trainer/base_model.py, what
  the trainer does now);
* ``apart N``: N policies each on a base of its own (what the trainer did before).

Every policy takes two GRPO steps (``PolicyModel.step``) on a seeded random batch of ``--rows``
sequences of ``--tokens`` tokens, so that its optimizer state exists; the second step is timed.
Printed per setup: the process's peak resident memory (and the GPU's peak allocation, on a
GPU), the memory above the shared-1 setup per added policy, and each policy's step seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def model_path(name: str, work: Path) -> Path:
    """The model to load: SmolLM2 (converted once from its GGUF file), a named random shape, or a path."""
    from vs_trl import SHAPES, shape_model

    if name == "smollm2":
        path = ROOT / "bench" / "results" / ".smollm2"
        if not (path / "config.json").exists():
            from burnish_server.serving.models import embedded_gguf
            from burnish_server.trainer.gguf_model import convert_gguf

            convert_gguf(embedded_gguf(), path)
        return path
    if name in SHAPES:
        import torch

        path = work / name
        if not (path / "config.json").exists():
            cuda = torch.cuda.is_available()
            shape_model(name, path, "cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32, 0)
        return path
    return Path(name)


def run_setup(args: argparse.Namespace) -> None:
    """One setup, in this process: load, two steps per policy, print what it cost."""
    import torch

    from burnish_server.core.learning.policies import LoraSettings, TrainSettings
    from burnish_server.trainer.base_model import SharedBase
    from burnish_server.trainer.policy_model import PolicyModel
    from burnish_server.trainer.sequences import Sequence

    torch.manual_seed(0)
    lora = LoraSettings(rank=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    train = TrainSettings(learning_rate=1e-5, micro_batch_tokens=args.rows * args.tokens, max_seq_len=args.tokens)
    shared = SharedBase(args.path) if args.setup == "shared" else None
    models = [PolicyModel(shared or SharedBase(args.path), lora, train, owner=f"policy-{i}") for i in range(args.policies)]
    vocab = models[0].model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    items = []
    for row in range(args.rows):
        ids = torch.randint(5, vocab, (args.tokens,), generator=generator).tolist()
        sequence = Sequence()
        sequence.add(ids[: args.tokens // 2], ids[args.tokens // 2 :], None)
        items.append((sequence, 1.0 if row % 2 else -1.0))
    seconds = []
    for model in models:
        model.step(items)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.step(items)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    out = {
        "setup": f"{args.setup} {args.policies}",
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_s": seconds,
    }
    if torch.cuda.is_available():
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, qwen2.5-1.5b, qwen2.5-7b (random weights) or a local path")
    parser.add_argument("--policies", type=int, default=8)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--setup", choices=["shared", "apart"], help=argparse.SUPPRESS)  # one setup, in a child process
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.setup:
        run_setup(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as work:
        path = model_path(args.model, Path(work))
        results = []
        for setup, policies in (("shared", 1), ("shared", args.policies), ("apart", args.policies)):
            command = [sys.executable, __file__, "--setup", setup, "--policies", str(policies), "--path", str(path)]
            command += ["--rows", str(args.rows), "--tokens", str(args.tokens)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    one, shared, apart = results
    key = "peak_gpu_mb" if "peak_gpu_mb" in one else "peak_rss_mb"
    n = args.policies
    print(
        json.dumps(
            {
                "model": args.model,
                "policies": n,
                "memory": key,
                "one_policy_mb": round(one[key]),
                f"shared_{n}_mb": round(shared[key]),
                f"apart_{n}_mb": round(apart[key]),
                "per_added_policy_mb_shared": round((shared[key] - one[key]) / (n - 1), 1),
                "per_added_policy_mb_apart": round((apart[key] - one[key]) / (n - 1), 1),
                "step_s_one": round(one["step_s"][0], 3),
                "step_s_shared_median": round(statistics.median(shared["step_s"]), 3),
                "step_s_apart_median": round(statistics.median(apart["step_s"]), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
