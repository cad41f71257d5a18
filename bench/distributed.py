"""The trainer on several ranks: speed of 2 ranks against 1, memory per rank under FSDP2 against
DDP, and how long a sequence fits with activation checkpointing against without.

Run from the repository root (a few minutes on SmolLM2-135M, on the CPU with gloo)::

    .venv/bin/python bench/distributed.py [--model smollm2] [--rows 16 --tokens 256]
    python3 bench/distributed.py --model qwen2.5-1.5b --nproc 8   # on a node of GPUs: a random model of that shape

Each setup runs under torchrun in fresh processes, one after another (``PolicyModel.step``,
trainer/policy_model.py, as ``burnish trainer --nproc N`` runs it, on a seeded random batch of
``--rows`` sequences of ``--tokens`` tokens, half of them sampled; LoRA r=16 on every linear):

* ``speed``: sampled tokens per second of one step, 1 rank against N under DDP, median of
  ``--steps`` timed steps after one warm-up. On the CPU, N ranks share the machine's cores
  with one rank (each rank gets cores / N threads), so the ratio says what splitting the
  batch and summing gradients cost, not what N devices gain: that takes a GPU per rank.
* ``memory``: bytes each rank holds, measured on its tensors (``to_local()`` of FSDP2's
  shards): parameters (the base's, the adapter's), gradients and optimizer state, after a
  step, under DDP and under FSDP2 on N ranks.
* ``packing``: one step's seconds with the batch packed against padded, under the base's own
  attention (SDPA on the CPU), in one process, alternating.
* ``kept``: the bytes the forward pass keeps for the backward (every tensor autograd saves,
  counted once per storage, the weights left out), with and without activation
  checkpointing, per context token and per sampled token, for each of ``--kept-shapes``
  (SmolLM2-135M, Qwen2.5-1.5B and 7B) in bf16: measured on the shape cut to 1 and 2 decoder
  layers, and extrapolated per layer to the whole depth. With the weights' size, that gives
  the longest sequence a device takes: ``longest_on_80gb`` (90% of 80 GB; the base whole on
  the device, as under ddp; a quarter of the tokens sampled, as in an agent's trajectory).

Prints one JSON line per setup and a summary; writes bench/results/distributed.json.
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
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results" / "distributed.json"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build(args: argparse.Namespace, checkpointing: str = "off"):
    """This rank's model, as the trainer builds it."""
    from burnish_server.core.learning.policies import LoraSettings, TrainSettings
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.distributed import Ranks
    from burnish_server.trainer.policy_model import PolicyModel

    ranks = Ranks.from_env(args.parallel)
    train = TrainSettings(learning_rate=1e-5, micro_batch_tokens=args.rows * args.tokens, max_seq_len=max(args.tokens, 32768))
    base = SharedBase(args.path, ranks, Holding(checkpointing=checkpointing))  # type: ignore[arg-type]
    return PolicyModel(base, LoraSettings(rank=16, alpha=32, target_modules=LORA_TARGETS), train), ranks


