"""One round of a task runner's sampling on vLLM's CPU build: groups of answers to one question
each, all sent at once, through a LoRA adapter as a trained policy's calls are.

Run from the repository root (about 2 minutes a setting on two cores; nothing else running)::

    .venv/bin/python bench/sampling_round.py                         # blocks of 32 (burnish up's) and of 128 (vLLM's own)
    .venv/bin/python bench/sampling_round.py --block-size 32 --base  # and the base model, no adapter

Each setting starts vLLM as ``burnish up`` does (``serving/process.py: VLLMServer``, float32,
whole prompts) on the embedded SmolLM2 with its own ``--block-size``, loads a rank-16 adapter on
every projection (``lora_B`` drawn small, so that LoRA's kernels run as for a trained one),
plays a warm-up round, then ``--rounds`` rounds of ``--groups`` x ``--size`` calls:
reasoning-gym's ransom_note questions (about 110 prompt tokens), ``--max-tokens`` 64 at
temperature 0.7 and a seed per call, as ``burnish.tasks``' runner sends them. Prints one JSON
line a setting: each round's seconds and vLLM's prefix-cache hits over queries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
RANK, ALPHA = 16, 32


def model_and_adapter(work: Path) -> tuple[Path, Path]:
    """SmolLM2 as bench/trainer_step.py converts it, and a rank-16 adapter on it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from trainer_step import model_folder
    from transformers import AutoModelForCausalLM

    from burnish_server.core.learning.defaults import LLAMA_PROJECTIONS

    model, _ = model_folder("smollm2", work, seed=0)
    adapter = work / "adapter"
    torch.manual_seed(0)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model), LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(LLAMA_PROJECTIONS)))
    for name, weight in peft.named_parameters():
        if "lora_B" in name:  # peft starts B at zero; a trained adapter's is not
            torch.nn.init.normal_(weight, std=1e-3)
    peft.save_pretrained(adapter)
    return model, adapter


def questions(count: int) -> list[str]:
    import reasoning_gym

    return [e["question"] + "\nGive only the final answer." for e in reasoning_gym.create_dataset("ransom_note", seed=5, size=count)]


async def rounds(url: str, model: str, asked: list[str], args: argparse.Namespace) -> list[float]:
    async def call(client: httpx.AsyncClient, question: str, seed: int) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": args.max_tokens}
        body |= {"temperature": 0.7, "seed": seed, "logprobs": True, "return_token_ids": True}
        (await client.post(url + "/v1/chat/completions", json=body)).raise_for_status()

    seconds = []
    async with httpx.AsyncClient(timeout=600) as client:
        for r in range(1 + args.rounds):  # the first warms up
            group = asked[r * args.groups : (r + 1) * args.groups]
            started = time.perf_counter()
            await asyncio.gather(*(call(client, q, r * 1000 + g * args.size + i) for g, q in enumerate(group) for i in range(args.size)))
            seconds.append(round(time.perf_counter() - started, 2))
    return seconds[1:]


def cache_figures(url: str) -> dict[str, float]:
    lines = httpx.get(url + "/metrics", timeout=10).text.splitlines()
    named = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    return {n.split(":")[1]: sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith(n + "{")) for n in named}


def setting(args: argparse.Namespace, block: int, base: bool, model: Path, adapter: Path, work: Path) -> dict:
    from burnish_server.serving.process import VLLMServer

    server = VLLMServer(
        model=str(model), log_path=work / f"vllm-{block}.log", port=args.port, max_model_len=2048, dtype="float32", extra_args=["--block-size", str(block)]
    )
    with server.log_path.open("w") as log:
        process = subprocess.Popen(server.command(), env=server.environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(600):
            try:
                if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "policy", "lora_path": str(adapter)}, timeout=120).raise_for_status()
        asked = questions((1 + args.rounds) * args.groups)
        seconds = asyncio.run(rounds(server.url, str(model) if base else "policy", asked, args))
        cache = cache_figures(server.url)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    return {
        "block_size": block,
        "adapter": not base,
        "round_s": seconds,
        "prefix_cache_hit_rate": round(cache["prefix_cache_hits_total"] / max(cache["prefix_cache_queries_total"], 1), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-size", type=int, action="append", help="vLLM's --block-size, repeatable (default: 32 and 128)")
    ap.add_argument("--base", action="store_true", help="also the base model with no adapter, at the first block size")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--size", type=int, default=8, help="answers a question")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=8311)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="burnish-round-") as tmp:
        work = Path(tmp)
        model, adapter = model_and_adapter(work)
        blocks = args.block_size or [32, 128]
        runs = [(b, False) for b in blocks] + ([(blocks[0], True)] if args.base else [])
        for block, base in runs:
            print(json.dumps(setting(args, block, base, model, adapter, work)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
