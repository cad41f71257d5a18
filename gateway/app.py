"""The app factory: settings in, a Litestar app (``gateway/edge.py``'s ``Gateway``) out. No
module-level state: what the app runs on is built in its lifespan (``gateway/wiring.py``)."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from litestar import Litestar, Response, Router, get
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components

from burnish_server.core.platform import logs
from burnish_server.core.platform.errors import BurnishError
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway import errors, openapi, ui
from burnish_server.gateway.access import BEARER, PUBLIC, SECURITY_SCHEMES, access_middleware
from burnish_server.gateway.edge import Gateway
from burnish_server.gateway.errors import responses
from burnish_server.gateway.metrics import CONTENT_TYPE
from burnish_server.gateway.routes import admin, demonstrations, projects, proxy, ruler, trajectories
from burnish_server.gateway.routes.common import DEPENDENCIES
from burnish_server.gateway.services import Services
from burnish_server.gateway.wiring import Background, background_tasks, close_services, open_services
from burnish_server.store.stats import store_state

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


def create_app(settings: Settings | None = None) -> Gateway:
    settings = settings or Settings.load()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        svc = await open_services(settings)
        app.state.services = svc
        app.state.ui_status = ui.Statuses(svc.db)
        background = Background(background_tasks(svc, app.state.ui_status))
        # Everything allocated so far lives as long as the app: move it out of the
        # collector's sight, so full collections stop walking it (a p99 latency cost).
        gc.collect()
        gc.freeze()
        mode = "open (no API keys yet)" if svc.access.open else "API keys required"
        log.info(
            "gateway up: upstream %s, store %s, %s", settings.upstream_discover or settings.upstream, svc.db.url.render_as_string(hide_password=True), mode
        )
        try:
            yield
        finally:
            await background.stop()
            await close_services(svc)

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
