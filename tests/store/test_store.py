"""The store on SQLite and PostgreSQL: migrations, group commit, isolation of bad records, reward races."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import func, inspect, select
from sqlalchemy.exc import IntegrityError

from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import NotFound
from burnish_server.core.protocols.records import CallRecord
from burnish_server.store.database import Database, alembic_config, compare_type
from burnish_server.store.models import Base, Call, Group, Reward, Trajectory
from burnish_server.store.writer import Writer
from burnish_server.store.writes import CloseGroup, PostReward


def record(trajectory: str, group: str | None = None, size: int | None = None, **fields) -> CallRecord:
    now = utcnow()
    base = dict(
        trajectory_id=trajectory,
        group_id=group,
        group_size=size,
        endpoint="chat.completions",
        model="tiny",
        stream=False,
        status="ok",
        http_status=200,
        request=b'{"model":"tiny"}',
        started_at=now,
        finished_at=now,
        response=b"{}",
    )
    return CallRecord(**{**base, **fields})


async def count(db: Database, model: type, *where) -> int:
    async with db.reader.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(model).where(*where))).scalar_one()


@pytest.fixture
async def db(database_url: str):
    database = Database(database_url)
    await database.migrate()
    yield database
    await database.dispose()


@pytest.fixture
async def writer(db: Database):
    w = Writer(db)
    w.start()
    yield w
    await w.close()


async def test_migrations_create_the_schema_and_are_idempotent(db: Database) -> None:
    await db.migrate()  # a second upgrade is a no-op
    async with db.reader.connect() as conn:
        tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        version = (await conn.exec_driver_sql("SELECT version_num FROM alembic_version")).scalar_one()
    assert {"groups", "trajectories", "calls", "rewards", "policies", "steps", "alembic_version"} <= tables
    assert version == ScriptDirectory.from_config(alembic_config()).get_current_head()


async def test_migrations_match_the_models(db: Database) -> None:
    """What Alembic would autogenerate against the migrated schema: nothing."""

    def diff(conn) -> list:
        return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": compare_type}), Base.metadata)

    assert await db.read(diff) == []


async def test_group_commit_batches_concurrent_records(db: Database, writer: Writer) -> None:
    futures = [writer.submit(record(f"gc-{i % 30}", group=f"grp-{i % 3}")) for i in range(300)]
    await asyncio.gather(*futures)
    assert writer.records == 300
    assert writer.commits < 30  # many records per commit, not one each
    assert await count(db, Call) == 300
    assert await count(db, Trajectory) == 30
    assert await count(db, Group) == 3


async def test_a_bad_record_fails_alone(db: Database, writer: Writer) -> None:
    good = [writer.submit(record(f"ok-{i}")) for i in range(5)]
    bad = writer.submit(record("broken", request=None))  # violates NOT NULL
    more = [writer.submit(record(f"ok-{i}")) for i in range(5, 10)]
    await asyncio.gather(*good, *more)
    with pytest.raises((IntegrityError, sqlite3.IntegrityError)):  # SQLite's writer runs on the raw driver
        await bad
    assert await count(db, Call) == 10
    assert await count(db, Trajectory, Trajectory.id == "broken") == 0


async def test_a_bad_lone_record_changes_nothing_and_the_next_is_written(db: Database, writer: Writer) -> None:
    """On SQLite a lone record commits on the loop, in a transaction begun on the driver itself:
    a failure rolls all of it back (its trajectory was upserted before its call failed)."""
    with pytest.raises((IntegrityError, sqlite3.IntegrityError)):
        await writer.write(record("broken-alone", request=None), alone=True)  # violates NOT NULL
    await writer.write(record("after"), alone=True)
    assert await count(db, Trajectory, Trajectory.id == "broken-alone") == 0
    assert await count(db, Call, Call.trajectory_id == "after") == 1


async def test_a_lone_write_waits_for_a_write_lock_held_elsewhere(sqlite_url: str) -> None:
    """``write(alone=True)`` commits on the loop only when SQLite's write lock is free at once;
    held by another process (the trainer, a migration), the record waits for it on the writer
    thread and is written, never refused. (SQLite's lock: PostgreSQL has no such path.)"""
    db = Database(sqlite_url)
    await db.migrate()
    writer = Writer(db)
    writer.start()
    try:
        other = sqlite3.connect(sqlite_url.split(":///", 1)[1], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        waiting = asyncio.ensure_future(writer.write(record("locked-out"), alone=True))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        other.execute("COMMIT")
        other.close()
        await asyncio.wait_for(waiting, 10)
        assert await count(db, Call, Call.trajectory_id == "locked-out") == 1
        await writer.write(record("alone"), alone=True)  # and with the lock free, at once
        assert await count(db, Call) == 2
    finally:
        await writer.close()
        await db.dispose()


async def test_first_group_size_wins_and_a_later_call_can_fill_it(db: Database, writer: Writer) -> None:
    await writer.write(record("s-1", group="sized"))
    await writer.write(record("s-2", group="sized", size=4))
    await writer.write(record("s-3", group="sized", size=9))
    async with db.reader.connect() as conn:
        assert (await conn.execute(select(Group.expected_size).where(Group.id == "sized"))).scalar_one() == 4


async def test_rejected_operations_change_nothing(db: Database, writer: Writer) -> None:
    with pytest.raises(NotFound) as missing:
        await writer.write(PostReward("nobody", 1.0))
    assert missing.value.code == "trajectory_not_found"
    with pytest.raises(NotFound):
        await writer.write(CloseGroup("nogroup"))
    assert await count(db, Reward) == 0


async def test_concurrent_rewards_from_two_writers_close_the_group_once(db: Database, database_url: str) -> None:
    """Two writers (as two gateway processes would have) reward one group's members at once."""
    size = 24
    other_db = Database(database_url)
    first, second = Writer(db), Writer(other_db)
    first.start()
    second.start()
    try:
        await asyncio.gather(*(first.write(record(f"m-{i}", group="race", size=size)) for i in range(size)))
        results = await asyncio.gather(*((first if i % 2 else second).write(PostReward(f"m-{i}", float(i))) for i in range(size)))
    finally:
        await first.close()
        await second.close()
        await other_db.dispose()
    assert sum(r["group_closed"] for r in results) == 1
    async with db.reader.connect() as conn:
        group = (await conn.execute(select(Group).where(Group.id == "race"))).one()
    assert group.close_reason == "complete" and group.closed_at is not None
    assert await count(db, Reward) == size
    assert await count(db, Trajectory, Trajectory.reward.is_not(None)) == size


async def test_writer_close_drains_the_queue(db: Database) -> None:
    w = Writer(db, batch_max=7)
    w.start()
    futures = [w.submit(record(f"d-{i}")) for i in range(50)]
    await w.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert await count(db, Call) == 50


async def test_sqlite_wal_stays_bounded_under_steady_writes(sqlite_url: str, monkeypatch) -> None:
    """Under steady writes the WAL is checkpointed and restarted: it does not grow without bound."""
    from pathlib import Path

    from burnish_server.store import database

    monkeypatch.setattr(database, "CHECKPOINT_EVERY_S", 0.05)
    monkeypatch.setattr(database, "WAL_PAGES", 256)  # 1 MiB (the loop's net at 2): restarted many times below
    db = Database(sqlite_url)
    await db.migrate()
    w = Writer(db)
    w.start()
    payload = b'{"pad":"' + b"x" * 20_000 + b'"}'
    try:
        for i in range(600):  # ~12 MB through the WAL
            await w.write(record(f"wal-{i}", request=payload))
    finally:
        await w.close()
    wal = Path(db.url.database + "-wal")
    assert wal.stat().st_size < 6_000_000  # without checkpoints it would hold all ~12 MB
    await db.dispose()
