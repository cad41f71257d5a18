"""What the gateway adds on top of an upstream: latency at concurrency 1, throughput at 64.

Run from the repository root (about 2.5 minutes; needs nothing but the venv, and wrk,
which it installs with apt-get if it can)::

    .venv/bin/python bench/gateway_overhead.py

One upstream (bench/harness.py: a fixed chat.completion, or a fixed 8-event SSE stream,
served by uvicorn with httptools and uvloop) runs in its own process. The same load goes to
(a) the upstream directly, (b) ``burnish gateway --no-record`` and (c) ``burnish gateway``
(recording into SQLite in a fresh data dir), each gateway in its own process, one worker.
Both gateways run side by side, and the three targets take turns on each case:

* c=1: one keep-alive connection, requests back to back for 6 s (1 s warm-up): p50/p99.
  added latency = gateway (record on) - direct; budgets p50 < 1 ms, p99 < 3 ms.
* c=64: 64 connections for 10 s (2 s warm-up): req/s. Budget: record on >= 0.80 x record off.

Every request carries its own ``X-Trajectory-Id``; streams are read to the end.
Prints a table and PASS/FAIL per budget, writes bench/results/gateway_overhead.json, and
exits 0 whatever the verdicts (non-zero only if the benchmark itself broke).
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    HOST,
    PATH,
    PLAIN_BODY,
    ROOT,
    STREAM_BODY,
    VENV_BIN,
    Load,
    OtherLoad,
    Proc,
    code_fingerprint,
    free_port,
    git_state,
    install_cleanup,
    start_upstream,
)

LAT_SECONDS, LAT_WARMUP = 6.0, 1.0
TPUT_SECONDS, TPUT_WARMUP = 10.0, 2.0
MODES = {"plain": PLAIN_BODY, "stream": STREAM_BODY}
BUDGET_P50_MS, BUDGET_P99_MS, BUDGET_RATIO = 1.0, 3.0, 0.80
RESULTS = ROOT / "bench" / "results" / "gateway_overhead.json"


def start_gateway(upstream: str, record: bool, data_dir: str, *, name: str | None = None, env: dict[str, str] | None = None) -> Proc:
    port = free_port()
    cmd = [
        str(VENV_BIN / "burnish"),
        "gateway",
        "--upstream",
        upstream,
        "--host",
        HOST,
        "--port",
        str(port),
        "--data-dir",
        data_dir,
        "--log-level",
        "warning",
        "--record" if record else "--no-record",
    ]
    name = name or ("gateway-record" if record else "gateway-norecord")
    return Proc(name, cmd, port, env=env, health="/health").wait_ready(60)


def check(url: str) -> None:
    """One plain and one streamed call: the answer must be whole, or the figures mean nothing."""
    with httpx.Client(timeout=10) as client:
        r = client.post(url + PATH, content=PLAIN_BODY, headers={"content-type": "application/json", "x-trajectory-id": "check-1"})
        assert r.status_code == 200 and r.json()["object"] == "chat.completion", (r.status_code, r.text[:300])
        r = client.post(url + PATH, content=STREAM_BODY, headers={"content-type": "application/json", "x-trajectory-id": "check-2"})
        events = [e for e in r.text.split("\n\n") if e.strip()]
        assert r.status_code == 200 and len(events) == 8 and events[-1] == "data: [DONE]", (r.status_code, r.text[:300])


def measure(load: Load, targets: dict[str, Proc]) -> dict:
    """Every case against every target in turn, so a change in the machine's load hits all three alike."""
    out: dict = {label: {mode: {} for mode in MODES} for label in targets}
    for mode, body in MODES.items():
        for conns, seconds, warmup in ((1, LAT_SECONDS, LAT_WARMUP), (64, TPUT_SECONDS, TPUT_WARMUP)):
            for label, target in targets.items():
                r = out[label][mode][f"c{conns}"] = load.run(target.url, body, conns, seconds, warmup, server=target)
                bad = f"  ERRORS {r['errors']} non-2xx {r['non2xx']}" if r["errors"] or r["non2xx"] else ""
                print(
                    f"  {label:<10} {mode:<6} c={conns:<3} {r['rps']:8.0f} req/s  p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms"
                    f"  cpu {r.get('server_cpu_ms_per_req', 0):.3f} ms/req{bad}",
                    flush=True,
                )
    return out


def recorded_calls(data_dir: str) -> dict[str, int]:
    db = Path(data_dir) / "burnish.db"
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("select status, count(*) from calls group by status").fetchall())


