"""The gateway's handlers, one module a subject, each ending in its ``router``; ``HANDLERS`` is
what the app registers (the dashboard's are ``gateway/ui``'s).

Handlers only: each reads its request, calls the room that does the work (``proxy/``,
``groups/``, ``policies/``, the store) and returns a typed answer (``core/api/views.py``).
"""

from __future__ import annotations

from litestar import Router
from litestar.types import ControllerRouterHandler

from burnish_server.gateway.edge.openapi import StrictRequest
from burnish_server.gateway.routes import admin, demonstrations, operations, projects, proxy, ruler, trajectories

HANDLERS: list[ControllerRouterHandler] = [
    operations.router,
    proxy.router,
    # The JSON APIs decode their bodies strictly; the proxy (the hot path) reads its own.
    Router(
        path="/",
        route_handlers=[trajectories.router, demonstrations.router, ruler.router, admin.router, projects.router],
        request_class=StrictRequest,
    ),
]
