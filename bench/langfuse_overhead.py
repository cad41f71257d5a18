"""What Langfuse export costs the gateway: the same load on two recording gateways side by
side, one exporting every call to Langfuse and one not.

Run from the repository root (about 1.5 minutes)::

    .venv/bin/python bench/langfuse_overhead.py [--delay 0.15]

Langfuse is a loopback stand-in that answers at once, or after ``--delay`` seconds, a
distant Langfuse's round trip (bench/harness.py: langfuse_app), so the figures are the
gateway's own cost of exporting: turning each committed call into a
generation and sending it, on a thread of the gateway's process. Cases as in
gateway_overhead.py (plain and streamed chat; c=1 latency, c=64 throughput), the two
gateways taking turns. Prints p50/p99 and req/s for both, the ratio, and what the export
counted (sent, failed, dropped); writes bench/results/langfuse_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import MODES, check, measure, start_gateway  # noqa: E402
from harness import ROOT, Load, Proc, code_fingerprint, git_state, install_cleanup, start_upstream  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "langfuse_overhead.json"  # "-delay" before .json with --delay


def exported(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {
        f"{s.labels['kind']}.{s.labels['outcome']}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "burnish_langfuse_items_total"
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay", type=float, default=0.0, help="seconds the stand-in Langfuse takes to answer each request")
    args = parser.parse_args()
    install_cleanup()
    started, code, load = time.time(), code_fingerprint(), Load()
    tmp = tempfile.mkdtemp(prefix="burnish-bench-")
    procs: dict[str, Proc] = {}
    try:
        upstream, langfuse = start_upstream(), start_upstream("langfuse_app", env={"BENCH_LANGFUSE_DELAY_S": str(args.delay)})
        procs = {"upstream": upstream, "langfuse": langfuse}
        env = {"BURNISH_LANGFUSE_PUBLIC_KEY": "pk-bench", "BURNISH_LANGFUSE_SECRET_KEY": "sk-bench", "BURNISH_LANGFUSE_BASE_URL": langfuse.url}
        targets = {
            "record_on": start_gateway(upstream.url, True, os.path.join(tmp, "plain")),
            "langfuse": start_gateway(upstream.url, True, os.path.join(tmp, "langfuse"), name="gateway-langfuse", env=env),
        }
        procs |= targets
        print(f"upstream {upstream.url}; langfuse stand-in {langfuse.url}; load generator: {load.tool}; gateway code: {git_state()}", flush=True)
        for target in targets.values():
            check(target.url)
        res = measure(load, targets)
        time.sleep(2)  # the export's last batch
        counted = exported(targets["langfuse"].url)
    finally:
        for proc in reversed(procs.values()):
            proc.stop()
        Proc.stop_all()
    rows = []
    print(f"\n{'mode':<7}{'c':>3} | {'no export p50/p99 ms':>20} | {'export p50/p99 ms':>18} | {'no export':>9} {'export':>9} req/s | ratio")
    for mode in MODES:
        for c in ("c1", "c64"):
            off, on = res["record_on"][mode][c], res["langfuse"][mode][c]
            row = {
                "mode": mode,
                "concurrency": int(c[1:]),
                "p50_ms": [off["p50_ms"], on["p50_ms"]],
                "p99_ms": [off["p99_ms"], on["p99_ms"]],
                "rps": [off["rps"], on["rps"]],
                "ratio": on["rps"] / off["rps"] if off["rps"] else 0.0,
            }
            rows.append(row)
            print(
                f"{mode:<7}{row['concurrency']:>3} | {off['p50_ms']:>8.3f} / {off['p99_ms']:>8.3f} | {on['p50_ms']:>7.3f} / {on['p99_ms']:>7.3f} |"
                f" {off['rps']:>9.0f} {on['rps']:>9.0f}       | {row['ratio']:.2f}"
            )
    print(f"\nexport counted: {counted}")
    results = RESULTS.with_name(f"langfuse_overhead-delay{args.delay}.json") if args.delay else RESULTS
    results.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git": git_state(),
        "code_fingerprint": code,
        "cpus": os.cpu_count(),
        "load_tool": load.tool,
        "langfuse_delay_s": args.delay,
        "run_seconds": round(time.time() - started, 1),
        "exported": counted,
    }
    results.write_text(json.dumps({"meta": meta, "rows": rows, "raw": res}, indent=2))
    print(f"wrote {results.relative_to(ROOT)} ({meta['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
