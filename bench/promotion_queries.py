"""The trainer's promotion queries on a store of a million calls, with the calls' indexes as migration 0012 made them and as they were before.

Run from the repository root (about 15 minutes; on PostgreSQL a database ``bench_promotion`` is
made on BURNISH_TEST_PG_URL's server, and dropped at the end)::

    .venv/bin/python bench/promotion_queries.py [--calls 1000000] [--database sqlite|postgresql|both]

Every few seconds the trainer reads the evidence on a policy's candidate (``store/promotion.py:
evidence``) or, between trials, whether the served version regressed (``regression_samples``). Both group
the policy's calls per trajectory, so they cost what the policy's whole history holds: timed where
that is long, as the trainer runs them (``Database.read``, the page cache warm), under each of
``SCHEMAS``, with the queries' plans; last, what each costs a write (calls inserted through
``Database.transaction``, 200 a commit).

The store is made by the project's migrations and filled in bulk with a month of traffic: 4 calls
per trajectory on average, five policies (``agent`` has 40% of the calls) each through steps 0 to
20, 60% of trajectories rewarded, 5% held out, 2% of calls failed. ``agent`` serves step 18
(promoted over 17) and has had step 20 on a canary trial for the last day. A call's bodies and
tokens take about 3x ``--body-bytes``; real ones are often larger, and on SQLite the columns after
them (``started_at``, ``policy``) then move to overflow pages, which a plan that reads the table's
rows pays for and one that reads only an index does not.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from sqlalchemy import Connection, create_engine, event, insert, make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from burnish_server.core.learning.policies import LoraSettings, PromotionSettings, TrainSettings
from burnish_server.store import promotion
from burnish_server.store.database import Database
from burnish_server.store.models import Call, PolicyRow, StepRow, Trajectory
from burnish_server.store.policies import get_policy

PG_SERVER = os.environ.get("BURNISH_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
SQLITE_PATH = Path("/tmp/bench_promotion.db")
POLICIES = {"agent": 0.4, "coder": 0.15, "support": 0.15, "search": 0.15, "summarize": 0.15}
NAMES, STATUSES = list(POLICIES), ("ok", "upstream_error", "client_disconnected", "upstream_cut")
DAYS, STEPS, SERVED, CANDIDATE, WINDOW = 30, 20, 18, 20, 100
BASE_MODEL = "Qwen/Qwen2.5-7B-Instruct"
# The schema as migration 0012 made it (one index that the three queries read alone), and as it
# was before (a policy's calls by step: every query read the policy's rows from the table).
SCHEMAS = {
    "0012": ("CREATE INDEX IF NOT EXISTS ix_calls_policy_trajectory ON calls (policy, trajectory_id, policy_step, status, started_at)",
             "DROP INDEX IF EXISTS ix_calls_policy_policy_step"),
    "before 0012": ("CREATE INDEX IF NOT EXISTS ix_calls_policy_policy_step ON calls (policy, policy_step)",
                    "DROP INDEX IF EXISTS ix_calls_policy_trajectory"),
}  # fmt: skip
FIXED = {"endpoint": "chat.completions", "http_status": 200, "error": None, "attempts": 1, "upstream_first_byte_ms": 80.0, "response_id": None}
TOKENS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "completion_lengths")
FAILED = {"http_status": 502, "error": "upstream answered 502", "response": None, "usage": None, **dict.fromkeys(TOKENS)}


class Traffic:
    """Who called what and when, as arrays: calls in the order they began, trajectories in theirs."""

    def __init__(self, n: int, seed: int, start: datetime, body_bytes: int) -> None:
        rng = np.random.default_rng(seed)
        sizes = 1 + rng.binomial(7, 3 / 7, n // 3 + 8)
        sizes = sizes[: np.searchsorted(np.cumsum(sizes), n) + 1]
        sizes[-1] -= sizes.sum() - n
        self.start, self.n, self.t = start, n, len(sizes)
        self.ids = [f"traj-{seed}{x:019x}" for x in rng.integers(0, 2**63, self.t)]
        self.policy = rng.choice(len(POLICIES), self.t, p=list(POLICIES.values()))
        self.begun = np.sort(rng.uniform(0, DAYS * 86400 - 3600, self.t))
        traj = np.repeat(np.arange(self.t), sizes)
        position = np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        started = self.begun[traj] + position * rng.uniform(20, 90, self.t)[traj]
        finished = started + rng.uniform(0.3, 15, n)
        self.since = float(started.max()) - 86400  # the candidate's trial: the last day
        self.eval = rng.random(self.t) < 0.05
        pinned = np.where(self.eval, rng.random(self.t) < 0.5, rng.random(self.t) < PromotionSettings().canary_share)[traj]
        agent = np.where((started >= self.since) & pinned, CANDIDATE, np.floor(started / self.since * (SERVED + 1)).clip(0, SERVED))
        step = np.where(self.policy[traj] == 0, agent, np.floor(started / (DAYS * 86400) * (STEPS + 1)).clip(0, STEPS)).astype(int)
        status = np.where(rng.random(n) < 0.98, 0, rng.integers(1, len(STATUSES), n))
        self.last = np.maximum.reduceat(finished, np.cumsum(sizes) - sizes)
        order = np.argsort(started, kind="stable")  # recorded as they come: trajectories interleave
        self.traj, self.started, self.finished, self.step, self.status = (a[order] for a in (traj, started, finished, step, status))
        self.stream, self.body = rng.random(n) < 0.3, rng.integers(0, 256, n)
        self.rewarded, self.reward = rng.random(self.t) < 0.6, rng.normal(0.55, 0.2, self.t).clip(0, 1)
        self.rewarded_at = self.last + rng.uniform(1, 600, self.t)
        words = "the agent reads the file calls a tool and answers with what it found in".split()
        self.pool = []  # bodies and tokens, drawn per call: text for the bodies, random bytes for the tokens
        for size in rng.integers(body_bytes // 2, body_bytes * 3 // 2, 256):
            content = " ".join(rng.choice(words, size // 5))
            request = f'{{"model":"agent","messages":[{{"role":"user","content":"{content}"}}],"logprobs":true}}'.encode()
            response = f'{{"choices":[{{"message":{{"role":"assistant","content":"{content[: size // 3]}"}}}}]}}'.encode()
            prompt, sampled = rng.bytes(len(request) // 4 * 4), rng.bytes(len(response) // 4 * 4)
            usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(sampled) // 4}
            self.pool.append(dict(zip(TOKENS, (prompt, sampled, rng.bytes(len(sampled)), len(sampled).to_bytes(4, "little")))))
            self.pool[-1].update(request=request, response=response, usage=usage)

    def at(self, seconds: float) -> datetime:
        return self.start + timedelta(seconds=float(seconds))

    def trajectories(self, lo: int, hi: int) -> list[dict[str, Any]]:
        rows = []
        for i in range(lo, hi):
            row = {"id": self.ids[i], "project": "default", "group_id": None, "reward_components": None, "eval": bool(self.eval[i])}
            row.update(created_at=self.at(self.begun[i]), updated_at=self.at(self.last[i]), reward=None, rewarded_at=None)
            rows.append(row | ({"reward": float(self.reward[i]), "rewarded_at": self.at(self.rewarded_at[i])} if self.rewarded[i] else {}))
        return rows

    def calls(self, lo: int, hi: int) -> list[dict[str, Any]]:
        rows = []
        for i in range(lo, hi):
            name, step = NAMES[self.policy[self.traj[i]]], int(self.step[i])
            row = FIXED | self.pool[self.body[i]] | {"trajectory_id": self.ids[self.traj[i]], "status": STATUSES[self.status[i]]}
            row.update(model=name, policy=name, policy_step=step, upstream_model=f"{name}@{step}" if step else BASE_MODEL, stream=bool(self.stream[i]))
            row.update(started_at=self.at(self.started[i]), finished_at=self.at(self.finished[i]), upstream_ms=(self.finished[i] - self.started[i]) * 1000)
            rows.append(row | FAILED if self.status[i] else row)
        return rows


def fill(url: str, traffic: Traffic, chunk: int = 20_000) -> None:
    """Bulk inserts: executemany on SQLite (a commit a chunk keeps the WAL small), COPY on PostgreSQL (no FK triggers)."""
    tables = ((Trajectory, traffic.t, traffic.trajectories), (Call, traffic.n, traffic.calls))
    if url.startswith("sqlite"):
        engine = create_engine(make_url(url).set(drivername="sqlite"))
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA synchronous=OFF")
            for table, count, rows in tables:
                for lo in range(0, count, chunk):
                    conn.execute(insert(table), rows(lo, min(lo + chunk, count)))
                    conn.commit()
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        engine.dispose()
        return

    async def copy() -> None:
        import asyncpg

        conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
        await conn.execute("SET session_replication_role = replica")
        for table, count, rows in tables:
            for lo in range(0, count, chunk):
                batch = rows(lo, min(lo + chunk, count))
                records = [tuple(msgspec.json.encode(v).decode() if k == "usage" and v else v for k, v in r.items()) for r in batch]
                await conn.copy_records_to_table(table.__tablename__, records=records, columns=list(batch[0]))
        await conn.execute("VACUUM ANALYZE")  # as autovacuum would have by now
        await conn.close()

    asyncio.run(copy())


def add_policies(conn: Any, traffic: Traffic) -> None:
    """The policies and their steps: agent promoted each of 1 to 18 over its parent, never served 19, has 20 on trial."""
    for name in POLICIES:
        agent, settings = name == "agent", {"lora": msgspec.to_builtins(LoraSettings()), "train": msgspec.to_builtins(TrainSettings())}
        since = traffic.at(traffic.since) if agent else None
        rule = msgspec.to_builtins(PromotionSettings(rule="canary" if agent else "immediate"))
        row = dict(name=name, base_model=BASE_MODEL, promotion=rule, paused=False, step=SERVED if agent else STEPS, head=CANDIDATE if agent else STEPS)
        conn.execute(insert(PolicyRow).values(row | settings | {"candidate": CANDIDATE if agent else None, "candidate_since": since}))
        for step in range(1, STEPS + 1):
            began = traffic.at(traffic.since * step / (SERVED + 1) if agent else DAYS * 86400 * step / (STEPS + 1))
            published = {CANDIDATE: since, SERVED + 1: None}.get(step, began) if agent else began
            row = dict(policy=name, step=step, parent=step - 1, groups=[f"group-{step}-{i}" for i in range(8)], metrics={"loss": 0.1, "reward_mean": 0.5})
            row.update(checkpoint=f"/data/checkpoints/{name}/{step}", trainer="trainer-1", created_at=began, published_at=published)
            row.update(publish_seconds=3.0 if published else None, decision=None, decided_at=None, decisions=None)
            if agent and step <= SERVED:
                row.update(
                    decision="promoted",
                    decided_at=began,
                    decisions=[{"decision": "promoted", "by": "test", "reason": "its test", "decided_at": began.isoformat()}],
                )
            conn.execute(insert(StepRow).values(row))


async def timed(db: Database, repeat: int, fn: Any, *args: Any) -> tuple[float, float, Any]:
    """p50 and p95 in milliseconds, and the last result."""
    seconds = []
    for _ in range(repeat):
        begun = time.perf_counter()
        result = await db.read(fn, *args)
        seconds.append(time.perf_counter() - begun)
    return statistics.median(seconds) * 1000, statistics.quantiles(seconds, n=20, method="inclusive")[18] * 1000, result


def plans(conn: Any, queries: dict[str, tuple[Any, ...]]) -> str:
    """Each query's statement, caught on its way to the driver and run again under EXPLAIN."""
    out, caught = [], []
    catch = lambda *a: caught.append(a[2:4])  # noqa: E731 (statement, parameters)
    event.listen(conn.engine, "before_cursor_execute", catch)
    for name, (fn, *args) in queries.items():
        fn(conn, *args)
        (statement, parameters), depth = caught[-1], {0: 0}
        out.append(f"  -- {name}")
        if conn.dialect.name == "sqlite":  # a comment of its own: the driver's cached EXPLAIN would show the plan from before an index changed
            for node, parent, _, detail in conn.exec_driver_sql(f"/* {time.monotonic_ns()} */ EXPLAIN QUERY PLAN {statement}", parameters):
                depth[node] = depth.get(parent, 0) + 1
                out.append("  " * depth[node] + detail)
        else:
            out += ["    " + line for (line,) in conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF) {statement}", parameters)]
    event.remove(conn.engine, "before_cursor_execute", catch)
    return "\n".join(out)


