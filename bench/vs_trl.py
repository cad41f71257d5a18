"""One burnish GRPO optimizer step against TRL's, on the same model and the same batch.

Run from the repository root (about a minute on the tiny model; the first run also builds
TRL's venv, a minute or two more)::

    .venv/bin/python bench/vs_trl.py [--groups 2 --group-size 8 --prompt-len 40 --completion-len 128]
    .venv/bin/python bench/vs_trl.py --model /path/to/local/hf/model   # any local HF causal LM
    .venv/bin/python bench/vs_trl.py --model smollm2 --steps 5 --warmup 1 --rounds 2   # the demo's model
    python3 bench/vs_trl.py --model qwen2.5-7b --trl-python python3 ...   # on a GPU: a random model of that shape

On a GPU (CUDA visible to torch; ``CUDA_VISIBLE_DEVICES=`` keeps it on the CPU) both sides and
the batch's preparation run there in bf16, as ``PolicyModel`` does. ``--model qwen2.5-1.5b`` or
``qwen2.5-7b`` builds a model of that shape (layers, widths, heads, vocabulary) with random
weights, no download; ``--trl-python`` runs TRL's side in a python that already has TRL (no
venv is made); a checkout that is not installed is made importable through a folder of links.

One step, each side: forward, GRPO loss, backward, grad clip, AdamW step, zero_grad.

* burnish: ``PolicyModel.step(items)`` (trainer/policy_model.py), which also pads the
  sequences into tensors; one micro-batch (micro_batch_tokens >= the batch); the LM head only
  at the sampled tokens, a chunk of positions at a time (trainer/logprobs.py); on a GPU the
  forward under bf16 autocast.
* TRL: a real ``trl.GRPOTrainer`` (no vLLM, no generation) with the same peft LoRA:
  ``trainer.compute_loss`` on the ``inputs`` dict its ``_generate_and_score_completions``
  would make (fused LM head over completion tokens only, logprobs and entropy, the clipped
  loss, its metrics), ``accelerator.backward``, ``accelerator.clip_grad_norm_``, and the
  trainer's own AdamW.

Same on both sides: token ids (seeded random, no padding), advantages (group-normalised random
rewards), old logprobs (the base model's plus seeded noise, so that some ratios clip), initial
LoRA weights, clip range (0.2, 0.28), no KL, AdamW settings, dtype (fp32 on the CPU, bf16 on a
GPU, where both run the forward under bf16 autocast with LoRA's weights and AdamW's state in
fp32), torch threads, gradient checkpointing (``--checkpointing``: off by default on both
sides; TRL's own default turns it on). TRL's loss_type "dapo" (default) or "bnpo" is
token-level over the step's sampled tokens like burnish's, so every step's two losses should
agree: they are compared.

How close to the machine's limit: each side counts its step's floating-point operations
once (torch's ``FlopCounterMode``: every matmul and attention kernel the step runs, forward
and backward), and the burnish worker times a plain square matmul in the same dtype with
the same threads (fp32 2048^3 on the CPU, bf16 8192^3 on a GPU). Reported: the step's
achieved FLOP/s and its share of the matmul's; on a GPU also the most memory allocated
during the timed steps (weights included).

Sides alternate in fresh processes (``--rounds``): burnish in .venv, TRL in
bench/results/.trl-venv (git-ignored, made when missing: TRL pinned; torch, transformers, peft,
accelerate at .venv's versions) unless ``--trl-python`` names one. Reported: the median over
all timed steps, in sampled (completion) tokens per second; other processes' CPU share,
flagged over 10%. Writes bench/results/vs_trl.json (``--results``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRL_VERSION = "1.16.0"
TRL_VENV = ROOT / "bench" / "results" / ".trl-venv"
RESULTS = ROOT / "bench" / "results" / "vs_trl.json"
OTHERS_MAX = 0.10  # a run beside other processes using more of the CPU than this is flagged
OPTIONS = (  # flag, default, help
    ("--groups", 2, "prompt groups in the batch"),
    ("--group-size", 8, "completions per prompt"),
    ("--prompt-len", 40, "prompt tokens"),
    ("--completion-len", 128, "completion (sampled) tokens"),
    ("--rank", 8, "LoRA rank (alpha = 2 x rank)"),
    ("--lr", 5e-3, "learning rate"),
    ("--logprob-noise", 0.1, "std of the noise added to the old logprobs"),
    ("--warmup", 3, "untimed steps per process"),
    ("--steps", 30, "timed steps per process"),
    ("--rounds", 3, "processes per side, alternating"),
    ("--threads", os.cpu_count() or 1, "torch threads, both sides"),
    ("--seed", 0, "batch and LoRA init"),
    ("--checkpointing", "off", "activation checkpointing on both sides: off or on"),
    ("--ours-checkpointing", "", "burnish's, where not --checkpointing: off, on or selective; several, comma-separated, run as sides of their own"),
    ("--prompt-sharing", "auto", "burnish's BURNISH_TRAINER_PROMPT_SHARING: auto trains a group's prompt once (TRL has no such thing), off one sequence a row"),
    ("--quiet-wait", 300.0, "seconds to wait, before each process, for other processes to go quiet"),
)
# Random-weight models of real models' shapes (their config.json's numbers), for a GPU: nothing
# to download, and the step's cost depends on the shape alone.
SHAPES = {
    "qwen2.5-1.5b": dict(  # Qwen2.5-1.5B-Instruct
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2-tiny": dict(  # not a real model: for trying the GPU path's flow (bench/gpu.sh --tiny) anywhere
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(  # Qwen2.5-7B-Instruct
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}
LAYERS = ("core", "store", "serving", "telemetry", "gateway", "trainer", "migrations", "cli")  # pyproject's package-dir


# ---- the main process (.venv): TRL's venv, then the model, the batch and the initial LoRA ------
def ensure_trl_venv() -> Path:
    from importlib import metadata

    py = TRL_VENV / "bin" / "python"
    wanted = {"trl": TRL_VERSION} | {n: metadata.version(n).split("+")[0] for n in ("torch", "transformers", "peft", "accelerate")}
    probe = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n).split('+')[0] for n in sys.argv[1:]}))"
    try:
        have = json.loads(subprocess.run([str(py), "-c", probe, *wanted], capture_output=True, text=True, check=True).stdout)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError):
        have = {}
    if have != wanted:
        print(f"installing {wanted} into {TRL_VENV.relative_to(ROOT)} ...", flush=True)
        if not py.exists():
            subprocess.run([sys._base_executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"torch=={wanted['torch']}"], check=True)  # first, alone: the local wheel
        subprocess.run([*pip, *(f"{n}=={v}" for n, v in wanted.items())], check=True)
    return py


def import_path() -> str | None:
    """A folder that makes ``burnish_server`` importable from this checkout when it is not
    installed (a bare python, e.g. on a GPU machine): burnish_server/<layer> links to each
    top-level folder, as pyproject's package-dir maps them. None when it is installed."""
    import importlib.util

    if importlib.util.find_spec("burnish_server") is not None:
        return None
    top = Path(tempfile.mkdtemp(prefix="burnish-import-"))
    atexit.register(shutil.rmtree, top, ignore_errors=True)
    (top / "burnish_server").mkdir()
    for layer in LAYERS:
        (top / "burnish_server" / layer).symlink_to(ROOT / layer)
    return str(top)


