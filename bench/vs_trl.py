"""One burnish GRPO optimizer step against TRL's, on the same model and the same batch.

Run from the repository root (a minute or two on the tiny model; the first run also
builds TRL's venv, a minute or two more)::

    .venv/bin/python bench/vs_trl.py [--groups 2 --group-size 8 --prompt-len 40 --completion-len 128]
    .venv/bin/python bench/vs_trl.py --model /path/to/local/hf/model   # any local HF causal LM

What one step is, on each side (the same work: forward, GRPO loss, backward, clip, AdamW):

* **burnish**: ``PolicyModel.step(items)`` (trainer/policy_model.py): pad into tensors, forward
  over micro-batches (here one: micro_batch_tokens >= the batch), full-vocab logprobs,
  ``grpo_loss``, backward, ``clip_grad_norm_``, ``AdamW.step``, ``zero_grad``.
* **TRL**: a real ``trl.GRPOTrainer`` (no vLLM, no generation) around the same peft LoRA;
  ``trainer.compute_loss(model, inputs)`` on the ``inputs`` dict that its own
  ``_generate_and_score_completions`` would hand it (prompt/completion ids and masks,
  advantages, old_per_token_logps, num_items_in_batch): its fused LM head (logprobs and
  entropy of completion tokens only), clipped loss, metrics; then ``accelerator.backward``,
  ``accelerator.clip_grad_norm_``, ``optimizer.step`` (the trainer's own AdamW), ``zero_grad``.

Both sides get the same token ids (random, seeded, within the vocabulary; no padding, so
masks are all ones), the same advantages (group-normalised random rewards), the same old
logprobs (the base model's own, plus seeded noise so that some ratios clip), the same
initial LoRA weights, clip range (0.2, 0.28), no KL, the same AdamW settings, fp32 on the
CPU (bf16 on a GPU, as PolicyModel does), and the same torch thread count. TRL's
``loss_type`` "dapo" (default here) and "bnpo" normalise token-level over the step's sampled
tokens, as burnish does, so the losses of each step should agree: both are printed.

Each side runs in its own process, one after the other: burnish in .venv, TRL in its own
venv (bench/results/.trl-venv, git-ignored; made here when missing, with TRL pinned and
torch/transformers/peft/accelerate at .venv's versions). Warm-up steps, then ``--steps``
timed steps; the median is reported. Tokens are sampled (completion) tokens. Writes
bench/results/vs_trl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRL_VERSION = "1.16.0"
TRL_VENV = ROOT / "bench" / "results" / ".trl-venv"
SAME_AS_OURS = ("torch", "transformers", "peft", "accelerate")  # installed in TRL's venv at .venv's versions
RESULTS = ROOT / "bench" / "results" / "vs_trl.json"


# ---- the main process (.venv): model, batch, initial LoRA, then the two workers ----------------
def ensure_trl_venv() -> Path:
    from importlib import metadata

    py = TRL_VENV / "bin" / "python"
    wanted = {"trl": TRL_VERSION} | {name: metadata.version(name).split("+")[0] for name in SAME_AS_OURS}
    probe = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n).split('+')[0] for n in sys.argv[1:]}))"
    try:
        have = json.loads(subprocess.run([str(py), "-c", probe, *wanted], capture_output=True, text=True, check=True).stdout)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError):
        have = {}
    if have != wanted:
        print(f"installing {wanted} into {TRL_VENV.relative_to(ROOT)} ...", flush=True)
        if not py.exists():
            subprocess.run([sys._base_executable, "-m", "venv", str(TRL_VENV)], check=True)
        pins = [f"{n}=={v}" for n, v in wanted.items()]
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"torch=={wanted['torch']}"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins], check=True)
    return py


def prepare(args: argparse.Namespace, work: Path) -> dict:
    """The spec both workers read: model path, settings, the batch, and the initial LoRA weights."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gateway.policies import LoraSettings, TrainSettings
    from trainer.grpo import group_advantages
    from trainer.tiny_model import make_tiny_model

    model_path = Path(args.model) if args.model else make_tiny_model(work / "tiny", seed=0)
    vocab = len(AutoTokenizer.from_pretrained(model_path))
    n, seq_len = args.groups * args.group_size, args.prompt_len + args.completion_len
    lora = LoraSettings(rank=args.rank, alpha=2 * args.rank)
    train = TrainSettings(learning_rate=args.lr, micro_batch_tokens=max(8192, n * seq_len), max_seq_len=max(4096, seq_len))
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, vocab, (args.groups, args.prompt_len), generator=gen).repeat_interleave(args.group_size, 0)
    completions = torch.randint(0, vocab, (n, args.completion_len), generator=gen)
    rewards = torch.rand(args.groups, args.group_size, generator=gen)
    advantages = torch.cat([group_advantages(r, scale=train.scale_advantages, eps=train.advantage_eps) for r in rewards])
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():  # the base model's logprob of each completion token (LoRA B starts at 0: the policy's too)
        ids = torch.cat([prompts, completions], 1)
        logits = base(input_ids=ids).logits[:, args.prompt_len - 1 : -1].float()
        old = logits.gather(-1, completions[..., None]).squeeze(-1) - logits.logsumexp(-1)
        old += args.logprob_noise * torch.randn(old.shape, generator=gen)
    torch.manual_seed(args.seed)
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    save_file(get_peft_model_state_dict(get_peft_model(base, config)), str(work / "lora_init.safetensors"))
    return {
        "model": str(model_path), "lora_init": str(work / "lora_init.safetensors"), "threads": args.threads, "warmup": args.warmup,
        "steps": args.steps, "loss_type": args.loss_type, "seed": args.seed, "group_size": args.group_size,
        "lora": {"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout, "target_modules": list(lora.target_modules)},
        "train": {"learning_rate": train.learning_rate, "micro_batch_tokens": train.micro_batch_tokens, "max_seq_len": train.max_seq_len,
                  "adam_betas": list(train.adam_betas), "weight_decay": train.weight_decay, "grad_clip": train.grad_clip,
                  "clip_eps_low": train.clip_eps_low, "clip_eps_high": train.clip_eps_high, "kl_coef": train.kl_coef},
        "prompt_ids": prompts.tolist(), "completion_ids": completions.tolist(), "old_logprobs": old.tolist(), "advantages": advantages.tolist(),
    }


# ---- the workers: build a stepper, time it ----------------------------------------------------
def ours_stepper(spec: dict):
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT))
    from peft import set_peft_model_state_dict

    from gateway.policies import LoraSettings, TrainSettings
    from trainer.policy_model import PolicyModel
    from trainer.sequences import Sequence

    lora = LoraSettings(**{**spec["lora"], "target_modules": tuple(spec["lora"]["target_modules"])})
    train = TrainSettings(**{**spec["train"], "adam_betas": tuple(spec["train"]["adam_betas"])})
    policy = PolicyModel(spec["model"], lora, train)
    set_peft_model_state_dict(policy.model, load_file(spec["lora_init"], device=str(policy.device)))
    items = []
    for p, c, lp, a in zip(spec["prompt_ids"], spec["completion_ids"], spec["old_logprobs"], spec["advantages"]):
        seq = Sequence()
        seq.add(p, c, lp)
        items.append((seq, a))

    def step() -> tuple[float, int]:
        metrics = policy.step(items)
        return metrics["loss"], int(metrics["tokens"])

    return step, {"device": str(policy.device)}


