"""The app factory: settings in, the gateway's ASGI app (``gateway/edge/entry.py``'s ``Gateway``)
out. Each room hands over what it owns: the handlers (``routes/``, ``ui/``), the error handlers and
the OpenAPI settings (``edge/``), the access middleware (``access/``); what the app runs on is
built in its lifespan (``gateway/wiring.py``). No module-level state."""

from __future__ import annotations

import functools

from litestar import Litestar

from burnish_server.core.platform import logs
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway import routes, ui, wiring
from burnish_server.gateway.access.admission import access_middleware
from burnish_server.gateway.edge import errors, openapi
from burnish_server.gateway.edge.entry import Gateway
from burnish_server.gateway.routes.common import APP_DEPENDENCIES


def create_app(settings: Settings | None = None) -> Gateway:
    settings = settings or Settings.load()
    app = Litestar(
        route_handlers=[*routes.HANDLERS, *ui.HANDLERS],
        template_config=ui.template_config(),
        lifespan=[functools.partial(wiring.lifespan, settings)],
        dependencies=APP_DEPENDENCIES,
        exception_handlers=errors.EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_bytes,
        middleware=[access_middleware],
        before_send=[openapi.AllowEveryMethod()],
        openapi_config=openapi.config(),
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
