"""CPU per call through the gateway's ASGI app in-process: no server, no client socket.

Run from the repository root (about 1 minute)::

    .venv/bin/python bench/inprocess.py [--mode plain|stream] [--concurrency 16] [--calls 4000] [--profile FILE]
    .venv/bin/python bench/inprocess.py --against REV   # this checkout and commit REV, rounds taking turns

It starts the benchmark upstream (bench/harness.py) in its own process, builds the app with
``create_app`` (recording into a fresh SQLite store), runs its lifespan, and drives it with
ASGI scopes and messages made here, ``--concurrency`` calls at a time on one uvloop loop.
What it prints is this process's CPU time per call: the app (routing, access, the proxy,
the upstream client, the record and its commit) without the ASGI server's HTTP parsing and
socket writes. That leaves out the noisiest parts of the end-to-end benchmarks, so an A/B
of a change to the app reads to a few percent; it does not replace them. ``--profile``
writes a cProfile of the measured calls. ``--against REV`` runs each round twice, in fresh
processes taking turns: once with this checkout, once with commit REV's code (``git
archive``, bench/harness.py's ``code_of``), and prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import PATH, PLAIN_BODY, PYTHON, STREAM_BODY, code_of, install_cleanup, start_upstream  # noqa: E402

from burnish_server.core.platform.settings import Settings  # noqa: E402
from burnish_server.gateway.app import create_app  # noqa: E402


async def one_call(app, body: bytes, n: int) -> int:  # noqa: ANN001 - raw ASGI
    """One POST through the app; returns the status. The client reads the whole answer."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-trajectory-id", b"inproc-%d" % n),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    done = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await done.wait()  # as a server does: a disconnect only once the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False):
            done.set()

    await app(scope, receive, send)
    done.set()
    return status


def callgrind(switch: str) -> None:
    """Turn valgrind's instruction counting on or off in this process (run under callgrind)."""
    subprocess.run(["callgrind_control", "--instr=" + switch, str(os.getpid())], check=True, capture_output=True, timeout=60)


async def drive(upstream: str, mode: str, concurrency: int, calls: int, warmup: int, profile: str | None, count: bool = False) -> dict:
    data = tempfile.mkdtemp(prefix="bench-inproc-")
    settings = Settings.load({}, upstream=upstream, data_dir=data, record=True)
    app = create_app(settings)
    body = (STREAM_BODY if mode == "stream" else PLAIN_BODY).encode()
    async with app.lifespan():
        counter = iter(range(10**9))

        async def worker(quota: int) -> None:
            for _ in range(quota):
                status = await one_call(app, body, next(counter))
                assert status == 200, status

        await asyncio.gather(*(worker(warmup // concurrency + 1) for _ in range(concurrency)))  # warm-up
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        if count:
            callgrind("on")
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(calls // concurrency) for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if count:
            callgrind("off")
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        done = concurrency * (calls // concurrency)
    return {"mode": mode, "concurrency": concurrency, "calls": done, "cpu_ms_per_call": 1000 * cpu / done, "calls_per_s": done / wall}


def instructions(env: dict[str, str], args: argparse.Namespace) -> float:
    """Instructions per measured call, counted by valgrind's callgrind: runs of the same code
    agree within ~6% (the order in which the upstream's bytes and the app's reads meet still
    varies, and the app's background tasks run on the clock), whatever else the machine is doing."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed to count instructions: apt-get install valgrind")
    out = Path(tempfile.mkdtemp(prefix="bench-callgrind-")) / "callgrind.out"
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", PYTHON, __file__, "--under-callgrind"]
    command += ["--rounds", "1", "--mode", args.mode, "--concurrency", str(args.concurrency), "--calls", str(args.calls), "--warmup", str(args.warmup)]
    run = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=1800, check=True)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    collected = int(re.search(r"Collected : (\d+)", run.stderr)[1])  # type: ignore[index]
    return collected / result["calls"]


def against(rev: str | None, args: argparse.Namespace) -> None:
    """Rounds taking turns between this checkout and ``rev``, each in a fresh process."""
    targets = {"this checkout": {}} | ({rev: code_of(rev)} if rev else {})
    if args.instructions:
        counts = {name: instructions(env, args) for name, env in targets.items()}
        summary = {name: round(n) for name, n in counts.items()}
        if rev:
            summary["ratio"] = counts["this checkout"] / counts[rev]
        print(json.dumps({"mode": args.mode, "concurrency": args.concurrency, "instructions_per_call": summary}))
        return
    assert rev is not None
    cpu: dict[str, list[float]] = {name: [] for name in targets}
    command = [PYTHON, __file__, "--rounds", "1", "--mode", args.mode, "--concurrency", str(args.concurrency), "--calls", str(args.calls)]
    for i in range(args.rounds):
        for name, env in targets.items():
            out = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=True).stdout
            cpu[name].append(json.loads(out.strip().splitlines()[-1])["cpu_ms_per_call"])
            print(f"round {i + 1}, {name}: {cpu[name][-1]:.3f} ms of CPU per call", flush=True)
    # Noise here only ever adds CPU time (another process, a cold cache): the least of a few
    # rounds is the steadier figure; the median is printed beside it.
    (this, that), (this_med, that_med) = ([f(v) for v in cpu.values()] for f in (min, statistics.median))
    print(
        json.dumps(
            {
                "mode": args.mode,
                "concurrency": args.concurrency,
                "this_ms": this,
                f"{rev}_ms": that,
                "ratio": this / that,
                "ratio_of_medians": this_med / that_med,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["plain", "stream"], default="plain")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="write a cProfile of the last round's measured calls here")
    parser.add_argument("--against", metavar="REV", help="take turns with commit REV's code, and print the ratio")
    parser.add_argument("--instructions", action="store_true", help="count instructions per call under valgrind instead (one round each)")
    parser.add_argument("--under-callgrind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    install_cleanup()
    if args.against or args.instructions:
        against(args.against, args)
        return
    upstream = start_upstream()
    try:
        for i in range(args.rounds):
            profile = args.profile if i == args.rounds - 1 else None
            result = uvloop.run(drive(upstream.url, args.mode, args.concurrency, args.calls, args.warmup, profile, args.under_callgrind))
            print(json.dumps(result), flush=True)
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
