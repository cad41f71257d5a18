"""The single writer: every change to the store goes through one queue and one connection.

Group commit: while one transaction commits, new records queue up; the next
transaction takes all of them (up to ``batch_max``). Under load one commit
serves many requests; alone, a request waits for exactly one commit. Each
caller gets a future that resolves once its record is durable, which is what
lets the proxy hold back the end of a response until then.

A batch that fails is retried one record at a time, so one bad record cannot
take its neighbours down with it. An operation (a reward, a close) whose check fails
raises a domain error: it runs in a savepoint, so its failure is undone alone, and the
error goes to its caller while the rest of the batch commits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy.exc import OperationalError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from burnish_server.core.platform.errors import BurnishError, StoreUnavailable
from burnish_server.core.protocols.records import CallRecord
from burnish_server.store.database import CommitUnknown, Database, full
from burnish_server.store.writes import insert_calls

log = logging.getLogger("burnish.store")


class Operation(Protocol):
    def apply(self, conn: Any) -> Any: ...


Item = CallRecord | Operation
_STOP = object()
# Batches of at most this many items commit on the event loop's thread when they can. On the
# writer thread, SQLite's work would overlap the loop's, but the stdlib driver lets go of the
# GIL for every row it steps, and taking it back from a busy loop cost more than the work:
# at 64 concurrent calls the thread spent 0.083 ms of CPU per record, where the same batches
# on the loop cost the whole gateway 0.018 ms per record more than not recording at all.
# Larger batches go to the thread.
HERE_MAX = 64
# ...and of at most this many bytes of requests and answers: long contexts are written on the
# writer thread, where copying them does not hold up every other call on the loop.
HERE_MAX_BYTES = 1024 * 1024


class Writer:
    def __init__(self, db: Database, *, batch_max: int = 1024, attempts: int = 4) -> None:
        self.db = db
        self.batch_max = batch_max
        self.attempts = attempts
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a batch is being committed
        # Counters for the benchmark: commits made and records written.
        self.commits = 0
        self.records = 0
        # The last write's failure while no write has succeeded since (the store away, a disk
        # full), and when it began: /health says so; None while writes succeed.
        self.failing: tuple[str, float] | None = None
        # Told each commit's items once they are durable, and the seconds from the commit's
        # start to then, its retries included (metrics, Langfuse: gateway/app.py).
        self.on_commit: Callable[[list[Item], float], None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="burnish-writer")

    async def close(self) -> None:
        """Write what is queued, then stop."""
        if self._task is not None:
            self._queue.put_nowait(_STOP)
            await self._task
            self._task = None

    def submit(self, item: Item) -> asyncio.Future[Any]:
        """Queue a change; the future resolves after its commit (or fails with the reason)."""
        if self._task is None or self._task.done():
            raise RuntimeError("the store writer is not running")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return future

    async def write(self, item: Item, *, alone: bool = False) -> Any:
        """Write ``item`` and wait for its commit. ``alone``: the caller knows of no other change
        on its way (a gateway with one call in flight), so no batch can form: commit it at once
        on this thread if the writer is idle and the write lock free, without the queue and the
        two task switches it costs (~5% of a lone proxied call's instructions)."""
        if alone and not self._busy and self._queue.empty() and self._here_fits([item]):
            began = time.perf_counter()
            try:
                [result] = self.db.transaction_here(_apply, [item], bare=_calls_only([item]))
            except OperationalError:
                pass  # the lock is held (the trainer, a migration): the writer thread waits for it
            else:
                self._committed([item], began)
                if isinstance(result, BaseException):
                    raise result
                return result
        return await self.submit(item)

    @property
    def pending(self) -> int:
        """Items waiting for a transaction."""
        return self._queue.qsize()

    async def _run(self) -> None:
        while True:
            entry = await self._queue.get()
            stop = entry is _STOP
            batch = [] if stop else [entry]
            while len(batch) < self.batch_max and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is _STOP:
                    stop = True
                    continue
                batch.append(nxt)
            if batch:
                self._busy = True
                try:
                    await self._commit(batch)
                finally:
                    self._busy = False
            if stop and self._queue.empty():
                return

    async def _commit(self, batch: list[tuple[Item, asyncio.Future[Any]]]) -> None:
        began = time.perf_counter()
        try:
            results = await self._transaction([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1 and not isinstance(exc, StoreUnavailable):  # a store away fails every record alike
                log.warning("commit of %d records failed (%s); writing them one by one", len(batch), exc)
                for entry in batch:
                    await self._commit([entry])
                return
            why = str(exc.__cause__ or exc).splitlines()[0][:300]
            log.error("%scould not write %s: %s", "store full: " if full(why) else "", "a record" if len(batch) == 1 else f"{len(batch)} records", why)
            self.failing = (why, self.failing[1] if self.failing else time.time())
            for _, future in batch:
                _resolve(future, exc)
            return
        self._committed([item for item, _ in batch], began)
        for (_, future), result in zip(batch, results):
            _resolve(future, result)

    def _committed(self, items: list[Item], began: float) -> None:
        self.failing = None
        self.commits += 1
        self.records += len(items)
        if self.on_commit is not None:
            try:  # an observer's fault must not stop the writer: every waiting call would hang
                self.on_commit(items, time.perf_counter() - began)
            except Exception:
                log.exception("a commit observer failed")

    def _here_fits(self, items: list[Item]) -> bool:
        return self.db.here_open and len(items) <= HERE_MAX and _size(items) <= HERE_MAX_BYTES

    async def _transaction(self, items: list[Item]) -> list[Any]:
        if self._here_fits(items):
            # A few records (a quiet gateway, where each call waits for its own commit): on
            # the loop's thread, if the write lock is free at once (store/database.py).
            try:
                return self.db.transaction_here(_apply, items, bare=_calls_only(items))
            except OperationalError:
                pass  # the lock is held (the trainer, a migration): the writer thread waits for it
        try:  # the common case, without tenacity's bookkeeping (~0.1 ms a commit)
            return await self.db.transaction(_apply, items)
        except CommitUnknown:
            raise  # it may have committed: sent again, its records could be stored twice
        except StoreUnavailable:
            pass
        # Connection drops, deadlocks and lock time-outs are worth another few tries.
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, StoreUnavailable) and not isinstance(exc, CommitUnknown)),
            stop=stop_after_attempt(self.attempts - 1),
            wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
            reraise=True,
        ):
            with attempt:
                return await self.db.transaction(_apply, items)
        raise AssertionError("unreachable")


def _size(items: list[Item]) -> int:
    """Bytes of requests and answers in a batch (a malformed record counts none: it fails in its transaction)."""
    parts = (part for item in items if isinstance(item, CallRecord) for part in (item.request, item.response))
    return sum(len(part) for part in parts if isinstance(part, bytes | bytearray))


def _calls_only(items: list[Item]) -> bool:
    """Only calls' records, which SQLite's writes run on the driver itself (store/writes.py): no
    SQLAlchemy transaction object is needed around them (Database.transaction_here's ``bare``)."""
    return all(isinstance(item, CallRecord) for item in items)


def _apply(conn: Any, items: list[Item]) -> list[Any]:
    calls = [item for item in items if isinstance(item, CallRecord)]
    if calls:
        insert_calls(conn, calls)
    return [None if isinstance(item, CallRecord) else _operate(conn, item) for item in items]


def _operate(conn: Any, operation: Operation) -> Any:
    """One operation in a savepoint: a refusal (a domain error) is its result, not the batch's."""
    try:
        with conn.begin_nested():
            return operation.apply(conn)
    except BurnishError as exc:
        return exc


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():  # the caller went away (a client disconnect); the record is written all the same
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
