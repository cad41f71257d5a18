"""Streaming: the time to first byte the gateway adds, and that it never coalesces chunks.

    .venv/bin/python bench/ttfb.py [--calls 2000]

The benchmark's upstream streams 8 events (bench/harness.py). One client (aiohttp, one
keep-alive connection per target) asks for a stream, alternating between the upstream
directly and ``burnish gateway`` recording into SQLite, and times the arrival of the first
byte of the body. Added TTFB = gateway - direct, per percentile. It also counts the reads
the client needed per stream on each side: the gateway relays each chunk as it comes, so it
should not need fewer reads than the upstream directly (fewer would mean chunks coalesced).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import start_gateway  # noqa: E402
from harness import PATH, ROOT, STREAM_BODY, Proc, git_state, install_cleanup, start_upstream  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ttfb.json"


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def measure(targets: dict[str, str], calls: int) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {name: {"ttfb": [], "chunks": []} for name in targets}
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for name in targets}
    try:
        for i in range(calls + 100):
            for name, url in targets.items():
                t0 = time.perf_counter()
                async with sessions[name].post(url + PATH, data=STREAM_BODY, headers={"content-type": "application/json", "x-trajectory-id": f"ttfb-{i}"}) as r:
                    first = await r.content.readany()
                    t1 = time.perf_counter()
                    chunks = 1 if first else 0
                    while await r.content.readany():
                        chunks += 1
                if i >= 100:  # warm-up
                    out[name]["ttfb"].append((t1 - t0) * 1000)
                    out[name]["chunks"].append(chunks)
    finally:
        for s in sessions.values():
            await s.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    install_cleanup()
    with tempfile.TemporaryDirectory(prefix="burnish-ttfb-") as tmp:
        upstream = start_upstream()
        gateway = start_gateway(upstream.url, True, tmp)
        try:
            res = asyncio.run(measure({"direct": upstream.url, "gateway": gateway.url}, args.calls))
        finally:
            gateway.stop()
            upstream.stop()
            Proc.stop_all()
    summary = {}
    for q in (0.5, 0.9, 0.99):
        direct, through = pct(res["direct"]["ttfb"], q), pct(res["gateway"]["ttfb"], q)
        summary[f"p{int(q * 100)}"] = {"direct_ms": direct, "gateway_ms": through, "added_ms": through - direct}
        print(f"TTFB p{int(q * 100):2d}: direct {direct:.3f} ms, gateway {through:.3f} ms, added {through - direct:.3f} ms")
    chunks = {name: statistics.mean(r["chunks"]) for name, r in res.items()}
    print(f"chunks per stream, mean: direct {chunks['direct']:.2f}, gateway {chunks['gateway']:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_state(), "summary": summary, "chunks": chunks}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
