"""Which ASGI server should run the gateway: uvicorn (httptools + uvloop) or granian (ASGI, 1 worker).

Run from the repository root (about 3.5 minutes; installs granian into the venv if missing)::

    .venv/bin/python bench/asgi_servers.py

Both serve the same app, ``burnish_server.gateway.app:app_from_env`` (recording on, SQLite in a fresh data
dir, settings from ``BURNISH_*``), one worker, in front of the benchmark upstream
(bench/harness.py). Each server gets the same load, from wrk (or the Python fallback):

* c=64 plain and c=64 stream: req/s over 10 s, after a 2 s warm-up;
* c=1 plain: p50/p99 over 6 s, after a 1 s warm-up.

The servers take turns, three rounds (uvicorn, granian, uvicorn, granian, ...), each start a
fresh process; the table shows the median of the rounds and each round, since a 2-core machine
is noisy. Writes
bench/results/asgi_servers.json. Exits 0 whatever the outcome of the comparison.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import check  # noqa: E402
from harness import (  # noqa: E402
    HOST,
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

ROUNDS = 3
TPUT_SECONDS, TPUT_WARMUP = 10.0, 2.0
LAT_SECONDS, LAT_WARMUP = 6.0, 1.0
CASES = [
    ("plain c=64", PLAIN_BODY, 64, TPUT_SECONDS, TPUT_WARMUP),
    ("stream c=64", STREAM_BODY, 64, TPUT_SECONDS, TPUT_WARMUP),
    ("plain c=1", PLAIN_BODY, 1, LAT_SECONDS, LAT_WARMUP),
]
RESULTS = ROOT / "bench" / "results" / "asgi_servers.json"
APP = "burnish_server.gateway.app:app_from_env"


def ensure_granian() -> None:
    if not (VENV_BIN / "granian").exists():
        print("granian not found; pip install granian ...", flush=True)
        subprocess.run([str(VENV_BIN / "python"), "-m", "pip", "install", "-q", "granian"], check=True, timeout=300)


def server_cmd(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [
            str(VENV_BIN / "uvicorn"),
            "--factory",
            APP,
            "--host",
            HOST,
            "--port",
            str(port),
            "--workers",
            "1",
            "--http",
            "httptools",
            "--loop",
            "uvloop",
            "--no-access-log",
            "--log-level",
            "warning",
        ]
    return [
        str(VENV_BIN / "granian"),
        "--interface",
        "asgi",
        "--factory",
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        "1",
        "--loop",
        "uvloop",
        "--no-access-log",
        "--log-level",
        "warning",
        APP,
    ]


def server_version(server: str) -> str:
    out = subprocess.run(
        [str(VENV_BIN / "python"), "-c", f"import importlib.metadata as m; print(m.version('{server}'))"], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip()


def run_server(load: Load, server: str, upstream: str, data_dir: str) -> dict:
    port = free_port()
    env = {"BURNISH_UPSTREAM": upstream, "BURNISH_DATA_DIR": data_dir, "BURNISH_RECORD": "true", "BURNISH_LOG_LEVEL": "warning"}
    proc = Proc(server, server_cmd(server, port), port, env=env, health="/health").wait_ready(60)
    out: dict = {}
    try:
        check(proc.url)
        for name, body, conns, seconds, warmup in CASES:
            r = load.run(proc.url, body, conns, seconds, warmup, server=proc)
            out[name] = r
            bad = f"  ERRORS {r['errors']} non-2xx {r['non2xx']}" if r["errors"] or r["non2xx"] else ""
            print(
                f"  {server:<8} {name:<12} {r['rps']:7.0f} req/s  p50 {r['p50_ms']:8.3f} ms  p99 {r['p99_ms']:8.3f} ms"
                f"  cpu {r.get('server_cpu_ms_per_req', 0):.3f} ms/req{bad}",
                flush=True,
            )
    finally:
        proc.stop()
    return out


def main() -> int:
    install_cleanup()
    started, code, other = time.time(), code_fingerprint(), OtherLoad()
    ensure_granian()
    load = Load()
    servers = ["uvicorn", "granian"]
    rounds: dict[str, list[dict]] = {s: [] for s in servers}
    tmp = tempfile.mkdtemp(prefix="burnish-asgi-")
    upstream = start_upstream()
    print(f"upstream {upstream.url}; load generator: {load.tool}; gateway code: {git_state()}", flush=True)
    try:
        for i in range(ROUNDS):
            for server in servers:
                rounds[server].append(run_server(load, server, upstream.url, os.path.join(tmp, f"{server}-{i}")))
    finally:
        upstream.stop()
        Proc.stop_all()

    busy = other.share()
    print(f"\nother processes used {busy:.0%} of the machine's CPU during the run" + (" -- WARNING: figures skewed" if busy > 0.05 else ""), flush=True)
    if code_fingerprint() != code:
        print("\nWARNING: gateway/ changed on disk during this run; the figures mix two versions of the code", flush=True)
    summary: dict = {}
    print(f"\nMedian of {ROUNDS} rounds (each round in brackets); gateway app with recording on")
    print(f"{'case':<12} | {'uvicorn req/s':>22} | {'granian req/s':>22} | {'granian/uvicorn':>15} | {'uvicorn p50':>11} | {'granian p50':>11}")
    for name, *_ in CASES:
        row = {}
        for s in servers:
            rps = [r[name]["rps"] for r in rounds[s]]
            row[s] = {
                "rps": statistics.median(rps),
                "rps_rounds": rps,
                "p50_ms": statistics.median(r[name]["p50_ms"] for r in rounds[s]),
                "p99_ms": statistics.median(r[name]["p99_ms"] for r in rounds[s]),
            }
        row["granian_over_uvicorn_rps"] = row["granian"]["rps"] / row["uvicorn"]["rps"] if row["uvicorn"]["rps"] else 0.0
        summary[name] = row
        fmt = lambda s, row=row: f"{row[s]['rps']:6.0f} [" + " ".join(f"{x:.0f}" for x in row[s]["rps_rounds"]) + "]"  # noqa: E731
        print(
            f"{name:<12} | {fmt('uvicorn'):>22} | {fmt('granian'):>22} | {row['granian_over_uvicorn_rps']:>15.2f} |"
            f" {row['uvicorn']['p50_ms']:>8.3f} ms | {row['granian']['p50_ms']:>8.3f} ms"
        )
    verdicts = []
    for name, row in summary.items():
        u, g = row["uvicorn"]["rps_rounds"], row["granian"]["rps_rounds"]
        faster, slower = ("granian", "uvicorn") if row["granian_over_uvicorn_rps"] > 1 else ("uvicorn", "granian")
        ratio = row[faster]["rps"] / row[slower]["rps"] if row[slower]["rps"] else 0.0
        clear = min(row[faster]["rps_rounds"]) > max(row[slower]["rps_rounds"])
        verdicts.append(
            f"{name}: {faster} {(ratio - 1) * 100:+.0f}% req/s (median), "
            + ("every round" if clear else f"rounds overlap (uvicorn {min(u):.0f}-{max(u):.0f}, granian {min(g):.0f}-{max(g):.0f})")
        )
    verdict = "\n".join(verdicts)
    print("\n" + verdict)

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
        "rounds": ROUNDS,
        "versions": {s: server_version(s) for s in servers},
        "commands": {s: " ".join(server_cmd(s, 0)) for s in servers},
        "run_seconds": round(time.time() - started, 1),
    }
    RESULTS.write_text(json.dumps({"meta": meta, "summary": summary, "verdict": verdict, "rounds": rounds}, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)} ({meta['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
