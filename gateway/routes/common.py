"""What the JSON API routes share: typed id parameters and the services dependency.

Ids in paths are checked by Litestar against ``core.ids.ID_REGEX`` (so the OpenAPI schema
shows the pattern, and a wrong one is a 400 ``invalid_id`` from ``gateway/errors.py``).
Handlers get ``Services`` by dependency injection (``svc``), never from a global, and
return the typed answers of ``core/views.py``, which Litestar encodes and documents.
"""

from __future__ import annotations

from typing import Annotated

from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter

from burnish_server.core.ids import ID_REGEX, ID_RULE
from burnish_server.gateway.services import Services

TrajectoryId = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a trajectory id: {ID_RULE}")]
GroupId = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a group id: {ID_RULE}")]
PolicyName = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a policy name: {ID_RULE}")]


def _services(state: State) -> Services:
    services: Services = state.services
    return services


# Registered on the app: every handler that names a ``svc: Services`` parameter gets it.
DEPENDENCIES = {"svc": Provide(_services, sync_to_thread=False)}
