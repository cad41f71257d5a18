"""What a disk flush costs a process that touches no disk: the cadence of SQLite's checkpoints.

Run from the repository root (about 1.5 minutes)::

    .venv/bin/python bench/flush_stall.py [--mb-per-s 40] [--every 0.02,0.1,0.5,2]

The fast upstream (bench/harness.py, which reads and writes no file) answers one client on
one connection back to back (vs_litellm.py's c=1 case), first alone, then beside a writer in
another process that writes ``--mb-per-s`` to a file and syncs it (``fdatasync``) every
``--every`` seconds: the gateway's WAL and its checkpoints, without the gateway. Prints the
upstream's p50 and p99 beside each cadence. On a VM whose disk flushes hold up its CPUs (the
benchmark VM's did), the p99 grows with the size of each flush: this is why
store/database.py checkpoints often and small. Writes bench/results/flush_stall.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from multiprocessing import Process
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_litellm  # noqa: E402
from harness import ROOT, Load, Proc, git_state, install_cleanup, start_upstream  # noqa: E402

SECONDS, WARMUP = 8.0, 1.0
RESULTS = ROOT / "bench" / "results" / "flush_stall.json"
FILE_BYTES = 64 << 20  # the writer goes round a file of this size, as the WAL restarts from its start


def writer(path: str, mb_per_s: float, every: float, seconds: float) -> None:
    """``mb_per_s`` of 4 KiB pages written in 10 ms slices, synced every ``every`` s."""
    page = os.urandom(4096)
    per_slice = max(1, int(mb_per_s * 1e6 * 0.01 / len(page)))
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    offset, began = 0, time.monotonic()
    synced = began
    try:
        while (now := time.monotonic()) - began < seconds:
            for _ in range(per_slice):
                os.pwrite(fd, page, offset)
                offset = (offset + len(page)) % FILE_BYTES
            if now - synced >= every:
                os.fdatasync(fd)
                synced = now
            time.sleep(max(0.0, 0.01 - (time.monotonic() - now)))
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb-per-s", type=float, default=40.0, help="what the writer writes (the gateway at c=1 on the fast upstream: ~41 MB/s of WAL)")
    parser.add_argument("--every", default="0.02,0.1,0.5,2", help="the writer's sync cadences, seconds, comma-separated")
    args = parser.parse_args()
    install_cleanup()
    load = Load()
    upstream = start_upstream()
    rows: list[dict] = []
    data = Path(tempfile.mkdtemp(prefix="burnish-flush-stall-"))
    try:
        cadences = [None, *(float(x) for x in args.every.split(","))]
        for every in cadences:
            job = None
            if every is not None:
                job = Process(target=writer, args=(str(data / "wal"), args.mb_per_s, every, SECONDS + WARMUP + 3))
                job.start()
                time.sleep(1.0)  # the writer under way before the load begins
            r = load.run(upstream.url, vs_litellm.BODY, 1, SECONDS, WARMUP)
            if job is not None:
                job.join()
            label = "alone" if every is None else f"beside {args.mb_per_s:g} MB/s, synced every {every:g} s"
            rows.append({"every_s": every, "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "max_ms": r["max_ms"], "requests": r["requests"]})
            print(f"  {label:<40} p50 {r['p50_ms']:6.3f} ms  p99 {r['p99_ms']:7.3f} ms  max {r['max_ms']:7.1f} ms", flush=True)
    finally:
        Proc.stop_all()
        for f in data.iterdir():
            f.unlink()
        data.rmdir()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"git": git_state(), "mb_per_s": args.mb_per_s, "rows": rows}, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
