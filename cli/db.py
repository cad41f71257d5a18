"""``burnish db prune`` and ``burnish db restore``: retention, and the archive files they share.

An archive is JSON Lines (``.jsonl``), gzip-compressed JSON Lines (``.jsonl.gz``), or Parquet
(``.parquet``, with pyarrow installed): one archived trajectory per line or row
(``core/platform/archive.py``). Prune writes each batch to it and syncs it to disk before the batch's
deletion commits (``store/retention.py``). A Parquet file is only whole once closed, so prune
first writes a JSON Lines journal beside it (``<archive>.partial.jsonl``), synced batch by
batch like any archive, turns it into the Parquet file at the end, and removes it: if prune
is stopped midway, the journal is the archive (restore reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import click

from burnish_server.core.platform.archive import ArchivedTrajectory, CorruptArchive, decode, encode
from burnish_server.core.platform.settings import Settings

KINDS = (".jsonl", ".jsonl.gz", ".parquet")
# Trajectories and groups per batch: each batch is a short transaction.
BATCH = 100
# Records restored per transaction.
RESTORE_BATCH = 100
# Tries of a batch's transaction (a lock time-out, a deadlock with another writer).
ATTEMPTS = 5


class ArchiveError(click.ClickException):
    pass


def archive_kind(path: Path) -> str:
    name = path.name.lower()
    for kind in (".jsonl.gz", ".jsonl", ".parquet"):
        if name.endswith(kind) and len(name) > len(kind):
            return kind
    raise click.UsageError(f"--archive {str(path)!r}: name it *.jsonl, *.jsonl.gz or *.parquet")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system syncs a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pyarrow() -> Any:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet
    except ImportError:
        raise click.ClickException("a .parquet archive needs pyarrow (pip install pyarrow); or name it *.jsonl.gz") from None
    return pyarrow


class ArchiveWriter:
    """Appends records to a new archive file, synced to disk on every ``write``. The file is
    made at the first write (none if nothing is pruned); an existing file is never replaced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kind = archive_kind(path)
        if self.kind == ".parquet":
            _pyarrow()
        self.journal = path.with_name(path.name + ".partial.jsonl") if self.kind == ".parquet" else path
        for target in {path, self.journal}:
            if target.exists():
                raise click.UsageError(f"{target} exists: an archive is never overwritten; name a new one")
        if not path.parent.is_dir():
            raise click.UsageError(f"cannot write the archive {path}: {path.parent} is not a folder")
        if not os.access(path.parent, os.W_OK):
            raise click.UsageError(f"cannot write the archive {path}: {path.parent} is not writable")
        self.records = 0
        self._raw: IO[bytes] | None = None
        self._gzip: gzip.GzipFile | None = None

    def write(self, records: list[ArchivedTrajectory]) -> None:
        if self._raw is None:
            self._raw = open(self.journal, "xb")  # noqa: SIM115 (held across batches)
            _fsync_dir(self.journal.parent)
            if self.kind == ".jsonl.gz":
                self._gzip = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0)
        data = b"".join(encode(r) + b"\n" for r in records)
        if self._gzip is not None:
            self._gzip.write(data)
            self._gzip.flush(zlib.Z_SYNC_FLUSH)  # every byte so far readable, before the delete commits
        else:
            self._raw.write(data)
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self.records += len(records)

    def close(self) -> None:
        if self._raw is None:
            return
        if self._gzip is not None:
            self._gzip.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        self._raw = None
        if self.kind == ".parquet":
            _to_parquet(self.journal, self.path)
            self.journal.unlink()
            _fsync_dir(self.path.parent)

    @property
    def written(self) -> bool:
        return self.records > 0


