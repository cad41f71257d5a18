"""This checkout's gateway against another commit's, side by side in one run.

    .venv/bin/python bench/versus.py REV [--rounds 3] [--seconds 5]

Absolute figures move from machine to machine (a VM twice as slow doubles every one of them);
the ratio of two gateways measured in turns on the same load does not. REV's code runs from a
copy of that commit in the same venv (bench/harness.py ``code_of``). Both gateways record into
SQLite, one worker each, in front of the benchmark's fast upstream (bench/harness.py); the
upstream, this checkout and REV take turns in every round:

* c=64, plain and streamed: gateway CPU per recorded call, and req/s;
* c=1, plain: added latency (gateway - direct) at p50 and p99.

Prints each round, then the medians and this checkout's figures over REV's; writes
bench/results/versus.json.
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
from harness import PLAIN_BODY, ROOT, STREAM_BODY, Load, OtherLoad, Proc, code_of, git_state, install_cleanup, start_upstream  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "versus.json"
CASES = [("plain", PLAIN_BODY, 64), ("stream", STREAM_BODY, 64), ("plain", PLAIN_BODY, 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the commit to compare with (e.g. the one an issue was filed at)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    install_cleanup()
    other, load = OtherLoad(), Load()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="burnish-versus-") as tmp:
        upstream = start_upstream()
        ours = start_gateway(upstream.url, True, tempfile.mkdtemp(dir=tmp), name="gateway-this")
        theirs = start_gateway(upstream.url, True, tempfile.mkdtemp(dir=tmp), name=f"gateway-{args.rev}", env=code_of(args.rev))
        try:
            for n in range(args.rounds):
                for mode, body, conns in CASES:
                    row = {"round": n, "mode": mode, "conns": conns}
                    for name, target in (("direct", upstream), ("this", ours), ("rev", theirs)):
                        row[name] = load.run(target.url, body, conns, args.seconds, 1.0, server=target)
                    rows.append(row)
                    print(f"round {n + 1} {mode} c={conns}: " + _line(row), flush=True)
        finally:
            for proc in (theirs, ours, upstream):
                proc.stop()
            Proc.stop_all()
    summary = _summary(rows, args.rev)
    print("\n" + "\n".join(summary))
    busy = other.share()
    print(f"other processes used {busy:.0%} of the CPU" + (" -- figures skewed, run again on a quiet machine" if busy > 0.05 else ""))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_state(), "rev": args.rev, "other_cpu_share": busy, "rows": rows}, indent=2)
    )
    return 0


def _line(row: dict) -> str:
    if row["conns"] == 1:
        return " ".join(f"{k} p50/p99 {row[k]['p50_ms']:.3f}/{row[k]['p99_ms']:.3f} ms" for k in ("direct", "this", "rev"))
    return " ".join(f"{k} {row[k]['server_cpu_ms_per_req']:.3f} ms/call {row[k]['rps']:.0f} req/s" for k in ("direct", "this", "rev"))


def _median(rows: list[dict], target: str, field: str, *, over_direct: bool = False) -> float:
    """A figure's median over the rounds; ``over_direct``: less the direct upstream's in the same round (added latency)."""
    return statistics.median(r[target][field] - (r["direct"][field] if over_direct else 0) for r in rows)


def _summary(rows: list[dict], rev: str) -> list[str]:
    out = [f"medians over the rounds; this checkout against {rev}:"]
    for mode, _, conns in CASES:
        case = [r for r in rows if r["mode"] == mode and r["conns"] == conns]
        if conns == 1:
            p50, p99 = ({k: _median(case, k, q, over_direct=True) for k in ("this", "rev")} for q in ("p50_ms", "p99_ms"))
            out.append(
                f"  {mode} c=1 added p50/p99: this {p50['this']:.3f}/{p99['this']:.3f} ms, {rev} {p50['rev']:.3f}/{p99['rev']:.3f} ms"
                f" (x{p50['this'] / p50['rev']:.2f} / x{p99['this'] / p99['rev']:.2f})"
            )
        else:
            cpu, rps = ({k: _median(case, k, field) for k in ("this", "rev")} for field in ("server_cpu_ms_per_req", "rps"))
            out.append(
                f"  {mode} c={conns} CPU per call: this {cpu['this']:.3f} ms, {rev} {cpu['rev']:.3f} ms (x{cpu['this'] / cpu['rev']:.2f}); "
                f"req/s {rps['this']:.0f} against {rps['rev']:.0f} (x{rps['this'] / rps['rev']:.2f})"
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
