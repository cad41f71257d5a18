"""The dashboard: server-rendered pages under ``/ui`` (docs/dashboard.md).

    auth.py      signing in (a session, gateway/access/sessions.py, whose cookie opens /ui), refusals as pages
    pages.py     the pages (GET)
    controls.py  the admin actions as forms (POST)
    sessions.py  the admin's list of sign-ins, each with a button that ends it
    trajectory.py, charts.py, tokens.py   what the pages show, built on the server

Templates are Jinja (Litestar's own template support, autoescaped); the only script is
htmx, vendored under ``static/`` and served by the gateway: nothing comes from a CDN.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Response, Router, get
from litestar.datastructures import CacheControlHeader
from litestar.exceptions import HTTPException
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig
from litestar.types import ControllerRouterHandler

from burnish_server.core.platform.errors import BurnishError
from burnish_server.gateway.access.admission import PUBLIC
from burnish_server.gateway.ui import auth, controls, pages, sessions
from burnish_server.gateway.ui.status import Statuses

__all__ = ["HANDLERS", "Statuses", "template_config"]

HERE = Path(__file__).parent
HTMX = "htmx-2.0.11.min.js"


def _filters(engine: JinjaTemplateEngine) -> None:
    engine.engine.globals["HTMX"] = HTMX


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    return TemplateConfig(directory=HERE / "templates", engine=JinjaTemplateEngine, engine_callback=_filters)


router = Router(
    path="/ui",
    route_handlers=[auth.login_form, auth.login, auth.logout, *pages.route_handlers, *controls.route_handlers, *sessions.route_handlers],
    # Read by default; a sign-in's session cookie lets a request in here, and only here (gateway/access/admission.py).
    opt={"scope": "read", "session": True},
    exception_handlers={BurnishError: auth.refused, HTTPException: auth.http_error, Exception: auth.unexpected},
    include_in_schema=False,
)

# The vendored script and the style sheet: public (they hold no data), cached for a day (a new
# htmx comes under a new name).
static = create_static_files_router(
    path="/ui/static", directories=[HERE / "static"], opt={"scope": PUBLIC}, cache_control=CacheControlHeader(max_age=86400), include_in_schema=False
)


FAVICON = (HERE / "static" / "favicon.svg").read_bytes()


@get("/favicon.ico", opt={"scope": PUBLIC}, include_in_schema=False, cache_control=CacheControlHeader(max_age=86400))
async def favicon() -> Response[bytes]:
    """Where a browser looks for the icon by itself: the dashboard's own, instead of a 404 in the log."""
    return Response(FAVICON, media_type="image/svg+xml")


# What the app registers of the dashboard.
HANDLERS: list[ControllerRouterHandler] = [router, static, favicon]