def summarize(res: dict) -> tuple[list[dict], dict]:
    rows = []
    for mode in MODES:
        for c in ("c1", "c64"):
            d, off, on = res["direct"][mode][c], res["record_off"][mode][c], res["record_on"][mode][c]
            rows.append(
                {
                    "mode": mode,
                    "concurrency": int(c[1:]),
                    "direct_p50_ms": d["p50_ms"],
                    "direct_p99_ms": d["p99_ms"],
                    "record_on_p50_ms": on["p50_ms"],
                    "record_on_p99_ms": on["p99_ms"],
                    "record_off_p50_ms": off["p50_ms"],
                    "record_off_p99_ms": off["p99_ms"],
                    "added_p50_ms": on["p50_ms"] - d["p50_ms"],
                    "added_p99_ms": on["p99_ms"] - d["p99_ms"],
                    "added_off_p50_ms": off["p50_ms"] - d["p50_ms"],
                    "added_off_p99_ms": off["p99_ms"] - d["p99_ms"],
                    "rps_direct": d["rps"],
                    "rps_record_off": off["rps"],
                    "rps_record_on": on["rps"],
                    "on_off_ratio": on["rps"] / off["rps"] if off["rps"] else 0.0,
                    "gw_cpu_ms_per_req_off": off.get("server_cpu_ms_per_req"),
                    "gw_cpu_ms_per_req_on": on.get("server_cpu_ms_per_req"),
                }
            )
    verdicts = {}
    for r in rows:
        name = f"{r['mode']} c={r['concurrency']}"
        if r["concurrency"] == 1:
            verdicts[f"{name}: added p50 < {BUDGET_P50_MS} ms"] = r["added_p50_ms"] < BUDGET_P50_MS
            verdicts[f"{name}: added p99 < {BUDGET_P99_MS} ms"] = r["added_p99_ms"] < BUDGET_P99_MS
        else:
            verdicts[f"{name}: record-on >= {BUDGET_RATIO:.2f} x record-off req/s"] = r["on_off_ratio"] >= BUDGET_RATIO
    return rows, verdicts


def print_table(rows: list[dict], verdicts: dict) -> None:
    print("\nLatency (ms; wrk, keep-alive; added = gateway record-on - direct)")
    print(f"{'mode':<7}{'c':>3} | {'direct p50/p99':>15} | {'rec-off p50/p99':>15} | {'rec-on p50/p99':>15} | {'added p50/p99':>15}")
    for r in rows:
        print(
            f"{r['mode']:<7}{r['concurrency']:>3} | {r['direct_p50_ms']:>6.3f} /{r['direct_p99_ms']:>7.3f} | {r['record_off_p50_ms']:>6.3f} /{r['record_off_p99_ms']:>7.3f}"
            f" | {r['record_on_p50_ms']:>6.3f} /{r['record_on_p99_ms']:>7.3f} | {r['added_p50_ms']:>6.3f} /{r['added_p99_ms']:>7.3f}"
        )
    print("\nThroughput (req/s) and gateway CPU per request (ms)")
    print(f"{'mode':<7}{'c':>3} | {'direct':>8} {'rec-off':>8} {'rec-on':>8} | {'on/off':>6} | {'cpu off':>7} {'cpu on':>7}")
    for r in rows:
        print(
            f"{r['mode']:<7}{r['concurrency']:>3} | {r['rps_direct']:>8.0f} {r['rps_record_off']:>8.0f} {r['rps_record_on']:>8.0f} | {r['on_off_ratio']:>6.2f}"
            f" | {r['gw_cpu_ms_per_req_off'] or 0:>7.3f} {r['gw_cpu_ms_per_req_on'] or 0:>7.3f}"
        )
    print("\nBudgets")
    for name, ok in verdicts.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")


def main() -> int:
    install_cleanup()
    started, code, other = time.time(), code_fingerprint(), OtherLoad()
    load = Load()
    tmp = tempfile.mkdtemp(prefix="burnish-bench-")
    procs: dict[str, Proc] = {}
    try:
        procs["direct"] = start_upstream()
        print(f"upstream {procs['direct'].url}; load generator: {load.tool}; gateway code: {git_state()}", flush=True)
        # Both gateways run side by side (an idle one costs nothing) and take turns with the direct runs.
        procs["record_off"] = start_gateway(procs["direct"].url, False, os.path.join(tmp, "record_off"))
        procs["record_on"] = start_gateway(procs["direct"].url, True, os.path.join(tmp, "record_on"))
        for proc in procs.values():
            check(proc.url)
        res = measure(load, procs)
    finally:
        for proc in reversed(procs.values()):
            proc.stop()
        Proc.stop_all()
    counts = recorded_calls(os.path.join(tmp, "record_on"))
    print(f"  record_on stored calls by status: {counts}", flush=True)
    busy = other.share()
    print(f"\nother processes used {busy:.0%} of the machine's CPU during the run" + (" -- WARNING: figures skewed" if busy > 0.05 else ""), flush=True)
    if code_fingerprint() != code:
        print("\nWARNING: gateway/ changed on disk during this run; the figures mix two versions of the code", flush=True)
    rows, verdicts = summarize(res)
    print_table(rows, verdicts)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git": git_state(),
        "code_fingerprint": code,
        "code_changed_during_run": code_fingerprint() != code,
        "other_cpu_share": round(busy, 3),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_tool": load.tool,
        "latency_seconds": LAT_SECONDS,
        "throughput_seconds": TPUT_SECONDS,
        "warmup_seconds": [LAT_WARMUP, TPUT_WARMUP],
        "run_seconds": round(time.time() - started, 1),
        "record_on_calls_stored": counts,
    }
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows, "budgets": verdicts, "raw": res}, indent=2))
    print(f"\nwrote {RESULTS.relative_to(ROOT)} ({meta['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