def _to_parquet(journal: Path, path: Path) -> None:
    """The journal's records as a Parquet file: a few columns to find them by, and each record
    whole, as its JSON line (``record``), which restore reads."""
    pa = _pyarrow()
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("project", pa.string()),
            ("group_id", pa.string()),
            ("updated_at", pa.timestamp("us", tz="UTC")),
            ("calls", pa.int32()),
            ("record", pa.string()),
        ]
    )
    partial = path.with_name(f".{path.name}.partial")
    with pa.parquet.ParquetWriter(partial, schema, compression="zstd") as out:
        rows: list[ArchivedTrajectory] = []
        lines: list[str] = []

        def flush() -> None:
            columns = {
                "id": [r.id for r in rows],
                "project": [r.project for r in rows],
                "group_id": [r.group_id for r in rows],
                "updated_at": [r.updated_at for r in rows],
                "calls": [len(r.calls) for r in rows],
                "record": lines,
            }
            out.write_table(pa.table(columns, schema=schema))

        for _, line in _lines(journal):
            rows.append(decode(line))
            lines.append(line.decode())
            if len(rows) == 1000:
                flush()
                rows, lines = [], []
        if rows:
            flush()
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    partial.rename(path)


# ---- reading -----------------------------------------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of an archive, blank lines left out. A gzip stream cut short (a prune
    stopped before it closed its archive) ends at its last whole line."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PAR1":
        yield from _parquet_lines(path)
        return
    opener: Any = gzip.open if magic[:2] == b"\x1f\x8b" else open
    number = 0
    with opener(path, "rb") as f:
        try:
            for number, line in enumerate(f, 1):  # noqa: B007 (read after the loop)
                if line.strip():
                    yield number, line
        except EOFError:
            click.echo(f"{path}: the compressed stream ends early, after line {number} (a prune stopped before closing it?)", err=True)
        except (OSError, zlib.error) as exc:
            raise ArchiveError(f"{path}: not a readable archive after line {number}: {exc}") from None


def _parquet_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    pa = _pyarrow()
    try:
        table = pa.parquet.ParquetFile(path)
        if "record" not in table.schema_arrow.names:
            raise ArchiveError(f"{path}: a Parquet file without a 'record' column is not a burnish archive")
        number = 0
        for batch in table.iter_batches(columns=["record"]):
            for value in batch.column(0).to_pylist():
                number += 1
                yield number, (value or "").encode()
    except (OSError, pa.lib.ArrowException) as exc:
        raise ArchiveError(f"{path}: not a readable Parquet archive: {exc}") from None


def read_archive(path: Path) -> Iterator[ArchivedTrajectory]:
    for number, line in _lines(path):
        try:
            yield decode(line)
        except CorruptArchive as exc:
            raise ArchiveError(f"{path}, line {number}: not an archived trajectory: {exc}") from None


# ---- the commands ------------------------------------------------------------------------


