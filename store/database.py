"""Engines, the write path, and migrations.

Two engines over one database: a *writer* with a single connection, used only by
the group-commit writer (so this process never contends with itself for SQLite's
write lock), and a *reader* pool for the read API.

A store that is away or out of room (the server stopped or restarting, the disk full) raises
``StoreUnavailable`` from ``read`` and ``transaction``, whatever the driver said: every caller
answers it with 503 and ``Retry-After``, as nothing was changed (``unavailable`` below says which
failures those are).

Writes are plain (sync) SQLAlchemy functions of a ``Connection``, run by
``Database.transaction``. On PostgreSQL they run on asyncpg through ``run_sync``.
On SQLite the writer is the stdlib driver on one dedicated thread, and a whole
transaction is one hop to that thread: through aiosqlite every statement would be
a hop of its own, which measured at ~1.7 ms of CPU per recorded call. The SQLite
writer opens its transactions with ``BEGIN IMMEDIATE``: it takes the write lock
up front and waits (``busy_timeout``) for other processes, such as the trainer,
instead of failing on a read-then-write upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib.util
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, String, create_engine, event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from burnish_server.core.platform.errors import StoreUnavailable

log = logging.getLogger("burnish.store")

# How long a SQLite connection waits for another's lock (the writer, a migration, another
# process): long enough for any commit, so a busy store slows a call rather than failing it.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# WAL checkpoints: SQLite's auto-checkpoint copies the WAL back into the database file and
# syncs it (three fdatasyncs, 5-7 ms on the benchmark VM) inside whichever commit takes the WAL
# past its limit: with the default limit (1000 pages) one lone call in about a hundred waited
# for it, the whole p99. So commits never checkpoint on the event loop: a connection of its
# own, on its own thread, runs a PASSIVE checkpoint (which never blocks a writer) after
# commits, at most every CHECKPOINT_EVERY_S. PASSIVE alone never empties the WAL under steady
# writes (new pages arrive while it runs: the WAL grew past 100 MB), so once the WAL holds
# WAL_PAGES, commits go to the writer thread (``Database.wal_due``), which completes the
# checkpoint after its next commit, as the only writer then: the thread has already copied all
# but the last moment's pages, and the next commit starts the WAL over.
# The cadence is measured (c=1 on the fast upstream; figures in docs/performance.md, "Where
# the tail comes from"): a sync's flush slows every process on the benchmark VM while it
# writes, and the stall grows with the flush, so many small checkpoints beat a few large ones.
CHECKPOINT_EVERY_S = 0.1
WAL_PAGES = 16384  # 64 MiB of 4 KiB pages
# With little room on the data directory's file system the WAL's limit shrinks: it may hold at
# most WAL_SHARE of the room left (free space and its own file), so a checkpoint always has the
# rest to copy its pages into the database file and the WAL starts over. A WAL that could reach
# 64 MiB on a 64 MB file system grew until the disk was full, and after space was freed it filled
# it again without ever completing a checkpoint (docs/operations.md, "The data directory").
WAL_SHARE = 4
MIN_WAL_PAGES = 64  # 256 KiB: below this a checkpoint would run after nearly every commit
# Any constant shared by every burnish process: concurrent migrators take turns on it.
MIGRATION_LOCK_KEY = 0x6275726E697368  # "burnish"


# Found, not imported: the migrations import the store's tables (a layer above it).
MIGRATIONS = "burnish_server.migrations"


def alembic_config(url: str | None = None) -> Config:
    spec = importlib.util.find_spec(MIGRATIONS)
    assert spec is not None and spec.submodule_search_locations, f"{MIGRATIONS} is not installed"
    cfg = Config()
    cfg.set_main_option("script_location", spec.submodule_search_locations[0])
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


T = TypeVar("T")


def compare_type(context: Any, inspected_column: Any, metadata_column: Any, inspected_type: Any, metadata_type: Any) -> bool | None:
    """Alembic's type comparison, except a VARCHAR's length on SQLite, which SQLite ignores: a
    widened id column (migration 0008) is altered on PostgreSQL only, since on SQLite that would
    rebuild tables that others reference."""
    if context.dialect.name == "sqlite" and isinstance(inspected_type, String) and isinstance(metadata_type, String):
        return False
    return None  # Alembic's own comparison


def _upgrade(connection: Connection, revision: str) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


PAGE_BYTES = 4096  # SQLite's default page size, which the store keeps


class Room(msgspec.Struct, frozen=True):
    """The room a SQLite store has on its file system (``Database.room``)."""

    free_bytes: int
    wal_bytes: int  # the WAL file now
    wal_limit_bytes: int  # what checkpoints keep it within: 64 MiB, less where room is short
    short: bool  # less free space than the WAL may need at its full limit

    def said(self) -> str:
        full_size = WAL_PAGES * PAGE_BYTES
        return (
            f"less free space than the store's WAL may need: {self.free_bytes / 1e6:.0f} MB free on the data directory's file system, "
            f"under the {WAL_SHARE * full_size >> 20} MiB its {full_size >> 20} MiB limit asks; the WAL is kept within {self.wal_limit_bytes / 2**20:.1f} MiB"
        )


class Database:
    def __init__(self, url: str, *, sqlite_synchronous: str = "NORMAL", reader_pool_size: int = 8) -> None:
        self.url = make_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        self.writer: AsyncEngine | Engine
        if self.is_sqlite:
            if self.url.database and self.url.database != ":memory:":
                Path(self.url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            self.reader = create_async_engine(self.url, pool_size=reader_pool_size)
            _configure_sqlite(self.reader.sync_engine, sqlite_synchronous, immediate=False)
            sync_url = self.url.set(drivername="sqlite")
            # One connection, used only from the writer thread.
            self.writer = create_engine(sync_url, pool_size=1, max_overflow=0, connect_args={"check_same_thread": False})
            # The writer thread's auto-checkpoint stays on, at WAL_PAGES: a net should the
            # checkpoint thread fail (``_checkpoint_done``).
            _configure_sqlite(self.writer, sqlite_synchronous, immediate=True, autocheckpoint=WAL_PAGES)
            self._write_thread: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="burnish-sqlite-writer")
            self._write_conn: Connection | None = None
            self._checkpoint_thread = ThreadPoolExecutor(1, thread_name_prefix="burnish-sqlite-checkpoint")
            self._checkpoint_conn: sqlite3.Connection | None = None
            self._checkpoint_running = False
            self._last_checkpoint = 0.0
            # The WAL's limit now, in pages (WAL_PAGES, or less on a file system short of room).
            self.wal_pages = WAL_PAGES
            # The WAL reached WAL_PAGES: commits go to the writer thread until one of them
            # completes the checkpoint (set by the checkpoint thread, cleared by the writer's).
            self.wal_due = False
            self._synchronous = sqlite_synchronous.upper()
            # A second write connection, for ``transaction_here``: small commits on the event
            # loop's own thread, without the hop to the writer thread (which cost ~0.2 ms of CPU
            # per commit, more than the commit itself). It never waits for the write lock
            # (busy_timeout 0), so it can never stall the loop behind another writer; and not
            # where each commit syncs to disk (FULL, EXTRA).
            self.here: Engine | None = None
            self._here_conn: Connection | None = None
            if self._synchronous in {"OFF", "NORMAL"}:
                self.here = create_engine(sync_url, pool_size=1, max_overflow=0, connect_args={"check_same_thread": False})
                # Its auto-checkpoint is a net at twice WAL_PAGES, never reached while the
                # checkpoint thread keeps up (it ends a burst of writes faster than the thread looks).
                _configure_sqlite(self.here, sqlite_synchronous, immediate=True, busy_timeout_ms=0, autocheckpoint=2 * WAL_PAGES)
        else:
            # No JIT: the store's queries are short, and a correlated subquery's estimate (the
            # training queue's unsettled groups) crossed jit_above_cost, which then spent 30-200
            # ms compiling a query that reads no rows.
            args = {"server_settings": {"jit": "off"}} if self.url.get_driver_name() == "asyncpg" else {}
            self.reader = create_async_engine(self.url, pool_size=reader_pool_size, pool_pre_ping=True, connect_args=args)
            self.writer = create_async_engine(self.url, pool_size=1, max_overflow=0, pool_pre_ping=True, connect_args=args)
            self._write_thread = None
            self.here = None
            self.wal_due = False
            self.wal_pages = WAL_PAGES

    async def optimize(self) -> None:
        """SQLite: refresh the planner's statistics where they are missing or stale (``PRAGMA
        optimize``, each table's rows sampled, ``analysis_limit``). Without them SQLite picks
        plans by guess, and a read that should start from a few held-out trajectories starts from
        every call of a policy instead (bench/dashboard_pages.py: 10 s against 7 ms at a million
        calls). PostgreSQL's autovacuum keeps its own."""
        if self.is_sqlite:
            await self.transaction(_optimize)

    async def transaction(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in one write transaction; commit if it returns.
        ``StoreUnavailable`` if the store is away or full (nothing committed)."""
        try:
            if isinstance(self.writer, AsyncEngine):
                return await _committed(self.writer, fn, args)
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._write_thread, self._sync_transaction, fn, args)
        except Exception as exc:
            if unavailable(exc):
                raise unavailable_error(exc) from exc
            raise
        self._maybe_checkpoint(loop)
        return result

    def transaction_here(self, fn: Callable[..., T], *args: Any, bare: bool = False) -> T:
        """SQLite: ``fn(connection, *args)`` in one write transaction on this thread, now, if
        the write lock is free at once; else ``OperationalError`` ("database is locked") and
        nothing done. For small commits on the event loop (``store/writer.py``).

        ``bare``: ``fn`` runs its statements on the driver itself, as ``store/writes.py``'s
        ``insert_calls`` does on SQLite, so the transaction is begun and committed on the
        driver too, without SQLAlchemy's transaction object around it (6% of a lone proxied
        call's profile). ``fn`` must then not execute through SQLAlchemy."""
        assert self.here is not None, "only on SQLite, synchronous OFF or NORMAL"
        if self._here_conn is None:
            self._here_conn = self.here.connect()
        try:
            if bare:
                result = _bare_transaction(self._here_conn, fn, args)
            else:
                with self._here_conn.begin():
                    result = fn(self._here_conn, *args)
        except Exception:
            self._here_conn.close()  # start afresh: the connection may be unusable
            self._here_conn = None
            raise
        self._maybe_checkpoint(asyncio.get_running_loop())
        return result

    def _maybe_checkpoint(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._checkpoint_running and time.monotonic() - self._last_checkpoint > CHECKPOINT_EVERY_S:
            self._checkpoint_running = True
            loop.run_in_executor(self._checkpoint_thread, self._checkpoint).add_done_callback(self._checkpoint_done)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` on a reader connection (no write lock taken);
        ``StoreUnavailable`` if the store is away."""
        try:
            async with self.reader.connect() as conn:
                return await conn.run_sync(fn, *args)
        except Exception as exc:
            if unavailable(exc):
                raise unavailable_error(exc) from exc
            raise

    def _checkpoint(self) -> None:
        if self._checkpoint_conn is None:
            conn = sqlite3.connect(str(self.url.database), timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA synchronous={self._synchronous}")  # OFF: its checkpoints skip their syncs too
            self._checkpoint_conn = conn
        _busy, pages, _copied = self._checkpoint_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self._fit_wal()
        if pages >= self.wal_pages:
            self.wal_due = True

    def room(self) -> Room | None:
        """The data directory's free space and what the WAL may take of it (SQLite; None on
        PostgreSQL, whose server manages its own). A ``statvfs`` and a ``stat``: cheap enough for
        every checkpoint."""
        if not self.is_sqlite or not self.url.database or self.url.database == ":memory:":
            return None
        path = Path(self.url.database).expanduser()
        try:
            fs = os.statvfs(path.parent)
            wal = path.with_name(path.name + "-wal").stat().st_size if path.with_name(path.name + "-wal").exists() else 0
        except OSError:
            return None
        free = fs.f_bavail * fs.f_frsize
        limit = max(MIN_WAL_PAGES, min(WAL_PAGES, (free + wal) // WAL_SHARE // PAGE_BYTES))
        return Room(free_bytes=free, wal_bytes=wal, wal_limit_bytes=limit * PAGE_BYTES, short=limit < WAL_PAGES)

    def _fit_wal(self) -> None:
        """The WAL's limit fitted to the room left; said once each time it becomes short or is
        back to its full size."""
        room = self.room()
        if room is None:
            return
        pages = room.wal_limit_bytes // PAGE_BYTES
        if (pages < WAL_PAGES) != (self.wal_pages < WAL_PAGES):
            if room.short:
                log.warning("%s", room.said())
            else:
                log.warning(
                    "the store's file system has room again: %d MB free; the WAL's limit is back to %d MiB",
                    room.free_bytes // 10**6,
                    room.wal_limit_bytes >> 20,
                )
        self.wal_pages = pages

    def _checkpoint_done(self, future: asyncio.Future[None]) -> None:
        self._checkpoint_running = False
        self._last_checkpoint = time.monotonic()
        if not future.cancelled() and future.exception() is not None:
            log.warning("WAL checkpoint failed: %s", future.exception())
            self.wal_due = True  # the writer thread's connection checkpoints instead

    @property
    def here_open(self) -> bool:
        """Whether a commit may go to ``transaction_here`` now."""
        return self.here is not None and not self.wal_due

    def _complete_checkpoint(self, conn: Connection) -> None:
        # On the writer thread, after its commit, while loop commits wait for it: no other
        # writer, so a PASSIVE checkpoint copies every page left and the next commit restarts the WAL.
        # Short of room too: the WAL file keeps its size, but the limit counts it as room (``room``),
        # so it is reused from its start and never grows past the limit.
        driver = conn.connection.driver_connection
        assert driver is not None
        busy, pages, copied = driver.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if not busy and copied == pages:
            self.wal_due = False

    def _sync_transaction(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        # Runs on the writer thread, which keeps its one connection open between
        # transactions (a pool check-out and reset per commit cost ~0.05 ms).
        assert isinstance(self.writer, Engine)
        if self._write_conn is None:
            self._write_conn = self.writer.connect()
        try:
            with self._write_conn.begin():
                result = fn(self._write_conn, *args)
        except Exception:
            self._write_conn.close()  # start afresh: the connection may be unusable
            self._write_conn = None
            raise
        if self.wal_due:
            try:
                self._complete_checkpoint(self._write_conn)
            except Exception as exc:  # committed all the same; the next commit tries again
                log.warning("WAL checkpoint failed: %s", exc)
        return result

    async def migrate(self, revision: str = "head") -> None:
        await self.transaction(_upgrade, revision)

    async def dispose(self) -> None:
        if isinstance(self.writer, AsyncEngine):
            await self.writer.dispose()
        else:
            if self._write_conn is not None:
                conn, self._write_conn = self._write_conn, None
                await asyncio.get_running_loop().run_in_executor(self._write_thread, conn.close)
            assert self._write_thread is not None
            self._write_thread.shutdown(wait=True)
            self._checkpoint_thread.shutdown(wait=True)
            if self._checkpoint_conn is not None:
                self._checkpoint_conn.close()
            if self._here_conn is not None:
                self._here_conn.close()
            if self.here is not None:
                self.here.dispose()
            self.writer.dispose()
        await self.reader.dispose()


# SQLite's result codes that say the file cannot be written or read now, not that the statement is
# wrong: busy or locked past the busy time-out, an I/O error, full, cannot open, read-only.
SQLITE_AWAY = frozenset(
    {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY}
)
# PostgreSQL's SQLSTATE classes that say the same: 08 connection exception, 53 insufficient
# resources (53100: disk full), 57 operator intervention (shutting down, starting up); and 40,
# a transaction rolled back for a deadlock or a serialization failure, gone if sent again.
POSTGRES_AWAY = ("08", "40", "53", "57")


# A connection to the database refused, reset or unreachable.
CONNECTION_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT, errno.EPIPE})


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store is away or out of room (retry later), not that what was
    asked of it is wrong (a bug: those stay what they are)."""
    if isinstance(
        exc, StoreUnavailable | ConnectionError | TimeoutError | PoolTimeout | socket.gaierror
    ):  # no connection: refused, reset, timed out, no such host
        return True
    if isinstance(exc, OSError):  # by its number (asyncio's "Connect call failed" is a bare OSError), or several addresses' failures at once
        return exc.errno in CONNECTION_ERRNOS or str(exc).startswith("Multiple exceptions")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, InterfaceError):  # the connection's state (closed under it), not a value it could not bind
        return "connection" in str(exc).lower()
    for error in (exc, getattr(exc, "orig", None), exc.__cause__):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF in SQLITE_AWAY
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if isinstance(state, str) and state[:2] in POSTGRES_AWAY:
            return True
    # asyncpg's own connection errors, raised before SQLAlchemy wraps anything (its module, not imported here)
    return isinstance(exc, OperationalError) or (type(exc).__module__.startswith("asyncpg") and "Connection" in type(exc).__name__)


def full(what: BaseException | str) -> bool:
    """Whether an error (or its words) says the store's disk is full."""
    text = str(what).lower()
    return "disk is full" in text or "no space left" in text or "disk full" in text


def unavailable_error(exc: BaseException) -> StoreUnavailable:
    """What the caller is told of ``exc``, a failure ``unavailable`` says is the store's."""
    if isinstance(exc, StoreUnavailable):
        return exc
    if full(exc):
        return StoreUnavailable("the store's disk is full: nothing was changed; retry once space is freed", "store_full")
    return StoreUnavailable("the store is unavailable (the database did not answer): nothing was changed; retry shortly")


class CommitUnknown(StoreUnavailable):
    """The connection was lost while the database committed: the transaction may have committed
    or not, and nothing here can tell. Answered like any ``StoreUnavailable``, but never sent
    again by the writer, which could store its records twice (``store/writer.py``). SQLite never
    raises it: its commit is all or nothing, on this machine."""


async def _committed(engine: AsyncEngine, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """PostgreSQL: ``fn`` in a transaction, committed; a commit whose answer was lost with the
    connection is ``CommitUnknown``."""
    async with engine.connect() as conn:
        transaction = await conn.begin()
        try:
            result = await conn.run_sync(fn, *args)
        except BaseException:
            with contextlib.suppress(Exception):  # the connection may be gone already: rolled back with it
                await transaction.rollback()
            raise
        try:
            await transaction.commit()
        except Exception as exc:
            if unavailable(exc):
                raise CommitUnknown("the store went away while it committed: the change may or may not have been made; retry shortly") from exc
            raise
        return result


def _on_driver(driver: sqlite3.Connection, sql: str) -> None:
    """A statement straight to the stdlib driver, its errors raised as SQLAlchemy's, which
    callers handle ("database is locked": ``OperationalError``)."""
    try:
        driver.execute(sql)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc


def _bare_transaction(conn: Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    _on_driver(driver, "BEGIN IMMEDIATE")
    try:
        result = fn(conn, *args)
        _on_driver(driver, "COMMIT")
    except BaseException:
        if driver.in_transaction:
            driver.rollback()
        raise
    return result


# Rows SQLite samples per index when it refreshes its statistics: a bounded cost at any size.
ANALYSIS_LIMIT = 1000


def _optimize(conn: Connection) -> None:
    conn.exec_driver_sql(f"PRAGMA analysis_limit={ANALYSIS_LIMIT}")
    if _unanalysed(conn):
        # A new store, or a migration's new index. PRAGMA optimize's 0x10000 (every table, used
        # or not) is SQLite 3.46's: an older library (Python's own may be 3.40) would leave the
        # planner guessing until a connection happened to close after using the table.
        conn.exec_driver_sql("ANALYZE")
    else:
        conn.exec_driver_sql("PRAGMA optimize=0x10002")  # 0x10000: every table, analysed or not yet


def _unanalysed(conn: Connection) -> bool:
    """Whether an index of a table that holds rows has no statistics (``sqlite_stat1``)."""
    if conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").first() is None:
        return True
    indexes = conn.exec_driver_sql("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'").all()
    known = {row[0] for row in conn.exec_driver_sql("SELECT idx FROM sqlite_stat1")}
    # An empty table's indexes get no statistics: analysing it again would find none.
    return any(name not in known and conn.exec_driver_sql(f'SELECT 1 FROM "{table}" LIMIT 1').first() is not None for name, table in indexes)


def _configure_sqlite(
    engine: Engine, synchronous: str, *, immediate: bool, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS, autocheckpoint: int | None = None
) -> None:
    if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ValueError(f"sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # noqa: ANN001
        # Let us, not the driver, decide when a transaction begins (SQLAlchemy's pysqlite/aiosqlite recipe).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        if autocheckpoint is not None:  # the write connections (CHECKPOINT_EVERY_S above)
            cursor.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
        cursor.close()

    if immediate:  # the write engines, on the stdlib driver: straight to it (SQLAlchemy's statement machinery cost ~0.02 ms a commit)

        @event.listens_for(engine, "begin")
        def _on_begin_immediate(conn) -> None:  # noqa: ANN001
            _on_driver(conn.connection.driver_connection, "BEGIN IMMEDIATE")

    else:

        @event.listens_for(engine, "begin")
        def _on_begin(conn) -> None:  # noqa: ANN001
            conn.exec_driver_sql("BEGIN")
