"""What the JSON API routes share: typed id parameters and the services dependency.

Ids in paths are checked by Litestar against their pattern, ``core.platform.ids.ID_REGEX`` or a
project's ``PROJECT_REGEX`` (so the OpenAPI schema shows it, and a wrong one is a 400
``invalid_id`` from ``gateway/edge/errors.py``, whose message quotes the rule the description
states after its colon).
Handlers get ``Services`` by dependency injection (``svc``), never from a global, the
caller (``caller``: its project namespaces every id it names, ``core/platform/access.py``), and
return the typed answers of ``core/api/views.py``, which Litestar encodes and documents.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Request
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter

from burnish_server.core.platform.access import PROJECT_REGEX, PROJECT_RULE, Principal
from burnish_server.core.platform.ids import ID_REGEX, ID_RULE
from burnish_server.core.platform.sessions import SESSION_ID_REGEX
from burnish_server.gateway.access.admission import principal
from burnish_server.gateway.services import Services

TrajectoryId = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a trajectory id: {ID_RULE}")]
GroupId = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a group id: {ID_RULE}")]
PolicyName = Annotated[str, Parameter(pattern=ID_REGEX, description=f"a policy name: {ID_RULE}")]
CallIndex = Annotated[int, Parameter(description="a call's index in its trajectory's calls, from 0; -1 is the last")]
ProjectId = Annotated[str, Parameter(pattern=PROJECT_REGEX, description=f"a project: {PROJECT_RULE}")]
SessionId = Annotated[str, Parameter(pattern=SESSION_ID_REGEX, description="a dashboard session's id: ses_ and 16 hex digits")]


def _services(state: State) -> Services:
    services: Services = state.services
    return services


def _caller(request: Request) -> Principal:
    return principal(request.scope)


# Registered on the app: every handler that names a ``svc: Services`` parameter gets it, and
# ``caller: Principal`` the key (its project and scopes) that ``gateway/access/admission.py`` let in.
APP_DEPENDENCIES = {"svc": Provide(_services, sync_to_thread=False), "caller": Provide(_caller, sync_to_thread=False)}
