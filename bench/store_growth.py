"""How fast the store grows: bytes on disk per recorded call, on SQLite and PostgreSQL.

Run from the repository root (under a minute; on PostgreSQL a database ``bench_store_growth`` is
made on BURNISH_TEST_PG_URL's server, and dropped at the end)::

    .venv/bin/python bench/store_growth.py [--calls 20000] [--database sqlite|postgresql|both]

The calls go through the store's write path as the gateway's go: ``store/writer.py``'s group
commit, ``insert_calls`` (their groups and trajectories upserted), a reward per trajectory
through ``PostReward``. Their shape is a typical agent's chat: trajectories of 5 turns in groups
of 4; each turn's request carries a system prompt, one tool's schema and the conversation so far
(0.9 to 2.6 KB of JSON), the answer about 0.4 KB, and vLLM's token ids and logprobs (a prompt's
ids at 4 bytes each, 80 sampled ids and their logprobs, drawn at random). The figure is the whole store: SQLite's
file (the WAL checkpointed into it first), or PostgreSQL's relations with their indexes and TOAST,
divided by the calls; beside it the bytes of the calls' own bodies and token arrays, and each
table's share. Last, ``burnish db prune``'s archive of them all (gzip-compressed JSON Lines),
per call, and how long the prune took (``cli/db.py: prune_store``, 100 groups a batch; the groups
marked trained first, and pruned with ``--include-trained``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from burnish_server.cli.db import ArchiveWriter, prune_store
from burnish_server.core.protocols.packed import pack_floats, pack_ids
from burnish_server.core.protocols.records import CallRecord
from burnish_server.store.database import Database
from burnish_server.store.writer import Writer
from burnish_server.store.writes import PostReward

PG_SERVER = os.environ.get("BURNISH_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DATABASE = "bench_store_growth"
TURNS, GROUP = 5, 4
SAMPLED = 80
VOCABULARY = 151_000  # Qwen2.5's
TABLES = ("calls", "trajectories", "groups", "rewards")

SYSTEM = (
    "You are a support agent for an online shop. Answer the customer's question using the tools "
    "when you need facts about an order; never invent an order's status. Be brief and polite, "
    "quote the order number you looked up, and if the customer asks for a refund explain the "
    "policy: 30 days from delivery, unused items, original packaging. "
) * 2
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by its number and return its status, items and dates.",
            "parameters": {"type": "object", "properties": {"order": {"type": "string", "description": "the order number, e.g. A-10442"}}},
        },
    }
]


def _calls(n: int) -> tuple[list[list[CallRecord]], int]:
    """``n`` calls, as trajectories of TURNS calls; and the bytes of their bodies and token arrays."""
    trajectories: list[list[CallRecord]] = []
    payload = 0
    rng = random.Random(0)
    start = datetime.now(UTC) - timedelta(hours=1)
    for t in range(n // TURNS):
        tid, gid = f"growth-{t}", f"growth-g{t // GROUP}"
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        calls = []
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"Where is my order A-{10000 + t}? I ordered it {turn + 3} days ago and it still says processing."})
            request = msgspec.json.encode({"model": "agent", "messages": messages, "tools": TOOLS, "temperature": 0.7})
            answer = f"I looked up order A-{10000 + t}: it shipped yesterday and should arrive within two days. Anything else I can help with? (turn {turn})"
            response = msgspec.json.encode(
                {
                    "id": f"chatcmpl-{t}-{turn}",
                    "object": "chat.completion",
                    "created": 1760000000,
                    "model": "agent@3",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": len(request) // 4, "completion_tokens": SAMPLED, "total_tokens": len(request) // 4 + SAMPLED},
                }
            )
            messages.append({"role": "assistant", "content": answer})
            # Ids and logprobs as random as a real model's (repeating ones would compress unlike real ones).
            tokens = {
                "prompt_token_ids": pack_ids([rng.randrange(VOCABULARY) for _ in range(len(request) // 4)]),
                "completion_token_ids": pack_ids([rng.randrange(VOCABULARY) for _ in range(SAMPLED)]),
                "completion_logprobs": pack_floats([-rng.expovariate(2.0) for _ in range(SAMPLED)]),
                "completion_lengths": pack_ids([SAMPLED]),
            }
            at = start + timedelta(milliseconds=10 * (t * TURNS + turn))
            calls.append(
                CallRecord(
                    trajectory_id=tid, group_id=gid, group_size=GROUP, endpoint="chat.completions", model="agent", stream=False, status="ok",
                    http_status=200, request=request, response=response, started_at=at, finished_at=at + timedelta(milliseconds=900),
                    usage={"prompt_tokens": len(request) // 4, "completion_tokens": SAMPLED}, policy="agent", policy_step=3,
                    upstream_model="agent@3", upstream_first_byte_ms=40.0, upstream_ms=900.0, **tokens,
                )
            )  # fmt: skip
            payload += len(request) + len(response) + sum(len(v or b"") for v in tokens.values())
        trajectories.append(calls)
    return trajectories, payload


async def _record(url: str, trajectories: list[list[CallRecord]]) -> float:
    db = Database(url)
    await db.migrate()
    writer = Writer(db)
    writer.start()
    began = time.perf_counter()
    try:
        # 64 agents at a time, each turn after the last, as the gateway's traffic comes.
        for first in range(0, len(trajectories), 64):
            chunk = trajectories[first : first + 64]
            for turn in range(TURNS):
                await asyncio.gather(*(writer.write(calls[turn]) for calls in chunk))
            await asyncio.gather(*(writer.write(PostReward(calls[0].trajectory_id, 0.25 * (i % 4))) for i, calls in enumerate(chunk)))
    finally:
        await writer.close()
        await db.dispose()
    return time.perf_counter() - began


def _sqlite_sizes(path: Path) -> tuple[int, dict[str, int]]:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        tables: dict[str, int] = {}
        try:  # dbstat: each table's pages, its indexes' with it
            indexes = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')").fetchall())
            for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall():
                table = indexes.get(name, name)
                tables[table] = tables.get(table, 0) + size
        except sqlite3.OperationalError:
            pass  # SQLite built without dbstat: the whole file only
    finally:
        conn.close()
    return path.stat().st_size, tables


async def _postgres_sizes(url: str) -> tuple[int, dict[str, int]]:
    engine = create_async_engine(url)
    async with engine.connect() as conn:
        tables = {t: int((await conn.execute(text("SELECT pg_total_relation_size(:t)"), {"t": t})).scalar_one()) for t in TABLES}
        rest = "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
        whole = int((await conn.execute(text(rest))).scalar_one())
    await engine.dispose()
    return whole, tables


async def _pg_database(create: bool) -> str:
    server = create_async_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    async with server.connect() as conn:
        await conn.execute(text(f"DROP DATABASE IF EXISTS {PG_DATABASE}"))
        if create:
            await conn.execute(text(f"CREATE DATABASE {PG_DATABASE}"))
    await server.dispose()
    return make_url(PG_SERVER).set(database=PG_DATABASE).render_as_string(hide_password=False)


async def _prune_all(url: str, folder: Path) -> tuple[int, float]:
    """Prune every call (as if a day later) into a gzip archive: its size, and the seconds taken.
    The groups, ready to train, are marked trained first (a ready group is never pruned)."""
    db = Database(url)
    await db.transaction(lambda conn: conn.execute(text("UPDATE groups SET trained_at = created_at, trained_step = 1")))
    writer = ArchiveWriter(folder / "archive.jsonl.gz")
    began = time.perf_counter()
    try:
        counts = await prune_store(db, "default", 0.5, True, writer, now=datetime.now(UTC) + timedelta(days=1))
    finally:
        writer.close()
        await db.dispose()
    assert counts.trajectories == writer.records, counts
    return writer.path.stat().st_size, time.perf_counter() - began


def _show_archive(calls: int, size: int, seconds: float) -> None:
    print(f"  pruned in {seconds:.1f} s; its archive (.jsonl.gz) {size / calls:,.0f} bytes per call")


def _show(name: str, calls: int, payload: int, whole: int, tables: dict[str, int], seconds: float) -> None:
    print(f"{name}: {calls} calls recorded in {seconds:.1f} s")
    print(f"  store {whole / 2**20:.1f} MiB: {whole / calls:,.0f} bytes per call (the calls' own bodies and tokens: {payload / calls:,.0f})")
    for table in TABLES:
        if table in tables:
            print(f"    {table:<13} {tables[table] / calls:>8,.0f} bytes per call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    trajectories, payload = _calls(args.calls)
    calls = len(trajectories) * TURNS
    if args.database in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "burnish.db"
            seconds = asyncio.run(_record(f"sqlite+aiosqlite:///{path}", trajectories))
            whole, tables = _sqlite_sizes(path)
            _show("SQLite", calls, payload, whole, tables, seconds)
            _show_archive(calls, *asyncio.run(_prune_all(f"sqlite+aiosqlite:///{path}", Path(folder))))
    if args.database in ("postgresql", "both"):
        url = asyncio.run(_pg_database(create=True))
        try:
            seconds = asyncio.run(_record(url, trajectories))
            whole, tables = asyncio.run(_postgres_sizes(url))
            _show("PostgreSQL", calls, payload, whole, tables, seconds)
            with tempfile.TemporaryDirectory() as folder:
                _show_archive(calls, *asyncio.run(_prune_all(url, Path(folder))))
        finally:
            asyncio.run(_pg_database(create=False))


if __name__ == "__main__":
    main()