async def use_schema(db: Database, name: str) -> float:
    """Make the calls' indexes those of ``name`` (SCHEMAS); the seconds it took."""
    begun = time.perf_counter()
    for sql in SCHEMAS[name]:
        await db.transaction(Connection.exec_driver_sql, sql)
    return time.perf_counter() - begun


async def size(db: Database) -> int:
    """Bytes in use: the whole SQLite file, or PostgreSQL's indexes on calls."""
    sqlite = "SELECT (SELECT page_count FROM pragma_page_count) - (SELECT freelist_count FROM pragma_freelist_count), (SELECT page_size FROM pragma_page_size)"
    sql = sqlite if db.is_sqlite else "SELECT sum(pg_relation_size(indexrelid)), 1 FROM pg_index WHERE indrelid = 'calls'::regclass"
    return await db.read(lambda conn: int(math.prod(conn.execute(text(sql)).one())))


async def bench(kind: str, args: argparse.Namespace) -> None:
    for suffix in ("", "-wal", "-shm") if kind == "sqlite" else ():
        Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)
    url = f"sqlite+aiosqlite:///{SQLITE_PATH}"
    if kind == "postgresql":
        url = make_url(PG_SERVER).set(database="bench_promotion").render_as_string(hide_password=False)
        await admin("DROP DATABASE IF EXISTS bench_promotion WITH (FORCE)", "CREATE DATABASE bench_promotion")
    db = Database(url)
    await db.migrate()
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=DAYS)
    begun = time.perf_counter()
    traffic = Traffic(args.calls, 1, start, args.body_bytes)
    await asyncio.to_thread(fill, url, traffic)
    await db.transaction(add_policies, traffic)
    print(f"\n{kind}: {args.calls:,} calls of {traffic.t:,} trajectories filled in {time.perf_counter() - begun:.0f} s")
    canary = await db.read(get_policy, "agent")
    held_out = msgspec.structs.replace(canary, promotion=msgspec.structs.replace(canary.promotion, rule="eval"))
    between = msgspec.structs.replace(canary, head=SERVED, candidate=None, candidate_since=None)
    queries = {
        "samples, canary": (lambda conn, *a: promotion.samples(conn, *a, since=canary.candidate_since), "agent", [SERVED, CANDIDATE]),
        "samples, eval": (lambda conn, *a: promotion.samples(conn, *a, held_out=True), "agent", [SERVED, CANDIDATE]),
        "latest_sample": (promotion.latest_sample, "agent", SERVED, WINDOW),
    }
    print(f"{'schema':<16}{'canary p50/p95':>20}{'eval p50/p95':>20}{'regression p50/p95':>20}  (ms)")
    for name in SCHEMAS:
        took = await use_schema(db, name)
        figures = [await timed(db, args.repeat, promotion.evidence, policy) for policy in (canary, held_out)]
        figures.append(await timed(db, args.repeat, promotion.regression_samples, between))
        made = f"  (its index made in {took:.1f} s; indexes on calls: {await size(db) / 2**20:.0f} MiB)"
        print(f"{name:<16}" + "".join(f"{p50:>11.1f} /{p95:>7.1f}" for p50, p95, _ in figures) + made)
        if name == "0012":
            for label, (_, _, found) in zip(("canary", "eval"), figures):
                print(f"  {label} evidence: served n={found.served.n}, candidate n={found.candidate.n}, decision {found.decision}")
        if args.plans:
            print(await db.read(plans, queries))
    # Each schema twice, in turn and then the other way round, as a noisy machine drifts; 200 calls a commit.
    order = [*SCHEMAS, *reversed(SCHEMAS)]
    probe = Traffic(len(order) * args.probe_calls, 2, start + timedelta(days=DAYS + 1), args.body_bytes)
    await db.transaction(Connection.execute, insert(Trajectory), probe.trajectories(0, probe.t))
    costs: dict[str, list[float]] = {}
    for part, name in enumerate(order):
        await use_schema(db, name)
        begun = time.perf_counter()
        for lo in range(part * args.probe_calls, (part + 1) * args.probe_calls, 200):
            await db.transaction(Connection.execute, insert(Call), probe.calls(lo, lo + 200))
        costs.setdefault(name, []).append((time.perf_counter() - begun) / args.probe_calls * 1e6)
    for name, us in costs.items():
        print(f"write, schema {name}: {' and '.join(f'{u:.0f}' for u in us)} us a call")
    await db.dispose()
    if kind == "postgresql":
        await admin("DROP DATABASE bench_promotion WITH (FORCE)")
    for suffix in ("", "-wal", "-shm") if kind == "sqlite" else ():
        Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)


async def admin(*statements: str) -> None:
    engine = create_async_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        for statement in statements:
            await conn.execute(text(statement))
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--database", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--body-bytes", type=int, default=1000)
    parser.add_argument("--probe-calls", type=int, default=10_000, help="calls written per schema, twice, for what its indexes cost a write")
    parser.add_argument("--no-plans", dest="plans", action="store_false")
    args = parser.parse_args()
    for kind in ("sqlite", "postgresql") if args.database == "both" else (args.database,):
        asyncio.run(bench(kind, args))


if __name__ == "__main__":
    main()