def _settings(**overrides: object) -> Settings:
    try:
        return Settings.load(None, **overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _check_days(value: float | None) -> float | None:
    from burnish_server.core.platform.retention import check_days

    if value is None:
        return None
    try:
        return check_days(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else words or word + 's'}"


class Plan:
    """Which projects are pruned, each with its days and whether trained groups go too."""

    def __init__(self) -> None:
        self.projects: list[tuple[str, float, bool]] = []
        self.untouched: list[str] = []


async def _plan(database: Any, settings: Settings, projects: tuple[str, ...], older_than: float | None, include_trained: bool) -> Plan:
    from burnish_server.core.platform.retention import effective
    from burnish_server.store import retention

    own = await database.read(retention.all_retention)
    known = projects or tuple(sorted({*await database.read(retention.recorded_projects), *own}))
    plan = Plan()
    for project in known:
        setting = own.get(project)
        days = older_than if older_than is not None else effective(setting, settings.retention_days)[0]
        if days is None:
            plan.untouched.append(project)
            continue
        plan.projects.append((project, days, include_trained or bool(setting and setting.prune_trained)))
    return plan


async def prune_store(
    database: Any,
    project: str,
    days: float,
    include_trained: bool,
    writer: ArchiveWriter | None,
    *,
    batch: int = BATCH,
    now: datetime | None = None,
) -> Any:
    """Prune one project of trajectories older than ``days``, in batches, each archived by
    ``writer`` before its deletion commits (None: a dry run). Returns the counts."""
    from burnish_server.core.platform.errors import StoreUnavailable
    from burnish_server.core.platform.retention import cutoff
    from burnish_server.store import retention

    cut = cutoff(now or datetime.now(UTC), days)
    total = retention.Counts()
    after_trajectory: int | None = 0
    after_group: int | None = 0
    while after_trajectory is not None or after_group is not None:

        def select_and_read(conn: Any, a_t: int | None = after_trajectory, a_g: int | None = after_group) -> Any:
            found = retention.select_batch(conn, project, cut, include_trained=include_trained, after_trajectory=a_t, after_group=a_g, limit=batch)
            retention.read_batch(conn, found.units)
            return found

        for attempt in range(ATTEMPTS):
            found = await database.read(select_and_read)
            if writer is None:  # a dry run: what was read is what would go
                done = retention.Counts(
                    trajectories=sum(len(u.records) for u in found.units),
                    calls=sum(len(r.calls) for u in found.units for r in u.records),
                    rewards=sum(len(r.rewards) for u in found.units for r in u.records),
                    groups=sum(1 for u in found.units if u.group_id is not None),
                )
                break
            try:
                done, _ = await database.transaction(retention.delete_batch, found.units, writer.write)
                break
            except StoreUnavailable:
                # A lock time-out, or a deadlock with another writer (store/database.py): this
                # batch's transaction rolled back, nothing of it deleted. Read it again and retry.
                if attempt == ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)
        total.add(found.counts)
        total.add(done)
        after_trajectory, after_group = found.after_trajectory, found.after_group
    total.kept_open = await database.read(retention.count_open, project, cut)
    return total


async def _retrying(database: Any, fn: Any, *args: Any) -> Any:
    """A restore's transaction, tried again after a lock time-out or a deadlock: it rolled back
    whole, and restoring is idempotent."""
    from burnish_server.core.platform.errors import StoreUnavailable

    for attempt in range(ATTEMPTS):
        try:
            return await database.transaction(fn, *args)
        except StoreUnavailable:
            if attempt == ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def _report(project: str, days: float, counts: Any, dry_run: bool, include_trained: bool) -> str:
    verb = "would remove" if dry_run else "removed"
    lines = [
        f"{project}: {verb} {_plural(counts.trajectories, 'trajectory', 'trajectories')} "
        f"({_plural(counts.calls, 'call')}, {_plural(counts.rewards, 'reward')}, {_plural(counts.groups, 'group')}) "
        f"idle for more than {days:g} days"
    ]
    kept = []
    if counts.kept_trained:
        kept.append(f"{_plural(counts.kept_trained, 'group')} a kept version trained on (--include-trained removes them)")
    if counts.kept_ready:
        kept.append(f"{_plural(counts.kept_ready, 'group')} training or waiting to train")
    if counts.kept_open:
        kept.append(f"{_plural(counts.kept_open, 'group')} still open")
    if counts.kept_changed:
        kept.append(f"{counts.kept_changed} that changed while pruning")
    if kept:
        lines.append(f"{project}: kept, though as old: " + "; ".join(kept))
    return "\n".join(lines)


