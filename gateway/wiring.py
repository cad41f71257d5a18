"""What a gateway runs on, built and torn down in one place: its ``Services`` (``open_services``,
``close_services``) and its background tasks (``Background``), each by name, composed in the
app's ``lifespan`` (which ``gateway/app.py`` registers).

Order matters at both ends: the store is migrated and the access rule checked before anything
starts (a gateway that must not serve never opens its upstream); at the end, the background
tasks stop before the writer's last flush, and Langfuse closes after it (its last commits are
exported too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
from litestar import Litestar

from burnish_server.core.platform.secrets import Redactor
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.access.admission import Access, KeyRing, follow_keys
from burnish_server.gateway.edge.metrics import Metrics
from burnish_server.gateway.groups.followups import watch_followups
from burnish_server.gateway.groups.idle import close_idle
from burnish_server.gateway.groups.scoring import auto_ruler
from burnish_server.gateway.policies.routing import Registry, follow
from burnish_server.gateway.services import Services
from burnish_server.gateway.ui.status import Statuses
from burnish_server.gateway.upstream import replicas
from burnish_server.gateway.upstream.client import Upstream
from burnish_server.store.database import Database
from burnish_server.store.keys import leave, load_keys
from burnish_server.store.policies import load_policies
from burnish_server.store.writer import Writer
from burnish_server.telemetry.langfuse_export import LangfuseExport

log = logging.getLogger("burnish.gateway")

# How often the store's planner statistics are refreshed (Database.optimize: SQLite only).
STATISTICS_EVERY_S = 600.0


def refusal(access: Access, settings: Settings) -> str | None:
    """Why the gateway must not start, if it must not: open beyond loopback, anyone who can
    reach the address could read every trajectory and spend the upstream; closed with neither
    keys nor an admin token, no one could ever get in."""
    if access.may_be_open or access.ring.configured or access.admin_token is not None:
        return None
    return (
        f"refusing to serve on {settings.host} without API keys: make one first "
        "(burnish keys create --name NAME --project PROJECT), or set BURNISH_ADMIN_TOKEN to make them over /admin/keys, "
        "or pass --insecure (BURNISH_INSECURE=true) to run open"
    )


async def check_startable(settings: Settings) -> None:
    """``refusal`` before any worker starts (``burnish gateway --workers N``): a worker that
    refuses in its lifespan is only logged by the server that supervises it."""
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        why = refusal(Access(settings, db, KeyRing(await db.read(load_keys))), settings)
    finally:
        await db.dispose()
    if why:
        raise RuntimeError(why)


def committed(metrics: Metrics, langfuse: LangfuseExport | None) -> Callable[[list[Any], float], None]:
    """What happens to each commit's items once they are durable: counted and timed, and sent to Langfuse."""

    def on_commit(items: list[Any], seconds: float) -> None:
        metrics.commit_batch.observe(len(items))
        metrics.commit_seconds.observe(seconds)
        if langfuse is not None:
            langfuse.put_calls(items)

    return on_commit


def _pool_figure(upstream: Upstream, state: str) -> float:
    return upstream.pool.stats()[state]


def observed(metrics: Metrics, writer: Writer, upstream: Upstream) -> None:
    """The gauges read at each scrape: the writer's queue and the upstream's connections."""
    metrics.record_queue.set_function(lambda: writer.pending)
    for state in ("in_use", "idle"):
        metrics.upstream_connections.labels(state).set_function(functools.partial(_pool_figure, upstream, state))
    metrics.upstream_origins.set_function(lambda: upstream.pool.stats()["origins"])


