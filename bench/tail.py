"""Where the gateway's slowest calls go: what ran in its process during the calls above p99.

Run from the repository root (about 1 minute)::

    .venv/bin/python bench/tail.py [--seconds 15] [--rounds 2] [--against REV]

One client, one keep-alive connection, back-to-back calls (vs_litellm.py's c=1 case: one
short user message, the fixed-answer upstream), taking turns each round on three targets:
the upstream directly, ``burnish gateway`` (recording into SQLite, as vs_litellm.py starts
it), and the same gateway run by bench/tail_probe.py, which records each garbage collection,
asyncio task step, commit, store read, log record and upstream wait with its start and end.
The client is this process, with its own collector off, timing each call with the same clock.
``--against REV`` adds a fourth target, the gateway at commit REV (bench/harness.py's
``code_of``), to read a change's before and after in one run.

It prints each target's p50 and p99 and what the gateway added, then, for the probed
gateway's calls at or above its p99, what ran during them: for each kind of work, the share
of those calls it overlapped and its milliseconds per call, beside the same for the calls
around the median (p45 to p55). Kinds nest (a commit on the loop and a collection both run
inside the call's own task step), so a column does not sum to the latency. Time inside no
recorded work is the HTTP server's parsing, the sockets, the other processes and the OS.
Writes bench/results/tail.json.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import shutil
import socket
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_litellm  # noqa: E402
from gateway_overhead import start_gateway  # noqa: E402
from harness import HOST, PATH, PYTHON, ROOT, Proc, code_of, free_port, git_state, install_cleanup, start_upstream  # noqa: E402

BODY = vs_litellm.BODY.encode()  # vs_litellm.py's c=1 case, whose tail this explains
WARMUP_S = 1.0
RESULTS = ROOT / "bench" / "results" / "tail.json"
clock = time.perf_counter


def calls(port: int, seconds: float) -> list[tuple[float, float]]:
    """Back-to-back calls on one keep-alive connection for ``seconds`` after a warm-up: each
    call's (start, end), the end being when the whole answer was read."""
    head = f"POST {PATH} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
    request = head + BODY
    timed: list[tuple[float, float]] = []
    with socket.create_connection((HOST, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        begin = clock() + WARMUP_S
        end = begin + seconds
        gc.disable()  # the client's own pauses must not read as the gateway's
        try:
            while (start := clock()) < end:
                sock.sendall(request)
                _read_answer(sock)
                if start >= begin:
                    timed.append((start, clock()))
        finally:
            gc.enable()
    return timed


def _read_answer(sock: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += _recv(sock)
    header, body = data.split(b"\r\n\r\n", 1)
    if not header.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"not 200: {header[:200]!r}")
    length = next(int(line.split(b":", 1)[1]) for line in header.lower().split(b"\r\n") if line.startswith(b"content-length:"))
    while len(body) < length:
        body += _recv(sock)


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise RuntimeError("the connection closed")
    return chunk


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(timed: list[tuple[float, float]]) -> dict:
    ms = [(end - start) * 1000 for start, end in timed]
    return {"calls": len(ms), "p50_ms": quantile(ms, 0.50), "p99_ms": quantile(ms, 0.99), "max_ms": max(ms)}


def overlaps(events: list[tuple[str, str, float, float]], windows: list[tuple[float, float]]) -> dict[str, dict]:
    """For each kind of event: in how many windows it ran, and its seconds inside them (clipped)."""
    events = sorted(events, key=lambda e: e[2])
    starts = [e[2] for e in events]
    longest = max((e[3] - e[2] for e in events), default=0.0)
    seen: dict[str, set[int]] = defaultdict(set)
    inside: dict[str, float] = defaultdict(float)
    for i, (t0, t1) in enumerate(windows):
        for kind, name, s, e in events[bisect.bisect_left(starts, t0 - longest) : bisect.bisect_left(starts, t1)]:
            if e > t0 and s < t1:
                key = f"{kind}: {name}"
                seen[key].add(i)
                inside[key] += min(e, t1) - max(s, t0)
    n = len(windows) or 1
    return {key: {"share": len(seen[key]) / n, "ms_per_call": inside[key] * 1000 / n} for key in inside}


def attribute(timed: list[tuple[float, float]], events: list) -> dict:
    ordered = sorted(timed, key=lambda w: w[1] - w[0])
    n = len(ordered)
    slow = ordered[int(0.99 * n) :]
    median = ordered[int(0.45 * n) : int(0.55 * n)]
    return {
        "slow_calls": len(slow),
        "slow_ms": sum(e - s for s, e in slow) * 1000 / len(slow),
        "median_ms": sum(e - s for s, e in median) * 1000 / len(median),
        "slow": overlaps(events, slow),
        "median": overlaps(events, median),
    }


def print_attribution(a: dict) -> None:
    print(f"\nthe {a['slow_calls']} calls at or above p99 (mean {a['slow_ms']:.3f} ms) against the calls around the median ({a['median_ms']:.3f} ms):")
    print(f"  {'what ran during the call':<58} {'slow: share':>11} {'ms a call':>10} {'median: share':>14} {'ms a call':>10}")
    keys = sorted(set(a["slow"]) | set(a["median"]), key=lambda k: -a["slow"].get(k, {}).get("ms_per_call", 0.0))
    for key in keys:
        s, m = a["slow"].get(key, {"share": 0.0, "ms_per_call": 0.0}), a["median"].get(key, {"share": 0.0, "ms_per_call": 0.0})
        print(f"  {key[:58]:<58} {s['share']:>11.0%} {s['ms_per_call']:>10.3f} {m['share']:>14.0%} {m['ms_per_call']:>10.3f}")


def start_probed(upstream: str, data_dir: str, events: Path) -> Proc:
    port = free_port()
    cmd = [PYTHON, str(Path(__file__).resolve().parent / "tail_probe.py"), str(events), "gateway", "--upstream", upstream, "--host", HOST]
    cmd += ["--port", str(port), "--data-dir", data_dir, "--log-level", "warning", "--record"]
    return Proc("gateway-probed", cmd, port, health="/health").wait_ready(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="each target's calls, each round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--against", metavar="REV", help="also measure the gateway at this commit")
    parser.add_argument("--events", type=Path, help="keep the probed gateway's events and the calls' times in this JSON file")
    args = parser.parse_args()
    install_cleanup()
    tmp = Path(tempfile.mkdtemp(prefix="burnish-tail-"))
    try:
        upstream = start_upstream()
        targets = {"direct": upstream, "burnish": start_gateway(upstream.url, True, str(tmp / "plain"))}
        if args.against:
            targets[args.against] = start_gateway(upstream.url, True, str(tmp / "against"), name="gateway-against", env=code_of(args.against))
        targets["probed"] = probed = start_probed(upstream.url, str(tmp / "probed"), tmp / "events.json")
        runs: dict[str, list] = {label: [] for label in targets}
        for _ in range(args.rounds):
            for label, target in targets.items():
                runs[label] += calls(target.port, args.seconds)
                print(f"  {label:<8} {json.dumps({k: round(v, 3) for k, v in latency(runs[label]).items()})}", flush=True)
        probed.stop()  # the probe writes its events as the gateway exits
        events = [tuple(e) for e in json.loads((tmp / "events.json").read_text())["events"]]
        if args.events:
            args.events.write_text(json.dumps({"events": events, "calls": runs["probed"]}))
    finally:
        Proc.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    figures = {label: latency(timed) for label, timed in runs.items()}
    direct = figures["direct"]
    print(f"\nc=1, {args.rounds} rounds of {args.seconds:.0f} s a target (code: {git_state()})")
    for label, f in figures.items():
        added = "" if label == "direct" else f"   added p50 {f['p50_ms'] - direct['p50_ms']:.3f} ms, p99 {f['p99_ms'] - direct['p99_ms']:.3f} ms"
        print(f"  {label:<8} {f['calls']:>6} calls  p50 {f['p50_ms']:.3f} ms  p99 {f['p99_ms']:.3f} ms  max {f['max_ms']:.1f} ms{added}")
    attribution = attribute(runs["probed"], events)
    print_attribution(attribution)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"git": git_state(), "seconds": args.seconds, "rounds": args.rounds, "latency": figures, "attribution": attribution}, indent=2)
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