def batch(vocab: int, rows: int, tokens: int, seed: int = 0) -> list:
    import torch

    from burnish_server.trainer.sequences import Sequence

    generator = torch.Generator().manual_seed(seed)
    items = []
    for row in range(rows):
        ids = torch.randint(5, vocab, (tokens,), generator=generator).tolist()
        sequence = Sequence()
        sequence.add(ids[: tokens // 2], ids[tokens // 2 :], None)
        items.append((sequence, 1.0 if row % 2 else -1.0))
    return items


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def speed(args: argparse.Namespace) -> dict:
    model, ranks = build(args)
    items = batch(model.model.config.vocab_size, args.rows, args.tokens)
    model.step(items)
    seconds = []
    for _ in range(args.steps):
        synchronize()
        t0 = time.perf_counter()
        model.step(items)
        synchronize()
        seconds.append(time.perf_counter() - t0)
    sampled = sum(s.sampled for s, _ in items)
    return {"ranks": ranks.world, "parallel": ranks.parallel, "step_s": statistics.median(seconds), "tokens_per_s": sampled / statistics.median(seconds)}


def packing(args: argparse.Namespace) -> dict:
    """One step's seconds with the batch padded and packed, alternating, under the base's own
    attention (SDPA on the CPU): what packing costs where no variable-length kernel is."""
    from burnish_server.core.learning.policies import LoraSettings, TrainSettings
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.policy_model import PolicyModel

    train = TrainSettings(learning_rate=1e-5, micro_batch_tokens=args.rows * args.tokens, max_seq_len=args.tokens)
    models = {
        mode: PolicyModel(SharedBase(args.path, holding=Holding(packing=mode)), LoraSettings(rank=16, alpha=32, target_modules=LORA_TARGETS), train)
        for mode in ("off", "on")
    }  # type: ignore[arg-type]
    assert models["on"].base.packs and not models["off"].base.packs
    items = batch(models["on"].model.config.vocab_size, args.rows, args.tokens)
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(args.steps + 1):
        for mode, model in models.items():
            t0 = time.perf_counter()
            model.step(items)
            if round_:  # the first, a warm-up
                seconds[mode].append(time.perf_counter() - t0)
    return {"padded_step_s": statistics.median(seconds["off"]), "packed_step_s": statistics.median(seconds["on"])}


def memory(args: argparse.Namespace) -> dict:
    from torch.distributed.tensor import DTensor

    model, ranks = build(args)
    model.step(batch(model.model.config.vocab_size, args.rows, args.tokens))
    model.step(batch(model.model.config.vocab_size, args.rows, args.tokens, seed=1))

    def nbytes(t) -> int:
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    seen: set[int] = set()
    params = {"base": 0, "adapter": 0}
    for p in model.model.parameters():
        if id(p) in seen:  # tied weights, once
            continue
        seen.add(id(p))
        params["adapter" if p.requires_grad else "base"] += nbytes(p)
    # The gradients as a step holds them before its optimizer step: one more forward and backward.
    from burnish_server.trainer.policy_model import make_micro_batch

    b = make_micro_batch(batch(model.model.config.vocab_size, args.rows, args.tokens, seed=2), model.pad_id, args.tokens, model.device, model.base.packs)
    model.token_logprobs(b).sum().backward()
    ranks.sum_gradients(model.params)
    grads = sum(nbytes(p.grad) for p in model.model.parameters() if p.grad is not None)
    state = sum(nbytes(v) for s in model.optimizer.state.values() for v in s.values() if hasattr(v, "numel") and v.dim() > 0)
    return {"ranks": ranks.world, "parallel": ranks.parallel, "rank": ranks.rank, "base_bytes": params["base"], "adapter_bytes": params["adapter"],
            "grad_bytes": grads, "optimizer_bytes": state}  # fmt: skip


def kept(args: argparse.Namespace) -> dict:
    """Bytes the forward keeps for the backward, with checkpointing off and on, on a model of
    ``args.path``'s shape cut to 1 and then 2 decoder layers, at three probes (context tokens,
    sampled tokens): fitted as  fixed + per_layer x layers, each  a + b x context + c x sampled."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from burnish_server.trainer.policy_model import make_micro_batch
    from burnish_server.trainer.sequences import Sequence

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.kept_dtype]
    config = AutoConfig.from_pretrained(args.path)
    probes = ((args.length_probe, 64), (2 * args.length_probe, 64), (args.length_probe, 128))
    fits: dict[str, dict[int, list[float]]] = {}
    for checkpointing in ("off", "on"):
        fits[checkpointing] = {}
        for layers in (1, 2):
            torch.manual_seed(0)
            cut = {k: v for k, v in config.to_dict().items() if k != "layer_types"}  # the per-layer list follows the count
            model = AutoModelForCausalLM.from_config(config.__class__(**{**cut, "num_hidden_layers": layers}), dtype=dtype)
            if checkpointing == "on":
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM"))
            model.train()
            weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
            measured = []
            for context, sampled in probes:
                storages: dict[int, int] = {}

                def pack(t, weights=weights, storages=storages):
                    storage = t.untyped_storage()
                    if storage.data_ptr() not in weights:
                        storages[storage.data_ptr()] = storage.nbytes()
                    return t

                ids = torch.randint(5, config.vocab_size, (context + sampled,)).tolist()
                sequence = Sequence()
                sequence.add(ids[:context], ids[context:], None)
                b = make_micro_batch([(sequence, 1.0)], 0, context + sampled, torch.device("cpu"), packed=True)
                predicts = b.sampled[:, 1:].any(0).nonzero().squeeze(-1)
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    logits = model(input_ids=b.input_ids, position_ids=b.position_ids, logits_to_keep=predicts, use_cache=False).logits.float()
                    logits.log_softmax(-1)  # as the step reads them (policy_model.py: logsumexp, gather)
                measured.append(float(sum(storages.values())))
                del logits
            per_context = (measured[1] - measured[0]) / args.length_probe
            per_sampled = (measured[2] - measured[0]) / 64
            fits[checkpointing][layers] = [measured[0] - per_context * probes[0][0] - per_sampled * 64, per_context, per_sampled]
            del model
    with torch.device("meta"):  # the whole model's size, allocating nothing
        whole = AutoModelForCausalLM.from_config(config, dtype=dtype)
    size = sum(p.numel() for p in whole.parameters()) * torch.finfo(dtype).bits // 8
    out = {"dtype": args.kept_dtype, "layers": config.num_hidden_layers, "weights_bytes": size}
    for checkpointing, by_layers in fits.items():
        per_layer = [two - one for one, two in zip(by_layers[1], by_layers[2])]
        full = [one + (config.num_hidden_layers - 1) * layer for one, layer in zip(by_layers[1], per_layer)]
        out[checkpointing] = {"fixed_bytes": full[0], "bytes_per_context_token": full[1], "bytes_per_sampled_token": full[2]}
    return out


def longest(kept: dict, mode: str, device_bytes: float, sampled_share: float = 0.25) -> int:
    """Tokens of one sequence that fit beside the weights (LoRA and its optimizer are <1% more).
    With checkpointing, the layer being recomputed holds its whole activations for a moment:
    one layer's share of what is kept without checkpointing, on top."""

    def per_token(k: dict) -> float:
        return (1 - sampled_share) * k["bytes_per_context_token"] + sampled_share * k["bytes_per_sampled_token"]

    cost = per_token(kept[mode]) + (per_token(kept["off"]) / kept["layers"] if mode == "on" else 0.0)
    return int((device_bytes - kept["weights_bytes"] - kept[mode]["fixed_bytes"]) / cost)


def worker(args: argparse.Namespace) -> None:
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", "1"))))
    result = {"speed": speed, "memory": memory, "packing": packing}[args.worker](args)
    if int(os.environ.get("RANK", "0")) == 0 or args.worker == "memory":
        print("RESULT " + json.dumps(result), flush=True)


def torchrun(args: argparse.Namespace, what: str, nproc: int, parallel: str, path: Path) -> list[dict]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", __file__, "--worker", what]
    command += ["--parallel", parallel, "--path", str(path), "--rows", str(args.rows), "--tokens", str(args.tokens), "--steps", str(args.steps)]
    command += ["--length-probe", str(args.length_probe), "--kept-dtype", args.kept_dtype]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))})
    if done.returncode:
        raise SystemExit(f"{what} on {nproc} ranks ({parallel}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line]


def config_path(shape: str) -> Path:
    """A folder with only the config of a named shape (kept() builds cut models from it)."""
    from transformers import AutoConfig, Qwen2Config
    from vs_trl import SHAPES

    folder = Path(tempfile.mkdtemp(prefix=f"bench-shape-{shape}-"))
    if shape == "smollm2":
        from adapters import model_path

        AutoConfig.from_pretrained(model_path("smollm2", folder)).save_pretrained(folder)
    else:
        Qwen2Config(**SHAPES[shape], rms_norm_eps=1e-6).save_pretrained(folder)
    return folder


def main() -> None:
    from adapters import model_path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, qwen2.5-1.5b, qwen2.5-7b (random weights) or a local path")
    parser.add_argument("--nproc", type=int, default=2, help="ranks to compare with one")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--length-probe", type=int, default=512, help="context tokens of the shortest probe the kept bytes are measured at")
    parser.add_argument("--kept-dtype", default="bfloat16", help="the dtype the kept bytes are measured in (a GPU's: bfloat16)")
    parser.add_argument("--kept-shapes", default="smollm2,qwen2.5-1.5b,qwen2.5-7b", help="model shapes whose kept bytes per token are measured")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--parts", default="speed,memory,packing,kept", help="which measurements, of speed, memory, packing, kept")
    parser.add_argument("--worker", choices=["speed", "memory", "packing"], help=argparse.SUPPRESS)
    parser.add_argument("--parallel", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    parts = set(args.parts.split(","))
    runs: dict = {}
    summary: dict = {"model": args.model, "batch": f"{args.rows} x {args.tokens} tokens"}
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as work:
        path = model_path(args.model, Path(work))
        if "speed" in parts:
            one, many = (torchrun(args, "speed", n, "ddp", path)[0] for n in (1, args.nproc))
            runs.update(one=one, many=many)
            print(json.dumps({"speed": [one, many]}), flush=True)
            summary[f"tokens_per_s_{args.nproc}_over_1"] = round(many["tokens_per_s"] / one["tokens_per_s"], 3)
            summary["tokens_per_s"] = {"1": round(one["tokens_per_s"], 1), str(args.nproc): round(many["tokens_per_s"], 1)}
        if "memory" in parts:  # what a rank holds does not depend on the batch: a small one, so that 2 ranks fit the CPU's memory
            small = argparse.Namespace(**{**vars(args), "rows": min(args.rows, 4)})
            runs.update(ddp=torchrun(small, "memory", args.nproc, "ddp", path), fsdp=torchrun(small, "memory", args.nproc, "fsdp", path))
            print(json.dumps({"memory": [runs["ddp"], runs["fsdp"]]}), flush=True)
            summary["per_rank_mb"] = {
                name: {k: round(max(r[k] for r in runs[name]) / 2**20, 2) for k in ("base_bytes", "adapter_bytes", "grad_bytes", "optimizer_bytes")}
                for name in ("ddp", "fsdp")
            }
        if "packing" in parts:
            runs["packing"] = torchrun(args, "packing", 1, "ddp", path)[0]
            print(json.dumps({"packing": runs["packing"]}), flush=True)
            summary["packing"] = {k: round(v, 3) for k, v in runs["packing"].items()}
            summary["packed_over_padded_step_s"] = round(runs["packing"]["packed_step_s"] / runs["packing"]["padded_step_s"], 3)
    if "kept" in parts:
        runs["kept"] = {}
        for shape in args.kept_shapes.split(","):
            runs["kept"][shape] = kept(argparse.Namespace(**{**vars(args), "path": str(config_path(shape))}))
            print(json.dumps({"kept": {shape: runs["kept"][shape]}}), flush=True)
        summary["kept_kb_per_token"] = {
            shape: {
                mode: {"context": round(k[mode]["bytes_per_context_token"] / 1024, 1), "sampled": round(k[mode]["bytes_per_sampled_token"] / 1024, 1)}
                for mode in ("off", "on")
            }
            for shape, k in runs["kept"].items()
        }
        summary["longest_on_80gb"] = {shape: {mode: longest(k, mode, 0.9 * 80e9) for mode in ("off", "on")} for shape, k in runs["kept"].items()}
    print(json.dumps(summary, indent=2))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
