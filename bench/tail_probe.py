"""Runs ``burnish gateway`` with a recorder of what its process does, for bench/tail.py.

    python bench/tail_probe.py EVENTS.json gateway --upstream ... (burnish's own arguments)

It records, with ``time.perf_counter`` (CLOCK_MONOTONIC, so comparable with the load's own
timestamps in another process), each of these as (kind, name, start, end), and writes them to
EVENTS.json when the gateway exits:

* ``gc``: each garbage collection (``gc.callbacks``), named by its generation;
* ``task``: each step of each asyncio task (a task factory on the gateway's loop wraps every
  coroutine), named by the coroutine (a request's handler is ``RequestResponseCycle.run_asgi``);
* ``commit``: the store's write transactions, on the loop (``transaction_here``) or the
  writer thread (``transaction``), and the WAL checkpoint on its own thread;
* ``read``: the store's reads (every one is a background task's at c=1: a proxied call reads
  nothing);
* ``log``: each log record handled;
* ``app``: each HTTP request, from the ASGI app's call to its return;
* ``upstream``: from a call's request to vLLM (or the stand-in) until its answer's head.

Instrumentation costs a few microseconds a step: bench/tail.py reports the probed gateway's
latency beside the same gateway unprobed, so what the recorder added is seen.
"""

from __future__ import annotations

import asyncio
import atexit
import collections.abc
import functools
import gc
import json
import logging
import sys
import threading
import time
from typing import Any

from burnish_server.gateway.edge.entry import Gateway
from burnish_server.gateway.upstream.client.connections import http1
from burnish_server.store.database import Database

clock = time.perf_counter
EVENTS: list[tuple[str, str, float, float]] = []
_gc_began: list[float] = [0.0]


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_began[0] = clock()
    else:
        EVENTS.append(("gc", f"generation {info['generation']}", _gc_began[0], clock()))


class Timed(collections.abc.Coroutine):
    """A coroutine that records how long each of its steps ran (a step: from being resumed to
    its next suspension)."""

    def __init__(self, coro: Any, name: str) -> None:
        self.coro, self.name = coro, name

    def send(self, value: Any) -> Any:
        began = clock()
        try:
            return self.coro.send(value)
        finally:
            EVENTS.append(("task", self.name, began, clock()))

    def throw(self, *args: Any) -> Any:
        began = clock()
        try:
            return self.coro.throw(*args)
        finally:
            EVENTS.append(("task", self.name, began, clock()))

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Any:
        return self

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        return self.send(None)


def _task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    name = getattr(coro, "__qualname__", type(coro).__name__)
    return asyncio.Task(Timed(coro, name), loop=loop, **kwargs)


def _timed_sync(kind: str, name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((kind, name, began, clock()))

    return wrapper


def _timed_async(kind: str, name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return await fn(*args, **kwargs)
        finally:
            EVENTS.append((kind, name, began, clock()))

    return wrapper


def install() -> None:
    gc.callbacks.append(_on_gc)
    Database.transaction_here = _timed_sync("commit", "on the loop", Database.transaction_here)  # type: ignore[method-assign]
    Database._sync_transaction = _timed_sync("commit", "on the writer thread", Database._sync_transaction)  # type: ignore[method-assign]
    Database._checkpoint = _timed_sync("commit", "WAL checkpoint (its own thread)", Database._checkpoint)  # type: ignore[method-assign]
    Database.read = _timed_async("read", "a store read", Database.read)  # type: ignore[method-assign]
    http1.Pool.request = _timed_async("upstream", "until the answer's head", http1.Pool.request)  # type: ignore[method-assign]
    logging.Logger.handle = _timed_sync("log", "a log record", logging.Logger.handle)  # type: ignore[method-assign]

    call = Gateway.__call__

    async def first_call(self: Gateway, scope: Any, receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        if loop.get_task_factory() is None:  # the lifespan's call: before any background task
            loop.set_task_factory(_task_factory)
        began = clock()
        try:
            await call(self, scope, receive, send)
        finally:
            if scope["type"] == "http":
                EVENTS.append(("app", "the call, inside the ASGI app", began, clock()))

    Gateway.__call__ = first_call  # type: ignore[method-assign]


def dump(path: str) -> None:
    with open(path, "w") as out:
        json.dump({"events": EVENTS, "threads": [t.name for t in threading.enumerate()]}, out)


if __name__ == "__main__":
    events_path, argv = sys.argv[1], sys.argv[2:]
    install()
    atexit.register(dump, events_path)
    from burnish_server.cli.main import main

    sys.argv = ["burnish", *argv]
    main()
