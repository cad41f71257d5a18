"""Throughput of `burnish gateway --workers 2` against one worker, on SQLite and on PostgreSQL.

    .venv/bin/python bench/workers.py [--pg postgresql://postgres@127.0.0.1:5432/test]

The benchmark's fast upstream (bench/harness.py), then for each store a gateway with one
worker and one with two (recording on; PostgreSQL emptied before each), loaded in turns,
twice each: 64 connections for 8 s after 2 s of warm-up, plain calls. Prints req/s and
the CPU per call of each gateway's processes (all workers). The load generator and the
upstream share the machine's cores with the gateway, as everywhere in bench/.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import start_gateway  # noqa: E402
from harness import PLAIN_BODY, ROOT, Load, OtherLoad, Proc, git_state, install_cleanup, start_upstream  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "workers.json"


async def empty_pg(url: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://"))
    async with engine.begin() as conn:
        await conn.execute(text("DROP SCHEMA public CASCADE"))
        await conn.execute(text("CREATE SCHEMA public"))
    await engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="an empty-able PostgreSQL database ('' to skip)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    install_cleanup()
    other, load = OtherLoad(), Load()
    stores = {"sqlite": None} | ({"postgresql": args.pg} if args.pg else {})
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="burnish-workers-") as tmp:
        upstream = start_upstream()
        try:
            for store, url in stores.items():
                for n in range(args.rounds):
                    for workers in (1, 2):
                        if url:
                            asyncio.run(empty_pg(url))
                        env = {"BURNISH_WORKERS": str(workers)} | ({"BURNISH_DATABASE_URL": url} if url else {})
                        gateway = start_gateway(upstream.url, True, f"{tmp}/{store}-{workers}-{n}", name=f"gateway-{workers}", env=env)
                        try:
                            r = load.run(gateway.url, PLAIN_BODY, 64, 8, 2, server=gateway)
                        finally:
                            gateway.stop()
                        results.setdefault(store, {}).setdefault(workers, []).append(r)
                        print(
                            f"{store:10s} workers {workers}: {r['rps']:.0f} req/s, {r['server_cpu_ms_per_req']:.3f} ms CPU per call, errors {r['errors']}",
                            flush=True,
                        )
        finally:
            upstream.stop()
            Proc.stop_all()
    print(f"\nmedians (other processes used {other.share():.0%} of the CPU):")
    for store, by in results.items():
        one, two = (statistics.median(r["rps"] for r in by[w]) for w in (1, 2))
        print(f"  {store:10s} 1 worker {one:.0f} req/s, 2 workers {two:.0f} req/s: x{two / one:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_state(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