def shape_model(name: str, path: Path, device: str, dtype, seed: int):
    """A random model of a named shape (SHAPES), saved to ``path`` with a small tokenizer; returned loaded."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from burnish_server.trainer.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(1024)  # only its pad id is read: the batch's ids span the model's vocabulary
    config = Qwen2Config(**SHAPES[name], max_position_embeddings=32768, rms_norm_eps=1e-6, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialised in place, in the step's dtype: a 7B model in fp32 is 30 GB
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def prepare(args: argparse.Namespace, work: Path) -> dict:
    """What both workers read: model, settings, the batch, the initial LoRA weights (a file).

    On a GPU the model runs there in bf16 (its logprobs of the batch) and is let go after."""
    import msgspec
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from burnish_server.core.learning.policies import LoraSettings, TrainSettings
    from burnish_server.trainer.grpo import group_advantages
    from burnish_server.trainer.tiny_model import make_tiny_model

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    base = None
    if args.model in SHAPES:
        model = work / args.model
        base = shape_model(args.model, model, device, dtype, args.seed)
    elif args.model == "smollm2":  # the embedded demo model, converted once from its GGUF file
        model = ROOT / "bench" / "results" / ".smollm2"
        if not (model / "config.json").exists():
            from burnish_server.serving.models import embedded_gguf
            from burnish_server.trainer.gguf_model import convert_gguf

            convert_gguf(embedded_gguf(), model)
    else:
        model = Path(args.model) if args.model else make_tiny_model(work / "tiny", seed=0)
    n, seq_len = args.groups * args.group_size, args.prompt_len + args.completion_len
    lora = LoraSettings(rank=args.rank, alpha=2 * args.rank)
    train = TrainSettings(learning_rate=args.lr, micro_batch_tokens=max(8192, n * seq_len), max_seq_len=max(4096, seq_len))
    vocab = SHAPES[args.model]["vocab_size"] if args.model in SHAPES else len(AutoTokenizer.from_pretrained(model))
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, vocab, (args.groups, args.prompt_len), generator=gen).repeat_interleave(args.group_size, 0)
    completions = torch.randint(0, vocab, (n, args.completion_len), generator=gen)
    rewards = torch.rand(args.groups, args.group_size, generator=gen)
    advantages = torch.cat([group_advantages(r, scale=train.scale_advantages, eps=train.advantage_eps) for r in rewards])
    if base is None:
        base = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    with torch.no_grad():  # the base model's logprob of each completion token: the policy's at step 0 (LoRA B = 0)
        ids = torch.cat([prompts, completions], 1).to(device)
        logits = base(input_ids=ids, logits_to_keep=args.completion_len + 1).logits[:, :-1].float()
        old = (logits.gather(-1, ids[:, args.prompt_len :, None]).squeeze(-1) - logits.logsumexp(-1)).cpu()
        del logits
        old += args.logprob_noise * torch.randn(old.shape, generator=gen)
    torch.manual_seed(args.seed)
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    save_file(get_peft_model_state_dict(get_peft_model(base, config)), str(work / "lora_init.safetensors"))
    return {
        "model": str(model),
        "lora_init": str(work / "lora_init.safetensors"),
        "lora": msgspec.to_builtins(lora),
        "train": msgspec.to_builtins(train),
        **{k: getattr(args, k) for k in ("threads", "warmup", "steps", "loss_type", "seed", "group_size", "checkpointing", "profile", "prompt_sharing")},
        "prompt_ids": prompts.tolist(),
        "completion_ids": completions.tolist(),
        "old_logprobs": old.tolist(),
        "advantages": advantages.tolist(),
    }


# ---- the workers: one side each, timed ----------------------------------------------------------
def ours_stepper(spec: dict):
    import msgspec
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from burnish_server.core.learning.policies import LoraSettings, TrainSettings
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.policy_model import PolicyModel
    from burnish_server.trainer.sequences import Sequence

    base = SharedBase(spec["model"], holding=Holding(checkpointing=spec["checkpointing"], prompt_sharing=spec.get("prompt_sharing", "auto")))
    policy = PolicyModel(base, msgspec.convert(spec["lora"], LoraSettings), msgspec.convert(spec["train"], TrainSettings))
    set_peft_model_state_dict(policy.model, load_file(spec["lora_init"], device=str(policy.device)), adapter_name=policy.adapter)
    items = []
    for prompt, completion, old, advantage in zip(spec["prompt_ids"], spec["completion_ids"], spec["old_logprobs"], spec["advantages"]):
        items.append((seq := Sequence(), advantage))
        seq.add(prompt, completion, old)

    def step() -> tuple[float, int]:
        metrics = policy.step(items)
        return metrics.loss, int(metrics.tokens)

    return step, {"device": str(policy.device), "checkpointing": spec["checkpointing"] if base.checkpointing else "off", "prompt_sharing": base.shares_prompts}


def trl_stepper(spec: dict, work: Path):
    import torch
    import trl
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda, t, lora, n = torch.cuda.is_available(), spec["train"], spec["lora"], len(spec["completion_ids"])
    config = trl.GRPOConfig(  # TRL's defaults differ here: gradient_checkpointing=True, bf16=True
        output_dir=str(work / "trl-out"),
        report_to="none",
        use_cpu=not cuda,
        bf16=cuda,
        gradient_checkpointing=spec["checkpointing"] == "on",
        gradient_checkpointing_kwargs={"use_reentrant": False},  # as burnish's
        seed=spec["seed"],
        per_device_train_batch_size=n,
        num_generations=spec["group_size"],
        max_completion_length=len(spec["completion_ids"][0]),
        loss_type=spec["loss_type"],
        beta=t["kl_coef"],
        epsilon=t["clip_eps_low"],
        epsilon_high=t["clip_eps_high"],
        learning_rate=t["learning_rate"],
        optim="adamw_torch",
        adam_beta1=t["adam_betas"][0],
        adam_beta2=t["adam_betas"][1],
        weight_decay=t["weight_decay"],
        max_grad_norm=t["grad_clip"],
    )
    trainer = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.bfloat16 if cuda else torch.float32),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=config,
        # Given a fingerprint, datasets does not hash the table with dill, which pyarrow 26 breaks ("Can't pickle MonthDayNano").
        train_dataset=Dataset(InMemoryTable.from_pydict({"prompt": ["hi"] * n}), fingerprint="vs-trl"),
        processing_class=AutoTokenizer.from_pretrained(spec["model"]),
        peft_config=LoraConfig(
            r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"], target_modules=lora["target_modules"], task_type="CAUSAL_LM"
        ),
    )
    model, device = trainer.model, trainer.accelerator.device
    set_peft_model_state_dict(model, load_file(spec["lora_init"], device=str(device)))
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(), which is bypassed here
    model.train()
    keys = {"prompt_ids": "prompt_ids", "completion_ids": "completion_ids", "advantages": "advantages", "old_per_token_logps": "old_logprobs"}
    inputs = {key: torch.tensor(spec[ours], device=device) for key, ours in keys.items()}
    inputs |= {"prompt_mask": torch.ones_like(inputs["prompt_ids"]), "completion_mask": torch.ones_like(inputs["completion_ids"])}
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()

    def step() -> tuple[float, int]:
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        trainer.accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return loss.item(), int(inputs["num_items_in_batch"])

    return step, {"device": str(device), "trl": trl.__version__, "optimizer": type(trainer.optimizer).__name__, "checkpointing": spec["checkpointing"]}


def worker(side: str, spec_path: Path, out_path: Path) -> None:
    from importlib import metadata

    import torch

    spec = json.loads(spec_path.read_text())
    torch.set_num_threads(spec["threads"])
    step, info = ours_stepper(spec) if side == "ours" else trl_stepper(spec, spec_path.parent)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        info |= {"gpu": torch.cuda.get_device_name(), "gpu_memory": torch.cuda.get_device_properties(0).total_memory}
    losses, times = [], []
    for _ in range(spec["warmup"] + spec["steps"]):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss, tokens = step()  # ends with .item(): the step has finished
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    info["peak_memory"] = torch.cuda.max_memory_allocated() if cuda else None  # the steps' most, weights included
    if spec.get("profile"):
        info["profile"] = profile_step(step, cuda)
    flops = step_flops(step)
    peak = matmul_flops_per_s() if side == "ours" else None
    versions = {name: metadata.version(name) for name in ("torch", "transformers", "peft")}
    out_path.write_text(
        json.dumps(
            {
                **info,
                "versions": versions,
                "threads": torch.get_num_threads(),
                "tokens": tokens,
                "losses": losses,
                "times": times,
                "flops": flops,
                "matmul_flops_per_s": peak,
            }
        )
    )


def profile_step(step, cuda: bool, top: int = 25) -> dict:
    """One more step under torch's profiler: the operations that took the most device time (CPU
    time without a GPU), with their calls, and the step's total of it."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        step()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    return {
        "total_ms": sum(getattr(e, key) for e in events) / 1e3,
        "top": [{"name": e.key, "ms": getattr(e, key) / 1e3, "calls": e.count} for e in events[:top]],
    }


