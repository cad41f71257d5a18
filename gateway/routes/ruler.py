"""POST /v1/groups/{id}/ruler: a group scored by RULER's judge (``gateway/groups/scoring.py``).

The judge's endpoint is never the request's: the route is open to agents, and a URL in a body
would let anyone aim the gateway at any host and read the answer.
"""

from __future__ import annotations

from litestar import Router, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from burnish_server.core.api.views import RulerView
from burnish_server.core.platform.access import Principal
from burnish_server.gateway.access.admission import ACCESS_ERRORS, BEARER
from burnish_server.gateway.edge import openapi
from burnish_server.gateway.edge.errors import responses
from burnish_server.gateway.groups.scoring import REFUSED_FIELDS, RulerIn, refuse_endpoint_fields, run_ruler
from burnish_server.gateway.routes.common import GroupId
from burnish_server.gateway.services import Services


@post(
    "/v1/groups/{group_id:str}/ruler",
    status_code=200,
    opt={"invalid": "invalid_request", "scope": "call"},
    responses=responses(400, *ACCESS_ERRORS, 404, 409, 413, 502),
    security=BEARER,
    operation_class=openapi.body_operation(optional=True, refused=tuple(REFUSED_FIELDS)),
)
async def ruler(group_id: GroupId, svc: NamedDependency[Services], caller: NamedDependency[Principal], data: JSONBody[RulerIn | None] = None) -> RulerView:
    """Score a group's trajectories relative to each other with an LLM judge; the scores become rewards.
    The judge's endpoint is the server's configuration (a policy's, or BURNISH_JUDGE_BASE_URL), never the request's."""
    request = data or RulerIn()
    refuse_endpoint_fields(request)
    return await run_ruler(svc, caller.stored(group_id), request)


router = Router(path="/", route_handlers=[ruler])
