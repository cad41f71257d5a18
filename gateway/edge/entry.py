"""The gateway's ASGI entry point: the proxy's calls go straight to the proxy, the rest to Litestar.

``Gateway`` wraps the Litestar app (the standard ASGI wrapper, no subclass): Litestar has no
public hook before its routing, and the proxy's calls skip that routing.

Every HTTP request gets its request id here (``gateway/edge/request_ids.py``). Then a ``POST`` to a
proxy route (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``,
``/v1/messages``, under any of the prefixes of ``gateway/proxy/paths.py``) is served here::

    access.admit (key, scope "call", limits) ─▶ proxy/forward.py: forward ─▶ the response, sent ─▶ access.release
    an error before anything is sent ─▶ errors.asgi_error (the surface's own error body)

and every other request goes through Litestar's routing, middleware and handlers as usual.

Why: the proxy's routes use none of what Litestar does per request (dependencies, a body
model, content negotiation), and its machinery (routing, two exception layers, the access
middleware's wrapper, the request and handler bookkeeping) cost ~0.09 of the ~0.57 ms of
CPU a proxied call costs in-process (``bench/inprocess.py``). The proxy's Litestar
handlers stay registered, so the OpenAPI schema documents these routes, and a path
written some other way that Litestar accepts (a trailing slash) is still served by the same
``forward``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import cast

from litestar import Litestar
from litestar.datastructures import State
from litestar.types import HTTPScope, Receive, Scope, Send

from burnish_server.core.platform.logs import request_id
from burnish_server.core.protocols.surfaces import Surface
from burnish_server.gateway.edge import request_ids
from burnish_server.gateway.edge.errors import SURFACE, asgi_error
from burnish_server.gateway.proxy.forward import Inbound, forward
from burnish_server.gateway.proxy.paths import proxy_route
from burnish_server.gateway.services import Services


class Gateway:
    """The gateway's ASGI app: serves the proxy's calls itself, and hands everything else (the
    lifespan included) to the Litestar app it wraps (``litestar``)."""

    __slots__ = ("litestar", "request_ids")

    def __init__(self, litestar: Litestar) -> None:
        self.litestar = litestar
        self.request_ids = request_ids.RequestIds()

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        """The app's lifespan, for running it in-process (benchmarks, tests)."""
        return self.litestar.lifespan()

    @property
    def state(self) -> State:
        """The Litestar app's state, where the lifespan keeps the services."""
        return self.litestar.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan (and websockets, which the gateway has none of)
            await self.litestar(scope, receive, send)
            return
        scope = cast(HTTPScope, scope)
        rid = self.request_ids.of(scope["headers"])
        token = request_id.set(rid.decode())
        send = request_ids.sending_id(send, rid)
        try:
            # Under a root path Litestar's routing strips it and serves the call; the proxy's own
            # match does not, but the surface is known either way.
            root = scope.get("root_path") or ""
            route = proxy_route(scope["path"].removeprefix(root))
            if route is not None:  # everything downstream asks the surface (its errors' format first)
                scope.setdefault("state", {})[SURFACE] = route[0]
            if route is None or scope["method"] != "POST" or root:
                await self.litestar(scope, receive, send)
            else:
                await self._proxy(*route, scope, receive, send)
        finally:
            request_id.reset(token)

    async def _proxy(self, surface: Surface, params: dict[str, str], scope: Scope, receive: Receive, send: Send) -> None:
        svc: Services = self.litestar.state.services
        try:
            caller = await svc.access.admit(scope["headers"], "call")
        except Exception as exc:
            await asgi_error(exc, scope)(scope, receive, send)
            return
        svc.in_flight += 1
        try:
            try:
                response = await forward(Inbound(svc, caller, scope, receive, params), surface)
            except Exception as exc:  # raised before anything was sent: answered in the surface's format
                response = asgi_error(exc, scope)
            await response(scope, receive, send)
        finally:
            svc.in_flight -= 1
            svc.access.release(caller)
