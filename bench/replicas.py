"""Several vLLM replicas behind one gateway: what sticky routing buys, what a swap costs,
what the replica list costs the gateway.

    .venv/bin/python bench/replicas.py [--agents 8] [--turns 6] [--swaps 6]

Three parts, on this machine's CPU:

1. Prefix cache. Two vLLM replicas of the tiny model; two gateways in front of both, one
   ``upstream_balance=sticky`` (a trajectory's calls go to one replica), one
   ``round_robin``. The same multi-turn agent load goes through each (``--agents``
   conversations at once, ``--turns`` calls each, every call resending the conversation so
   far), each run with its own words so that neither finds the other's prefixes cached. The
   hit rate is vLLM's own: ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``
   (tokens), summed over both replicas, over the run.
2. Swap latency, from checkpoint saved to the first response from the new version
   (bench/swap_latency.py's rounds), with one replica and with two.
3. Gateway overhead of the replica list: ``burnish gateway --upstream A`` against
   ``--upstream A,B`` (two fast stand-in upstreams, bench/harness.py), recording on, taking
   turns: p50/p99 at concurrency 1, req/s and CPU per call at 64.

Writes bench/results/replicas.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import start_gateway  # noqa: E402
from harness import HOST, PLAIN_BODY, ROOT, VENV_BIN, Load, Proc, free_port, git_state, install_cleanup, start_upstream  # noqa: E402
from swap_latency import TOKEN  # noqa: E402
from swap_latency import run as swap_rounds  # noqa: E402
from vs_litellm import make_tiny_model, start_vllm  # noqa: E402

sys.path.insert(0, str(ROOT))
from burnish_server.serving.process import share_cores  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "replicas.json"
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango".split()


def gateway(upstream: str, data_dir: str, **env: str) -> Proc:
    port = free_port()
    cmd = [str(VENV_BIN / "burnish"), "gateway", "--upstream", upstream, "--host", HOST, "--port", str(port), "--data-dir", data_dir, "--log-level", "warning"]
    return Proc(f"gateway-{port}", cmd, port, env={"BURNISH_ADMIN_TOKEN": TOKEN, **env}, health="/health").wait_ready(60)


def prefix_counters(url: str) -> tuple[float, float]:
    hits = queries = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def text(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str((seed + i) % 97) for i in range(n))


async def agent_load(url: str, run: str, agents: int, turns: int) -> float:
    """``agents`` conversations at once, ``turns`` calls each; the mean seconds per call."""
    seconds: list[float] = []

    async def agent(client: httpx.AsyncClient, a: int) -> None:
        messages = [{"role": "system", "content": f"{run} agent {a}. " + text(a, 80)}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"turn {t}: " + text(a * 31 + t, 15)})
            t0 = time.perf_counter()
            r = await client.post(f"/t/{run}-{a}/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0})
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text[:500]}")
            seconds.append(time.perf_counter() - t0)
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or "ok"})

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await asyncio.gather(*(agent(client, a) for a in range(agents)))
    return statistics.mean(seconds)


def prefix_cache(model: Path, tmp: Path, agents: int, turns: int) -> dict:
    replicas = [start_vllm(model, cores=cores, stats=True) for cores in share_cores(2)]
    for r in replicas:
        r.wait_ready(300)
    upstream = ",".join(r.url for r in replicas)
    out: dict = {}
    try:
        for balance in ("round_robin", "sticky", "round_robin", "sticky"):  # turns, twice each
            gw = gateway(upstream, str(tmp / f"pc-{balance}"), BURNISH_UPSTREAM_BALANCE=balance)
            try:
                before = [prefix_counters(r.url) for r in replicas]
                mean_s = asyncio.run(agent_load(gw.url, f"{balance}{len(out.get(balance, []))}", agents, turns))
                after = [prefix_counters(r.url) for r in replicas]
            finally:
                gw.stop()
            hits = sum(a[0] - b[0] for a, b in zip(after, before))
            queries = sum(a[1] - b[1] for a, b in zip(after, before))
            row = {"hit_rate": hits / queries if queries else 0.0, "hit_tokens": hits, "query_tokens": queries, "mean_call_s": mean_s}
            out.setdefault(balance, []).append(row)
            print(f"  {balance:11s} prefix-cache hit rate {row['hit_rate']:.1%} ({hits:.0f}/{queries:.0f} tokens), {mean_s * 1000:.0f} ms per call", flush=True)
    finally:
        for r in replicas:
            r.stop()
    return out


def swaps(model: Path, tmp: Path, n: int) -> dict:
    replicas = [start_vllm(model, cores=cores, stats=True) for cores in share_cores(2)]
    for r in replicas:
        r.wait_ready(300)
    out: dict = {}
    try:
        for label, upstream in (("one replica", replicas[0].url), ("two replicas", ",".join(r.url for r in replicas))):
            data = tmp / f"swap-{label.split()[0]}"
            gw = gateway(upstream, str(data))
            try:
                print(f"  {label}:", flush=True)
                rounds = asyncio.run(swap_rounds(n, data, upstream, gw.url, model, policy=f"swap{label.split()[0]}"))
            finally:
                gw.stop()
            out[label] = {k: {"median_s": statistics.median(r[k] for r in rounds), "max_s": max(r[k] for r in rounds)} for k in rounds[0]}
    finally:
        for r in replicas:
            r.stop()
    return out


def overhead(tmp: Path) -> dict:
    ups = [start_upstream(), start_upstream()]
    gws = {"single": start_gateway(ups[0].url, True, str(tmp / "single")), "list": start_gateway(f"{ups[0].url},{ups[1].url}", True, str(tmp / "list"))}
    load, res = Load(), {name: {"c1": [], "c64": []} for name in gws}
    try:
        for _ in range(3):
            for name, gw in gws.items():
                res[name]["c1"].append(load.run(gw.url, PLAIN_BODY, 1, 5, 1, server=gw))
                res[name]["c64"].append(load.run(gw.url, PLAIN_BODY, 64, 8, 2, server=gw))
    finally:
        for p in [*gws.values(), *ups]:
            p.stop()
    out = {}
    for name, runs in res.items():
        out[name] = {
            "c1_p50_ms": statistics.median(r["p50_ms"] for r in runs["c1"]),
            "c1_p99_ms": statistics.median(r["p99_ms"] for r in runs["c1"]),
            "c64_rps": statistics.median(r["rps"] for r in runs["c64"]),
            "c64_cpu_ms_per_call": statistics.median(r["server_cpu_ms_per_req"] for r in runs["c64"]),
        }
        print(f"  {name:6s} " + "  ".join(f"{k} {v:.3f}" for k, v in out[name].items()), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--only", choices=["prefix", "swap", "overhead"])
    args = parser.parse_args()
    install_cleanup()
    started = time.time()
    results: dict = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_state(), "cpus": os.cpu_count(), **vars(args)}}
    with tempfile.TemporaryDirectory(prefix="burnish-replicas-") as name:
        tmp = Path(name)
        model = make_tiny_model(tmp / "tiny")
        try:
            if args.only in (None, "prefix"):
                print("1. prefix cache, two replicas, multi-turn agents:", flush=True)
                results["prefix_cache"] = prefix_cache(model, tmp, args.agents, args.turns)
            if args.only in (None, "swap"):
                print("2. swap latency, checkpoint saved to first response from the new version:", flush=True)
                results["swap"] = swaps(model, tmp, args.swaps)
            if args.only in (None, "overhead"):
                print("3. gateway overhead, a replica list against one upstream (recording on):", flush=True)
                results["overhead"] = overhead(tmp)
        finally:
            Proc.stop_all()
    results["meta"]["run_seconds"] = round(time.time() - started, 1)
    print("\nsummary:")
    if "prefix_cache" in results:
        for balance, rows in results["prefix_cache"].items():
            print(
                f"  prefix-cache hit rate, {balance:11s}: {statistics.mean(r['hit_rate'] for r in rows):.1%}, {statistics.mean(r['mean_call_s'] for r in rows) * 1000:.0f} ms per call"
            )
    if "swap" in results:
        for label, row in results["swap"].items():
            print(
                f"  swap, {label:12s}: median {row['total']['median_s']:.3f} s, worst {row['total']['max_s']:.3f} s (publish median {row['publish']['median_s']:.3f} s)"
            )
    if "overhead" in results:
        single, listed = results["overhead"]["single"], results["overhead"]["list"]
        print(
            f"  replica list / single upstream: p50 {listed['c1_p50_ms'] - single['c1_p50_ms']:+.3f} ms, p99 {listed['c1_p99_ms'] - single['c1_p99_ms']:+.3f} ms, "
            f"req/s x{listed['c64_rps'] / single['c64_rps']:.3f}, CPU per call {listed['c64_cpu_ms_per_call'] - single['c64_cpu_ms_per_call']:+.3f} ms"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)} ({results['meta']['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