async def open_services(settings: Settings) -> Services:
    """The store (migrated where the settings say), the access rule (``RuntimeError`` where it
    refuses), the group-commit writer, the upstream (its replicas checked once where watched),
    the policies, the metrics and Langfuse."""
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    if settings.auto_migrate:
        await db.migrate()
    access = Access(settings, db, KeyRing(await db.read(load_keys)))
    if why := refusal(access, settings):
        await db.dispose()
        raise RuntimeError(why)
    writer = Writer(db, batch_max=settings.commit_batch_max, attempts=settings.commit_attempts)
    writer.start()
    upstream = Upstream(settings, replicas.initial(settings))
    if replicas.watched(settings):  # learn who is up and serves what before the first call
        await replicas.check_all(settings, upstream)
    metrics = Metrics()
    observed(metrics, writer, upstream)
    langfuse = LangfuseExport.from_settings(settings, metrics.registry)
    writer.on_commit = committed(metrics, langfuse)
    return Services(
        settings=settings,
        db=db,
        writer=writer,
        upstream=upstream,
        policies=Registry(await db.read(load_policies)),
        judge_http=httpx.AsyncClient(timeout=httpx.Timeout(settings.upstream_timeout, connect=settings.connect_timeout)),
        metrics=metrics,
        access=access,
        redact=Redactor.from_settings(settings),
        langfuse=langfuse,
    )


async def close_services(svc: Services) -> None:
    """Close what ``open_services`` opened; the writer flushes what it holds before the store closes."""
    await svc.judge_http.aclose()
    await svc.upstream.aclose()
    await svc.writer.close()
    if svc.access.ring.limited:  # the others take back its share of the limits at once
        with contextlib.suppress(Exception):
            await svc.db.transaction(leave, svc.access.gateway_id)
    if svc.langfuse is not None:  # after the writer: its last commits are exported too
        await asyncio.to_thread(svc.langfuse.close)
    await svc.db.dispose()


async def keep_statistics(db: Database, every_s: float = STATISTICS_EVERY_S) -> None:
    """Refresh the store's planner statistics now and every ``every_s``, until cancelled."""
    while True:
        try:
            await db.optimize()
        except Exception as exc:  # a busy store: next time
            log.warning("store statistics not refreshed: %s", exc)
        await asyncio.sleep(every_s)


def background_tasks(svc: Services, statuses: Statuses) -> dict[str, Coroutine[Any, Any, None]]:
    """The loops a gateway runs beside its requests, by the name each task carries."""
    tasks = {
        "burnish-ui-status": statuses.run(),  # the dashboard's policy snapshots (gateway/ui/status.py)
        "burnish-statistics": keep_statistics(svc.db),
        "burnish-policies": follow(svc.db, svc.policies),  # other gateways' and the trainer's changes
        "burnish-keys": follow_keys(svc.db, svc.access),
        "burnish-auto-ruler": auto_ruler(svc),
        "burnish-idle-groups": close_idle(svc),
        "burnish-next-message": watch_followups(svc),
        "burnish-departures": svc.waiting.watch(),  # a client gone stops its call upstream (gateway/proxy/departure.py)
    }
    if replicas.watched(svc.settings):
        tasks["burnish-replicas"] = replicas.watch(svc.settings, svc.upstream)
    return tasks


class Background:
    """Background tasks, each started and stopped here by its name. Each loops until cancelled;
    one that ends otherwise is logged with its name and error (it is not restarted: each loop
    catches its own passing failures, so an end is a bug to read, not a fault to retry)."""

    def __init__(self, tasks: dict[str, Coroutine[Any, Any, None]]) -> None:
        self.tasks = [asyncio.create_task(coro, name=name) for name, coro in tasks.items()]
        for task in self.tasks:
            task.add_done_callback(self._ended)
        log.debug("background tasks started: %s", ", ".join(task.get_name() for task in self.tasks))

    @staticmethod
    def _ended(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("background task %s stopped: %r", task.get_name(), error)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the writer's flush after this must run
                await task
        log.debug("background tasks stopped")


@contextlib.asynccontextmanager
async def lifespan(settings: Settings, app: Litestar) -> AsyncIterator[None]:
    """The app's life: its services and background tasks up, then down in the reverse order."""
    svc = await open_services(settings)
    app.state.services = svc
    app.state.ui_status = Statuses(svc.db)
    background = Background(background_tasks(svc, app.state.ui_status))
    # Everything allocated so far lives as long as the app: move it out of the
    # collector's sight, so full collections stop walking it (a p99 latency cost).
    gc.collect()
    gc.freeze()
    mode = "open (no API keys yet)" if svc.access.open else "API keys required"
    log.info("gateway up: upstream %s, store %s, %s", settings.upstream_discover or settings.upstream, svc.db.url.render_as_string(hide_password=True), mode)
    try:
        yield
    finally:
        await background.stop()
        await close_services(svc)