def trl_stepper(spec: dict, work: Path):
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda, t = torch.cuda.is_available(), spec["train"]
    dtype = torch.bfloat16 if cuda else torch.float32  # as PolicyModel
    n = len(spec["completion_ids"])
    config = trl.GRPOConfig(
        output_dir=str(work / "trl-out"), report_to="none", use_cpu=not cuda, bf16=cuda, gradient_checkpointing=False, seed=spec["seed"],
        per_device_train_batch_size=n, num_generations=spec["group_size"],
        max_completion_length=len(spec["completion_ids"][0]), loss_type=spec["loss_type"], beta=t["kl_coef"],
        epsilon=t["clip_eps_low"], epsilon_high=t["clip_eps_high"], learning_rate=t["learning_rate"], optim="adamw_torch",
        adam_beta1=t["adam_betas"][0], adam_beta2=t["adam_betas"][1], weight_decay=t["weight_decay"], max_grad_norm=t["grad_clip"],
    )
    lora = spec["lora"]
    peft_config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"], target_modules=lora["target_modules"], task_type="CAUSAL_LM")
    trainer = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config, train_dataset=Dataset.from_dict({"prompt": ["hi"] * n}), processing_class=AutoTokenizer.from_pretrained(spec["model"]), peft_config=peft_config,
    )
    model = trainer.model
    device = next(model.parameters()).device
    set_peft_model_state_dict(model, load_file(spec["lora_init"], device=str(device)))
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps  # (1) set by Trainer.train(), which we bypass
    model.train()
    completion_ids = torch.tensor(spec["completion_ids"], device=device)
    completion_mask = torch.ones_like(completion_ids)
    prompt_ids = torch.tensor(spec["prompt_ids"], device=device)
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": torch.tensor(spec["advantages"], device=device), "old_per_token_logps": torch.tensor(spec["old_logprobs"], device=device),
        "num_items_in_batch": completion_mask.sum(),
    }

    def step() -> tuple[float, int]:
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        trainer.accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return loss.item(), int(completion_mask.sum())

    return step, {"device": str(device), "trl": trl.__version__, "optimizer": type(trainer.optimizer).__name__}


