"""What the JSON API routes share: typed id parameters, the services dependency, JSON out.

Ids in paths are checked by Litestar against ``core.ids.ID_REGEX`` (so the OpenAPI schema
shows the pattern, and a wrong one is a 400 ``invalid_id`` from ``gateway/errors.py``).
Handlers get ``Services`` by dependency injection (``svc``), never from a global.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter
from litestar.response import Response

from burnish_server.core.ids import ID_REGEX, ID_RULE
from burnish_server.gateway.services import Services

TrajectoryId = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a trajectory id: {ID_RULE}")]
GroupId = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a group id: {ID_RULE}")]
PolicyName = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a policy name: {ID_RULE}")]

_encode = msgspec.json.Encoder().encode


def _services(state: State) -> Services:
    services: Services = state.services
    return services


# Registered on the app: every handler that names a ``svc: Services`` parameter gets it.
DEPENDENCIES = {"svc": Provide(_services, sync_to_thread=False)}


def json(body: Any, status: int = 200) -> Response[bytes]:
    """A JSON response from plain data (bodies read from the store go out as ``msgspec.Raw``)."""
    return Response(content=_encode(body), status_code=status, media_type="application/json")