@click.command()
@click.option("--project", "projects", multiple=True, help="a project to prune (repeat for more) [default: every project]")
@click.option(
    "--older-than",
    type=float,
    help="days since a trajectory's last call or reward [default: each project's retention, else BURNISH_RETENTION_DAYS]",
)
@click.option("--include-trained", is_flag=True, help="also remove what a kept version (served, head, candidate, promoted, or their parents) trained on")
@click.option(
    "--archive", "archive_path", type=click.Path(dir_okay=False), help="where to write what is removed [default: <data_dir>/archives/prune-<time>.jsonl.gz]"
)
@click.option("--dry-run", is_flag=True, help="say what would be removed; change nothing, write no archive")
@click.option("--batch", type=click.IntRange(1, 10_000), default=BATCH, show_default=True, help="trajectories or groups per transaction")
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
def prune(
    projects: tuple[str, ...],
    older_than: float | None,
    include_trained: bool,
    archive_path: str | None,
    dry_run: bool,
    batch: int,
    **options: object,
) -> None:
    """Remove trajectories idle for longer than their project's retention, archiving them first.

    Safe beside live traffic: small batches, short transactions; nothing that was called or
    rewarded since the cutoff, no open group, nothing training or waiting to, and (unless
    --include-trained) nothing a kept version trained on. `burnish db restore ARCHIVE` puts
    them back."""
    from burnish_server.core.platform.access import is_project

    for project in projects:
        if not is_project(project):
            raise click.BadParameter(f"{project!r} is not a project name (1 to 64 of A-Z a-z 0-9 _ -)", param_hint="--project")
    older_than = _check_days(older_than)
    settings = _settings(**options)
    writer = None
    if not dry_run:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        if archive_path is None:
            folder = settings.data_path / "archives"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"prune-{stamp}.jsonl.gz"
        else:
            path = Path(archive_path).expanduser()
        writer = ArchiveWriter(path)
    asyncio.run(_prune(settings, projects, older_than, include_trained, writer, dry_run, batch))


async def _prune(
    settings: Settings, projects: tuple[str, ...], older_than: float | None, include_trained: bool, writer: ArchiveWriter | None, dry_run: bool, batch: int
) -> None:
    from burnish_server.store.database import Database

    database = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        if settings.auto_migrate:
            await database.migrate()
        plan = await _plan(database, settings, projects, older_than, include_trained)
        if not plan.projects:
            click.echo(
                "nothing to prune: no project has a retention (set one over /admin/projects/{project}/retention, BURNISH_RETENTION_DAYS, or --older-than)"
            )
            return
        started = time.monotonic()
        for project, days, trained in plan.projects:
            counts = await prune_store(database, project, days, trained, writer, batch=batch)
            click.echo(_report(project, days, counts, dry_run, trained))
        if plan.untouched:
            click.echo(f"kept whole (no retention set): {', '.join(plan.untouched)}")
    finally:
        if writer is not None:
            writer.close()
        await database.dispose()
    if writer is not None:
        if writer.written:
            click.echo(
                f"archive: {writer.path} ({writer.records} trajectories, {time.monotonic() - started:.1f} s); burnish db restore {writer.path} puts them back"
            )
        else:
            click.echo("nothing removed: no archive written")


@click.command()
@click.argument("archive", type=click.Path(exists=True, dir_okay=False))
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
def restore(archive: str, **options: object) -> None:
    """Put back the trajectories of an ARCHIVE that `burnish db prune` wrote.

    The whole archive is checked first; nothing is written if a line is not an archived
    trajectory. A trajectory already in the store (restored before, or recorded again since)
    is skipped and counted, so running it twice changes nothing."""
    path = Path(archive)
    checked = sum(1 for _ in read_archive(path))  # every line, before any is written
    settings = _settings(**options)
    restored, skipped = asyncio.run(_restore(settings, path))
    click.echo(f"{path}: {checked} trajectories: {restored} restored, {skipped} already in the store (skipped)")


async def _restore(settings: Settings, path: Path) -> tuple[int, int]:
    from burnish_server.store import retention
    from burnish_server.store.database import Database

    database = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    restored = skipped = 0
    try:
        if settings.auto_migrate:
            await database.migrate()
        chunk: list[ArchivedTrajectory] = []
        for record in read_archive(path):
            chunk.append(record)
            if len(chunk) == RESTORE_BATCH:
                done, seen = await _retrying(database, retention.restore_records, chunk)
                restored, skipped, chunk = restored + done, skipped + seen, []
        if chunk:
            done, seen = await _retrying(database, retention.restore_records, chunk)
            restored, skipped = restored + done, skipped + seen
    finally:
        await database.dispose()
    return restored, skipped
