"""What operators probe: ``/health`` (public, for a load balancer) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

from litestar import Response, Router, get
from litestar.di import NamedDependency

from burnish_server.gateway.access.admission import BEARER, PUBLIC
from burnish_server.gateway.edge.errors import responses
from burnish_server.gateway.edge.metrics import CONTENT_TYPE
from burnish_server.gateway.services import Services
from burnish_server.store.stats import store_state


@get("/health", include_in_schema=False, opt={"scope": PUBLIC})
async def health(svc: NamedDependency[Services]) -> dict[str, str]:
    """200 while the gateway runs: it recovers from a store that went away by itself, so a probe
    must not take it out. While its writes fail (each call meanwhile gets 503 with Retry-After),
    or its file system has less room than its WAL may need, ``store`` says so."""
    warning = svc.store_warning()
    return {"status": "ok"} if warning is None else {"status": "ok", "store": warning}


@get("/metrics", media_type=CONTENT_TYPE, opt={"scope": "metrics"}, responses=responses(401, 403, 429), security=BEARER)
async def metrics(svc: NamedDependency[Services]) -> Response[bytes]:
    """Prometheus text format: calls, latencies, the writer, and the store's state (gateway/edge/metrics.py)."""
    svc.metrics.set_store_state(await svc.db.read(store_state))
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE)


router = Router(path="/", route_handlers=[health, metrics])
