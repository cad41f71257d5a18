"""The proxy's routes in Litestar: every surface's ``POST``, and ``GET /v1/models``, under every
prefix (``gateway/proxy/paths.py``).

The gateway's entry point (``gateway/edge/entry.py``) serves the surfaces' calls itself, before
Litestar's routing; these handlers document them in the OpenAPI schema and serve what the entry
point leaves to Litestar (a path with a trailing slash, say). Both hand the call to
``gateway/proxy/forward.py``.
"""

from __future__ import annotations

from litestar import Request, Router, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp

from burnish_server.core.protocols.surfaces import SURFACES, Surface
from burnish_server.gateway.access.admission import BEARER, principal
from burnish_server.gateway.edge import openapi
from burnish_server.gateway.proxy.forward import Inbound, forward
from burnish_server.gateway.proxy.models import list_models
from burnish_server.gateway.proxy.paths import PREFIXES
from burnish_server.gateway.services import services


def _proxy_handler(surface: Surface) -> HTTPRouteHandler:
    """The surface's route in Litestar: documents it, and serves a path the entry point did
    not take as the proxy's (``gateway/edge/entry.py``), a trailing slash say."""

    async def handler(request: Request) -> ASGIApp:
        inbound = Inbound(services(request), principal(request.scope), request.scope, request.receive, request.path_params)
        return await forward(inbound, surface)

    handler.__name__ = f"proxy_{surface.name.replace('.', '_')}"
    return post(
        [f"{prefix}/v1/{surface.path}" for prefix in PREFIXES],
        name=handler.__name__,
        status_code=200,
        opt={"scope": "call"},
        security=BEARER,
        operation_class=openapi.proxy_operation(surface),
    )(handler)


@get([f"{prefix}/v1/models" for prefix in PREFIXES], name="models", opt={"scope": "call"}, security=BEARER, operation_class=openapi.models_operation)
async def models(request: Request) -> ASGIResponse:
    """The policies, then the upstream's models."""
    return await list_models(services(request), principal(request.scope), request.scope["headers"])


router = Router(path="/", route_handlers=[*(_proxy_handler(surface) for surface in SURFACES), models])