def step_flops(step) -> int | None:
    """The floating-point operations of one more step, as torch counts them (untimed); None
    where the counter fails (the timings stand without it)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False, custom_mapping=extra_flop_formulas()) as counter:
            step()
    except Exception as exc:  # an op that torch's counter cannot take: no count, the timings stand
        print(f"  FLOP count failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None
    return counter.get_total_flops()


def extra_flop_formulas() -> dict:
    """FlopCounterMode's formulas where torch's own fail on a GPU step:

    * the fused attention kernels where keys and values have fewer heads than queries
      (grouped-query attention, ``enable_gqa``: Qwen2.5's 12 or 28 query heads share 2 or 4),
      which torch's formulas reject. Each query head's work is counted, as if keys and values
      were repeated to its heads: that is the work done.
    * ``addmm``/``baddbmm`` with ``out_dtype`` (TRL's chunked LM head accumulates bf16
      products in fp32 so), whose extra argument torch's formulas take for the output's shape."""
    import torch
    from torch.utils import flop_counter

    def heads(shape, n: int) -> tuple:  # [batch, heads, positions, head dim]
        return (shape[0], n, *shape[2:])

    def forward(query_shape, key_shape, value_shape, *_, **__) -> int:
        n = query_shape[1]
        return flop_counter.sdpa_flop_count(query_shape, heads(key_shape, n), heads(value_shape, n))

    def backward(grad_out_shape, query_shape, key_shape, value_shape, *_, **__) -> int:
        n = query_shape[1]
        return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, heads(key_shape, n), heads(value_shape, n))

    def addmm(self_shape, a_shape, b_shape, *_, **__) -> int:
        return flop_counter.mm_flop(a_shape, b_shape)

    def baddbmm(self_shape, a_shape, b_shape, *_, **__) -> int:
        return flop_counter.bmm_flop(a_shape, b_shape)

    aten = torch.ops.aten
    mapping = {aten.addmm: addmm, aten.baddbmm: baddbmm}
    for kernel in ("efficient", "flash", "cudnn"):
        name = f"_scaled_dot_product_{kernel}_attention"
        if hasattr(aten, name):
            mapping[getattr(aten, name)] = forward
            mapping[getattr(aten, f"{name}_backward")] = backward
    return mapping


def matmul_side() -> int:
    """The side of the square matmul taken as the machine's peak: 8192 on a GPU, 2048 on the CPU."""
    import torch

    return 8192 if torch.cuda.is_available() else 2048


def matmul_flops_per_s(repeats: int = 10) -> float:
    """The best FLOP/s of an n x n matmul in the step's dtype (bf16 on a GPU, fp32 on the CPU)."""
    import torch

    cuda, n = torch.cuda.is_available(), matmul_side()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + (3 if cuda else 0)):  # on a GPU, three to warm up (clocks, cuBLAS's choice)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        c = a @ b
        if cuda:
            torch.cuda.synchronize()
        else:
            c.sum().item()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def release_gpu() -> None:
    """Let go of what prepare() left on the GPU (the model), so that the workers have all of it."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        print(f"  main process: {torch.cuda.memory_allocated() / 2**20:.0f} MiB still allocated on the GPU", flush=True)


# ---- other processes: the machine may be shared ------------------------------------------------
def cpu_clock() -> tuple[float, float, float]:
    """(wall s, CPU s the machine has been busy, CPU s of our finished children)."""
    fields = Path("/proc/stat").read_text().split("\n")[0].split()[1:9]  # user nice system idle iowait irq softirq steal
    busy = sum(int(x) for i, x in enumerate(fields) if i not in (3, 4)) / os.sysconf("SC_CLK_TCK")
    return time.monotonic(), busy, os.times().children_user + os.times().children_system


def others_share(start: tuple[float, float, float]) -> float:
    (w0, b0, c0), (w1, b1, c1) = start, cpu_clock()  # busy CPU, less what our workers used
    return max(0.0, (b1 - b0) - (c1 - c0)) / ((w1 - w0) * (os.cpu_count() or 1))


def run_worker(python: str, side: str, spec_path: Path, quiet_wait: float, path: str | None) -> dict:
    deadline = time.monotonic() + quiet_wait
    while True:  # wait (a while) for other processes to go quiet
        start = cpu_clock()
        time.sleep(2)
        if (share := others_share(start)) <= OTHERS_MAX or time.monotonic() >= deadline:
            break
        print(f"  other processes use {share:.0%} of the CPU: waiting for quiet ...", flush=True)
    out, start = spec_path.parent / f"{side}.json", cpu_clock()
    pythonpath = os.pathsep.join(p for p in (path, str(ROOT), os.environ.get("PYTHONPATH")) if p)  # a given one kept: carried wheels
    env = {**os.environ, "PYTHONPATH": pythonpath, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    subprocess.run([python, __file__, "--worker", side, "--spec", str(spec_path), "--out", str(out)], check=True, env=env, cwd=ROOT)
    return {**json.loads(out.read_text()), "others": others_share(start)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model",
        help=f"a local HF causal LM, smollm2 (the demo's model), or a shape with random weights: {', '.join(SHAPES)} (default: the tiny model, seed 0)",
    )
    ap.add_argument("--trl-python", help="a python that has TRL, for TRL's side (default: bench/results/.trl-venv, made when missing)")
    ap.add_argument("--results", type=Path, default=RESULTS, help=f"the JSON written (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--loss-type", default="dapo", choices=("dapo", "bnpo"), help="TRL's; both token-level, as burnish's")
    ap.add_argument("--profile", action="store_true", help="profile one more step per side: the operations that took the most device time")
    for flag, default, text in OPTIONS:
        ap.add_argument(flag, type=type(default), default=default, help=f"{text} (default {default})")
    for hidden in ("--worker", "--spec", "--out"):  # a worker process: one side, timed
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, Path(args.spec), Path(args.out))
        return 0

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sys.path.insert(0, str(ROOT))
    if path := import_path():
        sys.path.insert(0, path)
    trl_python = args.trl_python or str(ensure_trl_venv())
    # burnish's sides: "burnish" (its first checkpointing), then "burnish (<mode>)" for each other one.
    modes = [m.strip() for m in args.ours_checkpointing.split(",") if m.strip()] or [args.checkpointing]
    ours_sides = {("burnish" if i == 0 else f"burnish ({mode})"): mode for i, mode in enumerate(modes)}
    runs: dict[str, list[dict]] = {name: [] for name in [*ours_sides, "TRL"]}
    with tempfile.TemporaryDirectory(prefix="burnish-vs-trl-") as tmp:
        spec = prepare(args, Path(tmp))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        specs = {}
        for i, (name, mode) in enumerate(ours_sides.items()):
            specs[name] = Path(tmp) / f"spec-{i}.json"
            specs[name].write_text(json.dumps(spec | {"checkpointing": mode}))
        release_gpu()
        for _ in range(args.rounds):  # alternating, so that a change in the machine's load hits both sides
            for name in ours_sides:
                runs[name].append(run_worker(sys.executable, "ours", specs[name], args.quiet_wait, path))
            runs["TRL"].append(run_worker(trl_python, "trl", spec_path, args.quiet_wait, path))
    res = {}
    for name, rs in runs.items():
        timed = [t for r in rs for t in r["times"][args.warmup :]]
        med = statistics.median(timed)
        res[name] = {
            **rs[0],
            "rounds": rs,
            "median_s": med,
            "min_s": min(timed),
            "max_s": max(timed),
            "tokens_per_s": rs[0]["tokens"] / med,
            "flops_per_s": rs[0]["flops"] / med if rs[0]["flops"] is not None else None,
            "others": max(r["others"] for r in rs),
            "peak_memory": max(r["peak_memory"] for r in rs) if rs[0]["peak_memory"] is not None else None,
        }
    ours, theirs = res["burnish"], res["TRL"]
    n, v = args.groups * args.group_size, ours["versions"]
    print(
        f"\nmodel {args.model or 'tiny (Qwen2, 2 layers x 128, seed 0)'}; {args.groups} groups x {args.group_size}, prompt {args.prompt_len} + completion "
        f"{args.completion_len} tokens ({n * (args.prompt_len + args.completion_len)} tokens in, {n * args.completion_len} sampled); LoRA r={args.rank}; "
        f"activation checkpointing: TRL {args.checkpointing}, burnish {', '.join(modes)}; "
        f"TRL {theirs['trl']} loss_type={args.loss_type}; device {ours['device']}{' (' + ours['gpu'] + ')' if 'gpu' in ours else ''}; "
        f"torch {v['torch']}, transformers {v['transformers']}, peft {v['peft']}"
    )
    print(f"{args.rounds} rounds x ({args.warmup} warm-up + {args.steps} timed steps) per side; threads: burnish {ours['threads']}, TRL {theirs['threads']}\n")
    gpu = ours["peak_memory"] is not None
    print(f"  {'side':<8}{'tokens/step':>12}{'s/step (median)':>17}{'min':>9}{'max':>9}{'tokens/s':>11}{'others':>8}" + (f"{'peak GiB':>10}" if gpu else ""))
    for name, r in res.items():
        mem = f"{r['peak_memory'] / 2**30:>10.1f}" if gpu else ""
        print(f"  {name:<8}{r['tokens']:>12}{r['median_s']:>17.4f}{r['min_s']:>9.4f}{r['max_s']:>9.4f}{r['tokens_per_s']:>11.0f}{r['others']:>8.0%}{mem}")
    ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
    print(f"\n  burnish / TRL (tokens/s): {ratio:.2f}")
    for name in list(ours_sides)[1:]:
        r = res[name]
        r["ratio_tokens_per_s"] = r["tokens_per_s"] / theirs["tokens_per_s"]
        memory = f", peak memory {r['peak_memory'] / theirs['peak_memory']:.2f}x TRL's" if gpu else ""
        print(f"  {name} / TRL (tokens/s): {r['ratio_tokens_per_s']:.2f}{memory}")
    peak, side = max(r["matmul_flops_per_s"] for name in ours_sides for r in runs[name]), matmul_side()
    for name, r in res.items():
        if r["flops"] is None:
            print(f"  {name}: no FLOP count (torch's counter failed: see the worker's output)")
            continue
        r["peak_share"] = r["flops_per_s"] / peak
        print(
            f"  {name}: {r['flops'] / 1e9:.1f} GFLOP per step (torch's count), {r['flops_per_s'] / 1e9:.1f} GFLOP/s = "
            f"{r['peak_share']:.0%} of a plain {'bf16' if 'cuda' in r['device'] else 'fp32'} {side}x{side} matmul ({peak / 1e9:.1f} GFLOP/s)"
        )
    if args.profile:
        for name, r in res.items():
            prof = r["rounds"][0]["profile"]
            print(f"\n  {name}: one step's {'device' if gpu else 'CPU'} time {prof['total_ms']:.1f} ms; the most of it:")
            for e in prof["top"]:
                print(f"    {e['ms']:9.2f} ms {e['calls']:6d} x  {e['name'][:110]}")
    if max(ours["others"], theirs["others"]) > OTHERS_MAX:
        print(f"  WARNING: other processes used over {OTHERS_MAX:.0%} of the CPU in a run ('others', the most of any round): figures skewed")
    diffs = [abs(a - b) for a, b in zip(ours["losses"], theirs["losses"])]
    print(
        f"  loss, step 1: burnish {ours['losses'][0]:+.6f}, TRL {theirs['losses'][0]:+.6f}; step {len(diffs)}: burnish {ours['losses'][-1]:+.6f}, "
        f"TRL {theirs['losses'][-1]:+.6f}; largest |difference| over {len(diffs)} steps {max(diffs):.1e}"
    )
    out = args.results.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    out.write_text(json.dumps(summary | {"ratio_tokens_per_s": ratio, "matmul_flops_per_s": peak, **res}, indent=2))
    print(f"\nwrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
