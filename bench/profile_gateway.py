"""Where the gateway's CPU goes: py-spy on a gateway under the benchmark's load.

Run from the repository root (about 1.5 minutes; installs py-spy into the venv if missing)::

    .venv/bin/python bench/profile_gateway.py

For each scenario (mode, recording, concurrency) it starts the benchmark upstream and a
fresh ``burnish gateway``, warms up for 2 s, then samples the gateway process (all its
threads, 250 Hz, ``--nonblocking``) for 10 s while wrk drives the load. Samples are put
in buckets by what the code is doing, and each bucket's share is turned into
milliseconds of CPU per request with the CPU time the process really used.
The raw collapsed stacks are kept in bench/results/profile-*.txt (flamegraph.pl reads them).
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import start_gateway  # noqa: E402
from harness import PLAIN_BODY, ROOT, STREAM_BODY, VENV_BIN, Load, Proc, install_cleanup, start_upstream  # noqa: E402

SECONDS, WARMUP, RATE = 10, 2, 250
SCENARIOS = [("plain", False, 1), ("plain", True, 1), ("plain", False, 64), ("plain", True, 64), ("stream", True, 64)]
OUT = ROOT / "bench" / "results"

STORE = "store: recording calls (SQLAlchemy + SQLite, on the loop and the writer thread)"
UPSTREAM = "upstream client (gateway/upstream/connections/http1.py): request and response"
# Checked against the whole stack first: these own every sample they appear in.
OWNERS = [
    ("logging/", "logging (any logger: formatting and handlers)"),
    ("store/", STORE),
    ("Call.record", "building the call record"),
]
# Then the frame nearest the leaf that matches decides.
LEAF = [
    ("aiosqlite/", STORE),
    ("sqlalchemy/", STORE),
    ("sqlite3", STORE),
    ("gateway/proxy/capture.py", "SSE parsing and stream capture"),
    ("gateway/upstream/connections/http1.py", UPSTREAM),
    ("httptools/", UPSTREAM),
    ("gateway/upstream/client.py", UPSTREAM),
    ("tenacity/", "tenacity retry wrapper"),
    ("uvicorn/", "uvicorn: HTTP parsing and socket writes"),
    ("litestar/", "Litestar: routing, request, response objects"),
    ("msgspec", "gateway code (proxy, keys, capture)"),
    ("gateway/", "gateway code (proxy, keys, capture)"),
]


# Leaves that are a thread waiting (py-spy cannot tell these from work here): left out of the shares.
# uvloop's own C code shows as Runner.run; at c=1 that is mostly the idle epoll wait, so it is left out too
# (at c=64 it is under 7% of the samples).
IDLE = ("aiosqlite/core.py:59)", "concurrent/futures/thread.py:81)", "Condition.wait (threading.py", "Runner.run (asyncio/runners.py")


def bucket(frames: list[str]) -> str | None:
    if frames[-1].startswith(IDLE) or frames[-1].endswith(IDLE[:2]):
        return None
    joined = ";".join(frames)
    if "_monitor" in frames[0] and "logging/" in joined:
        return "logging (listener thread writing the lines)"
    for needle, name in OWNERS:
        if needle in joined:
            return name
    for frame in reversed(frames[1:]):
        for needle, name in LEAF:
            if needle in frame:
                return name
    return "other"


def analyse(path: Path, cpu_ms_per_req: float) -> list[str]:
    buckets: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    idle = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if (name := bucket(frames)) is None:
            idle += int(n)
            continue
        buckets[name] += int(n)
        leaf[re.sub(r":\d+\)$", ")", frames[-1])] += int(n)
    total = sum(buckets.values()) or 1
    lines = [f"    {count / total * 100:5.1f}%  ~{count / total * cpu_ms_per_req:5.3f} ms/req  {name}" for name, count in buckets.most_common()]
    lines.append(f"    ({idle} samples of waiting threads and of uvloop's C loop left out; {total} counted)")
    lines.append("    top frames by own time: " + "; ".join(f"{f} {c / total * 100:.1f}%" for f, c in leaf.most_common(6)))
    return lines


def py_spy() -> str:
    exe = VENV_BIN / "py-spy"
    if not exe.exists():
        subprocess.run([str(VENV_BIN / "python"), "-m", "pip", "install", "-q", "py-spy"], check=True, timeout=300)
    return str(exe)


def main() -> int:
    install_cleanup()
    spy_exe = py_spy()
    load = Load()
    OUT.mkdir(parents=True, exist_ok=True)
    upstream = start_upstream()
    report: list[str] = []
    try:
        for mode, record, conns in SCENARIOS:
            body = PLAIN_BODY if mode == "plain" else STREAM_BODY
            gateway = start_gateway(upstream.url, record, tempfile.mkdtemp(prefix="burnish-prof-"))
            name = f"{mode}-{'on' if record else 'off'}-c{conns}"
            raw = OUT / f"profile-{name}.txt"
            try:
                load.run(gateway.url, body, conns, WARMUP)
                spy = subprocess.Popen(
                    [
                        spy_exe,
                        "record",
                        "-p",
                        str(gateway.proc.pid),
                        "-r",
                        str(RATE),
                        "-d",
                        str(SECONDS),
                        "--nonblocking",
                        "--threads",
                        "-f",
                        "raw",
                        "-o",
                        str(raw),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                result = load.run(gateway.url, body, conns, SECONDS, server=gateway)
                _, err = spy.communicate(timeout=60)
                if not raw.exists():
                    raise RuntimeError(f"py-spy wrote nothing: {err.decode()[-500:]}")
            finally:
                gateway.stop()
            cpu = result.get("server_cpu_ms_per_req", 0.0)
            head = f"{name}: {result['rps']:.0f} req/s, p50 {result['p50_ms']:.2f} ms, gateway CPU {cpu:.3f} ms/req (under py-spy)"
            block = [head, *analyse(raw, cpu), ""]
            report += block
            print("\n".join(block), flush=True)
    finally:
        upstream.stop()
        Proc.stop_all()
    (OUT / "profile_gateway.txt").write_text("\n".join(report))
    print(f"wrote {(OUT / 'profile_gateway.txt').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
