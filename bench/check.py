"""The hot path's guard: has the gateway's CPU per call crept up? (`make bench-check`, ~1 min)

    .venv/bin/python bench/check.py [--rounds 3] [--seconds 5]

A short side-by-side run on this machine: the benchmark's fast upstream (bench/harness.py)
loaded directly, then through ``burnish gateway`` recording into SQLite, plain and
streamed, 64 connections, taking turns for ``--rounds`` rounds. CPU per call is each
server process's user+system time over the calls it served. The figure guarded is a ratio
measured in the same run, so that it does not depend on how fast this machine is today:

    gateway CPU per recorded call / upstream CPU per call when loaded directly

The run fails (exit 1) when a ratio's median is more than ``MARGIN`` above ``BASELINE``,
the figures of the commit named beside them. Run it for every change to the proxy path;
when a change makes the gateway cheaper, lower ``BASELINE`` to the new figures in the same
commit, so the gain is kept. Other processes using the CPU skew it: the run says how much.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import start_gateway  # noqa: E402
from harness import PLAIN_BODY, ROOT, STREAM_BODY, Load, OtherLoad, Proc, git_state, install_cleanup, start_upstream  # noqa: E402

# Median ratios measured with this script (3 rounds of 5 s) on the 2-vCPU VMs of
# docs/performance.md ("The guard"): plain at b235e74; stream lowered from 9.0 when streams
# left Litestar's anyio task group (x0.75 CPU per streamed call side by side, bench/versus.py).
BASELINE = {"plain": 11.4, "stream": 7.4}
MARGIN = 0.15  # run-to-run noise on this VM is about ±10%
CONNS = 64
RESULTS = ROOT / "bench" / "results" / "check.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    install_cleanup()
    other, load = OtherLoad(), Load()
    ratios: dict[str, list[float]] = {"plain": [], "stream": []}
    raw: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="burnish-check-") as tmp:
        upstream = start_upstream()
        gateway = start_gateway(upstream.url, True, tmp)
        try:
            for n in range(args.rounds):
                for mode, body in (("plain", PLAIN_BODY), ("stream", STREAM_BODY)):
                    direct = load.run(upstream.url, body, CONNS, args.seconds, 1.0, server=upstream)
                    through = load.run(gateway.url, body, CONNS, args.seconds, 1.0, server=gateway)
                    ratio = through["server_cpu_ms_per_req"] / direct["server_cpu_ms_per_req"]
                    ratios[mode].append(ratio)
                    raw.append({"round": n, "mode": mode, "direct": direct, "gateway": through, "ratio": ratio})
                    print(
                        f"round {n + 1} {mode:6s}: upstream {direct['server_cpu_ms_per_req']:.3f} ms/call, "
                        f"gateway {through['server_cpu_ms_per_req']:.3f} ms/call ({through['rps']:.0f} req/s): ratio {ratio:.2f}",
                        flush=True,
                    )
        finally:
            gateway.stop()
            upstream.stop()
            Proc.stop_all()
    busy = other.share()
    failed = []
    print(f"\ngateway CPU per recorded call / upstream CPU per call (median of {args.rounds}; limit = baseline x {1 + MARGIN:.2f}):")
    for mode, values in ratios.items():
        median, limit = statistics.median(values), BASELINE[mode] * (1 + MARGIN)
        verdict = "ok" if median <= limit else "REGRESSED"
        if median > limit:
            failed.append(mode)
        print(f"  {mode:6s} {median:.2f}  (baseline {BASELINE[mode]:.2f}, limit {limit:.2f})  {verdict}")
    print(f"other processes used {busy:.0%} of the CPU" + (" -- figures skewed, run again on a quiet machine" if busy > 0.05 else ""))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_state(), "other_cpu_share": busy, "ratios": ratios, "raw": raw}, indent=2)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
