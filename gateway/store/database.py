"""Engines and migrations.

Two engines over one database: a *writer* with a single connection, used only by
the group-commit writer (so this process never contends with itself for SQLite's
write lock), and a *reader* pool for the read API. On SQLite the writer opens its
transactions with ``BEGIN IMMEDIATE``: it takes the write lock up front and waits
(``busy_timeout``) for other processes, such as the trainer, instead of failing
on a read-then-write upgrade.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import migrations

SQLITE_BUSY_TIMEOUT_MS = 30_000
# Any constant shared by every burnish process: concurrent migrators take turns on it.
MIGRATION_LOCK_KEY = 0x6275726E697368  # "burnish"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _upgrade(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


class Database:
    def __init__(self, url: str, *, sqlite_synchronous: str = "NORMAL", reader_pool_size: int = 8) -> None:
        self.url = make_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        if self.is_sqlite:
            if self.url.database and self.url.database != ":memory:":
                Path(self.url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            self.reader = create_async_engine(self.url, pool_size=reader_pool_size)
            self.writer = create_async_engine(self.url, pool_size=1, max_overflow=0)
            _configure_sqlite(self.reader, sqlite_synchronous, immediate=False)
            _configure_sqlite(self.writer, sqlite_synchronous, immediate=True)
        else:
            self.reader = create_async_engine(self.url, pool_size=reader_pool_size, pool_pre_ping=True)
            self.writer = create_async_engine(self.url, pool_size=1, max_overflow=0, pool_pre_ping=True)

    async def migrate(self, revision: str = "head") -> None:
        async with self.writer.begin() as conn:
            if not self.is_sqlite:
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            await conn.run_sync(_upgrade, revision)

    async def dispose(self) -> None:
        await self.writer.dispose()
        await self.reader.dispose()


def _configure_sqlite(engine: AsyncEngine, synchronous: str, *, immediate: bool) -> None:
    if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ValueError(f"sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # noqa: ANN001
        # Let us, not the driver, decide when a transaction begins (SQLAlchemy's aiosqlite recipe).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn) -> None:  # noqa: ANN001
        conn.exec_driver_sql(begin)
