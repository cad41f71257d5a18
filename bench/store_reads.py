"""The store's own reads on a store of a million calls (ten on PostgreSQL): a policy's status, the
trainer's poll, the promotion evidence and rollback watch, each as the gateway or the trainer runs it.

Run from the repository root (fills as ``bench/dashboard_pages.py`` does: SQLite in
/tmp/bench_dashboard.db, PostgreSQL in the database ``bench_dashboard`` on BURNISH_TEST_PG_URL's
server; ``--keep`` leaves them for a later ``--reuse``)::

    .venv/bin/python bench/store_reads.py [--calls 1000000] [--database sqlite|postgresql|both] [--keep] [--reuse]

Each read is timed ``--repeat`` times through ``Database.read`` (or ``transaction``), after opening
a fresh ``Database`` whose first run is reported apart (*first*: new connections, the statement
caches empty; the OS's page cache as the fill or the last run left it). The reads, with the budget
each has (docs/performance.md, "The store"):

* ``status``: ``policy_status`` of ``agent``, the API's ``GET /admin/policies/agent`` and the
  dashboard's snapshot, with the canary's test as the trainer's review kept it (50 ms);
* ``poll``: the trainer's pass for one policy: ``load_policies``, then ``claim_groups`` for a
  step of 8 groups in a transaction, given back at once (20 ms);
* ``ready``: ``count_ready`` alone (part of the status);
* ``recent``: ``recent_groups``, the ties the health report reads (part of the status);
* ``canary``, ``eval``: ``promotion.evidence`` of ``agent``'s candidate under a canary and an
  eval rule (50 ms); ``regression``: ``regression_samples`` between trials (50 ms);
* ``scores``: ``scores_by_step``, the held-out score of each version (the trainer's trackers).

Last, what a recorded call costs the store's write path as it holds this history: ``--probe-calls``
calls of a day after the month inserted through ``Database.transaction``, 200 a commit (the
gateway's group commit writes its batches so), in microseconds a call.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import Connection, insert

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboard_pages import drop, make  # noqa: E402
from promotion_queries import SERVED, Traffic  # noqa: E402

from burnish_server.store import promotion, versions  # noqa: E402
from burnish_server.store.database import Database  # noqa: E402
from burnish_server.store.evals import scores_by_step  # noqa: E402
from burnish_server.store.models import Call, Trajectory  # noqa: E402
from burnish_server.store.policies import get_policy, load_policies, policy_status, recent_groups  # noqa: E402
from burnish_server.store.training import claim_groups, count_ready, release_groups  # noqa: E402

BUDGETS_MS = {"status": 50.0, "poll": 20.0, "canary": 50.0, "eval": 50.0, "regression": 50.0}
WORKER = "bench-store-reads"


async def poll(db: Database) -> list[str]:
    """The trainer's pass for ``agent``: its policies, then a claim of a step's groups (given back)."""
    await db.read(load_policies)
    ids = await db.transaction(claim_groups, "agent", WORKER, 8)
    if ids:
        await db.transaction(release_groups, WORKER, ids)
    return ids


async def write_cost(url: str, calls: int, body_bytes: int) -> float:
    """Microseconds a recorded call takes to write, 200 a commit, on top of the store's history."""
    db = Database(url)
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    probe = Traffic(calls, 2, start, body_bytes)
    await db.transaction(Connection.execute, insert(Trajectory), probe.trajectories(0, probe.t))
    begun = time.perf_counter()
    for lo in range(0, calls, 200):
        await db.transaction(Connection.execute, insert(Call), probe.calls(lo, min(lo + 200, calls)))
    took = (time.perf_counter() - begun) / calls * 1e6
    await db.dispose()
    return took


async def time_reads(url: str, kind: str, repeat: int, only: str | None) -> None:
    db = Database(url)
    await db.migrate()  # a store filled by an older checkout gets this one's indexes
    await db.optimize()  # SQLite's planner statistics, as the gateway refreshes them at its start
    canary = await db.read(get_policy, "agent")
    held_out = msgspec.structs.replace(canary, promotion=msgspec.structs.replace(canary.promotion, rule="eval"))
    between = msgspec.structs.replace(canary, head=SERVED, candidate=None, candidate_since=None)
    # The canary's test as the trainer's review keeps it: the status shows it (store/promotion.py: shown_test).
    await db.transaction(versions.record_test, "agent", canary.candidate, await db.read(promotion.evidence, canary))
    await db.dispose()
    reads: dict[str, Any] = {
        "status": lambda db: db.read(policy_status, "agent"),
        "poll": poll,
        "ready": lambda db: db.read(count_ready, "agent"),
        "recent": lambda db: db.read(recent_groups, "agent"),
        "canary": lambda db: db.read(promotion.evidence, canary),
        "eval": lambda db: db.read(promotion.evidence, held_out),
        "regression": lambda db: db.read(promotion.regression_samples, between),
        "scores": lambda db: db.read(scores_by_step, "agent"),
    }
    print(f"\n{kind}: ms           first      p50      p95   budget")
    for name, read in reads.items():
        if only and not re.search(only, name):
            continue
        db = Database(url)
        seconds = []
        for _ in range(repeat + 1):
            begun = time.perf_counter()
            result = await read(db)
            seconds.append(time.perf_counter() - begun)
        await db.dispose()
        first, rest = seconds[0] * 1000, [s * 1000 for s in seconds[1:]]
        p95 = statistics.quantiles(rest, n=20, method="inclusive")[18]
        budget = BUDGETS_MS.get(name)
        mark = "" if budget is None else f"{budget:>8.0f}" + ("" if p95 <= budget else "  over")
        shown = "" if name not in ("ready", "recent", "poll") else f"   ({_short(result)})"
        print(f"  {name:<12}{first:>9.1f}{statistics.median(rest):>9.1f}{p95:>9.1f}{mark}{shown}")


def _short(result: Any) -> str:
    if isinstance(result, list):
        return f"{len(result)} groups claimed"
    if isinstance(result, int):
        return f"{result} ready"
    return f"{result.groups} groups, {result.tied} tied"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--database", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--body-bytes", type=int, default=1000)
    parser.add_argument("--long-steps", type=int, default=1000, help="steps of the policy longrun (0: no such policy)")
    parser.add_argument("--keep", action="store_true", help="leave the filled databases for a later --reuse")
    parser.add_argument("--reuse", action="store_true", help="time the databases a run with --keep left, without filling")
    parser.add_argument("--only", help="time only the reads whose name matches this regular expression")
    parser.add_argument("--probe-calls", type=int, default=10_000, help="calls written at the end for the write path's cost (0: none)")
    args = parser.parse_args()
    for kind in ("sqlite", "postgresql") if args.database == "both" else (args.database,):
        url = asyncio.run(make(kind, args))
        asyncio.run(time_reads(url, kind, args.repeat, args.only))
        if args.probe_calls:
            print(f"  write: {asyncio.run(write_cost(url, args.probe_calls, args.body_bytes)):.0f} us a recorded call (200 a commit)")
        if not args.keep:
            asyncio.run(drop(kind))


if __name__ == "__main__":
    main()
