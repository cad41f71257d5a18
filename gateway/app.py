"""The app factory: settings in, a Litestar app (``gateway/edge.py``'s ``Gateway``) out. No module-level state."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
from litestar import Litestar, Response, Router, get
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components

from burnish_server.core import logs
from burnish_server.core.errors import BurnishError
from burnish_server.core.secrets import Redactor
from burnish_server.core.settings import Settings
from burnish_server.gateway import errors, idle_groups, openapi, replicas, ui
from burnish_server.gateway.access import BEARER, PUBLIC, SECURITY_SCHEMES, Access, KeyRing, access_middleware, follow_keys
from burnish_server.gateway.edge import Gateway
from burnish_server.gateway.errors import responses
from burnish_server.gateway.metrics import CONTENT_TYPE, Metrics
from burnish_server.gateway.routes import admin, demonstrations, projects, proxy, ruler, trajectories
from burnish_server.gateway.routes.common import DEPENDENCIES
from burnish_server.gateway.routing import Registry, follow
from burnish_server.gateway.services import Services
from burnish_server.gateway.upstream import Upstream
from burnish_server.store.database import Database
from burnish_server.store.keys import leave, load_keys
from burnish_server.store.policies import load_policies
from burnish_server.store.stats import store_state
from burnish_server.store.writer import Writer
from burnish_server.telemetry.langfuse_export import LangfuseExport

log = logging.getLogger("burnish.gateway")


@get("/health", include_in_schema=False, opt={"scope": PUBLIC})
async def health(svc: NamedDependency[Services]) -> dict[str, str]:
    """200 while the gateway runs: it recovers from a store that went away by itself, so a probe
    must not take it out. While its writes fail, ``store`` says since when and why (each call
    meanwhile gets 503 with Retry-After)."""
    if svc.writer.failing is None:
        return {"status": "ok"}
    error, since = svc.writer.failing
    return {"status": "ok", "store": f"failing since {datetime.fromtimestamp(since, UTC).isoformat(timespec='seconds')}: {error}"}


@get("/metrics", media_type=CONTENT_TYPE, opt={"scope": "metrics"}, responses=responses(401, 403, 429), security=BEARER)
async def metrics(svc: NamedDependency[Services]) -> Response[bytes]:
    """Prometheus text format: calls, latencies, the writer, and the store's state (gateway/metrics.py)."""
    svc.metrics.set_store_state(await svc.db.read(store_state))
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE)


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


# How often the store's planner statistics are refreshed (Database.optimize: SQLite only).
STATISTICS_EVERY_S = 600.0


async def keep_statistics(db: Database, every_s: float = STATISTICS_EVERY_S) -> None:
    """Refresh the store's planner statistics now and every ``every_s``, until cancelled."""
    while True:
        try:
            await db.optimize()
        except Exception as exc:  # a busy store: next time
            log.warning("store statistics not refreshed: %s", exc)
        await asyncio.sleep(every_s)


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


def create_app(settings: Settings | None = None) -> Gateway:
    settings = settings or Settings.load()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
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
        policies = Registry(await db.read(load_policies))
        judge_http = httpx.AsyncClient(timeout=httpx.Timeout(settings.upstream_timeout, connect=settings.connect_timeout))
        metrics = Metrics()
        metrics.record_queue.set_function(lambda: writer.pending)
        for state in ("in_use", "idle"):
            metrics.upstream_connections.labels(state).set_function(functools.partial(_pool_figure, upstream, state))
        metrics.upstream_origins.set_function(lambda: upstream.pool.stats()["origins"])
        langfuse = LangfuseExport.from_settings(settings, metrics.registry)
        writer.on_commit = committed(metrics, langfuse)
        svc = Services(
            settings=settings,
            db=db,
            writer=writer,
            upstream=upstream,
            policies=policies,
            judge_http=judge_http,
            metrics=metrics,
            access=access,
            redact=Redactor.from_settings(settings),
            langfuse=langfuse,
        )
        app.state.services = svc
        app.state.ui_status = ui.Statuses(db)  # the dashboard's policy snapshots (gateway/ui/status.py)
        background = [
            asyncio.create_task(app.state.ui_status.run(), name="burnish-ui-status"),
            asyncio.create_task(keep_statistics(db), name="burnish-statistics"),
            asyncio.create_task(follow(db, policies), name="burnish-policies"),
            asyncio.create_task(follow_keys(db, access), name="burnish-keys"),
            asyncio.create_task(ruler.auto_ruler(svc), name="burnish-auto-ruler"),
            asyncio.create_task(idle_groups.close_idle(svc), name="burnish-idle-groups"),
        ]
        if replicas.watched(settings):
            background.append(asyncio.create_task(replicas.watch(settings, upstream), name="burnish-replicas"))
        # Everything allocated so far lives as long as the app: move it out of the
        # collector's sight, so full collections stop walking it (a p99 latency cost).
        gc.collect()
        gc.freeze()
        mode = "open (no API keys yet)" if access.open else "API keys required"
        log.info("gateway up: upstream %s, store %s, %s", settings.upstream_discover or settings.upstream, db.url.render_as_string(hide_password=True), mode)
        try:
            yield
        finally:
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):  # the writer's flush below must run
                    await task
            await judge_http.aclose()
            await upstream.aclose()
            await writer.close()
            if access.ring.limited:  # the others take back its share of the limits at once
                with contextlib.suppress(Exception):
                    await db.transaction(leave, access.gateway_id)
            if langfuse is not None:  # after the writer: its last commits are exported too
                await asyncio.to_thread(langfuse.close)
            await db.dispose()

    app = Litestar(
        route_handlers=[
            health,
            ui.favicon,
            metrics,
            *proxy.route_handlers,
            # The JSON APIs decode their bodies strictly; the proxy (the hot path) reads its own.
            Router(
                path="/",
                route_handlers=[*trajectories.route_handlers, *demonstrations.route_handlers, *ruler.route_handlers, admin.router, projects.router],
                request_class=openapi.StrictRequest,
            ),
            # The dashboard (docs/dashboard.md): pages under the API's access rules, and its vendored script.
            ui.router,
            ui.static,
        ],
        template_config=ui.template_config(),
        lifespan=[lifespan],
        dependencies=DEPENDENCIES,
        exception_handlers={
            BurnishError: errors.handle_burnish_error,
            HTTPException: errors.handle_http_exception,
            Exception: errors.handle_unexpected,
        },
        request_max_body_size=settings.max_body_bytes,
        middleware=[access_middleware],
        before_send=[openapi.AllowEveryMethod()],
        openapi_config=OpenAPIConfig(
            title="burnish gateway",
            version="0.1.0",
            # The schema and its pages are public: they describe the API, not anyone's data.
            openapi_router=Router(path="/docs", route_handlers=[], opt={"scope": PUBLIC}, include_in_schema=False),
            components=Components(security_schemes=SECURITY_SCHEMES),
        ),
        # Logging is configured by whoever runs the app (the CLI); Litestar's default
        # would set the root logger to INFO behind --log-level's back.
        logging_config=None,
        debug=False,
    )
    openapi.finish_schema(app)
    return Gateway(app)


def app_from_env() -> Gateway:
    """Factory for ASGI servers started by import string (``uvicorn --factory burnish_server.gateway.app:app_from_env``)."""
    return create_app(Settings.load())


def worker_app() -> Gateway:
    """The app of one of several workers (``burnish gateway --workers N``): each is a fresh
    interpreter, which takes its settings from the ``BURNISH_*`` variables its parent set."""
    settings = Settings.load()
    logs.configure(settings.log_level, settings.log_format)
    return create_app(settings)