def worker(side: str, spec_path: Path, out_path: Path) -> None:
    import torch

    spec = json.loads(spec_path.read_text())
    torch.set_num_threads(spec["threads"])
    step, info = ours_stepper(spec) if side == "ours" else trl_stepper(spec, spec_path.parent)
    losses, times, tokens = [], [], 0
    for i in range(spec["warmup"] + spec["steps"]):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss, tokens = step()  # .item() inside: the step has finished
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    from importlib import metadata

    versions = {name: metadata.version(name) for name in ("torch", "transformers", "peft")}
    out_path.write_text(json.dumps({**info, "versions": versions, "threads": torch.get_num_threads(), "tokens": tokens, "losses": losses, "times": times}))


def run_worker(python: str, side: str, spec_path: Path) -> dict:
    out = spec_path.parent / f"{side}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    subprocess.run([python, __file__, "--worker", side, "--spec", str(spec_path), "--out", str(out)], check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a local HF causal LM (default: the tiny model, seed 0)")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--completion-len", type=int, default=128)
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank (alpha = 2 x rank)")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--logprob-noise", type=float, default=0.1, help="std of the noise added to the old logprobs")
    ap.add_argument("--loss-type", default="dapo", choices=("dapo", "bnpo"), help="TRL's; both are token-level like burnish's")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=2, help="processes per side, alternating")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", choices=("ours", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.spec, args.out)
        return 0

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sys.path.insert(0, str(ROOT))
    trl_python = ensure_trl_venv()
    with tempfile.TemporaryDirectory(prefix="burnish-vs-trl-") as tmp:
        spec = prepare(args, Path(tmp))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        runs: dict[str, list[dict]] = {"burnish": [], "TRL": []}
        for _ in range(args.rounds):  # alternate, so that a change in the machine's load hits both sides alike
            runs["burnish"].append(run_worker(sys.executable, "ours", spec_path))
            runs["TRL"].append(run_worker(str(trl_python), "trl", spec_path))
    res = {}
    for name, rs in runs.items():
        timed = [t for r in rs for t in r["times"][args.warmup:]]
        res[name] = {**rs[0], "rounds": rs, "median_s": statistics.median(timed), "min_s": min(timed), "max_s": max(timed)}
    ours, theirs = res["burnish"], res["TRL"]
    n = args.groups * args.group_size
    print(f"\nmodel {args.model or 'tiny (2 layers, 128 wide, seed 0)'}; batch {args.groups} groups x {args.group_size}, prompt {args.prompt_len} + completion {args.completion_len} tokens"
          f" ({n * (args.prompt_len + args.completion_len)} tokens in, {n * args.completion_len} sampled); LoRA r={args.rank}; TRL {theirs['trl']} loss_type={args.loss_type}"
          f"; device {ours['device']}; {ours['threads']} threads; torch {ours['versions']['torch']}, transformers {ours['versions']['transformers']}, peft {ours['versions']['peft']}")
    print(f"{args.rounds} rounds x ({args.warmup} warm-up + {args.steps} timed steps) per side, alternating processes\n")
    print(f"  {'side':<8}{'tokens/step':>12}{'s/step (median)':>17}{'min':>9}{'max':>9}{'tokens/s':>11}")
    for name, r in res.items():
        r["tokens_per_s"] = r["tokens"] / r["median_s"]
        print(f"  {name:<8}{r['tokens']:>12}{r['median_s']:>17.4f}{r['min_s']:>9.4f}{r['max_s']:>9.4f}{r['tokens_per_s']:>11.0f}")
    speed = ours["tokens_per_s"] / theirs["tokens_per_s"]
    print(f"\n  ratio burnish / TRL (tokens/s): {speed:.2f}")
    diffs = [abs(a - b) for a, b in zip(ours["losses"], theirs["losses"])]
    print(f"  loss, step 1: burnish {ours['losses'][0]:+.6f}  TRL {theirs['losses'][0]:+.6f}; last step: burnish {ours['losses'][-1]:+.6f}"
          f"  TRL {theirs['losses'][-1]:+.6f}; largest |difference| over {len(diffs)} steps {max(diffs):.2e}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "ratio_tokens_per_s": speed}
    RESULTS.write_text(json.dumps({"meta": meta, **res}, indent=2, default=str))
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
