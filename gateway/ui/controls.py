"""The policy page's controls: the admin API's actions, as HTML forms.

Each is a POST that needs the ``admin`` scope (the admin token, or a key with that scope),
does what the admin API does (``gateway/policies/actions.py``), and redirects back to the policy page
(post/redirect/get: a reload does not repeat it). A read key is refused with 403, as the API
refuses it. A POST whose ``Origin`` names another site is refused too: with the cookie's
``SameSite=Strict`` (``ui/auth.py``), no other site can act in a signed-in admin's name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.params import Body, Parameter
from litestar.response import Redirect, Stream

from burnish_server.core.platform.access import Principal
from burnish_server.core.platform.errors import Forbidden
from burnish_server.gateway.policies import actions, downloads
from burnish_server.gateway.routes.common import PolicyName
from burnish_server.gateway.services import Services
from burnish_server.gateway.ui.pages import statuses, visible_policy

ADMIN = {"scope": "admin"}


class RollbackForm(msgspec.Struct):
    step: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


def same_site(request: Request) -> None:
    origin = request.headers.get("origin")
    if origin is not None and origin != "null" and origin.split("://", 1)[-1] != request.headers.get("host", ""):
        raise Forbidden("this form was posted from another site", "cross_site_request")


async def _back(request: Request, name: str, done: str) -> Response[Any]:
    await statuses(request).refresh(name)  # the page it goes back to shows what was done
    return Redirect(f"/ui/policies/{name}?done={done}", status_code=303)


# Each action without a form: what it does, and what the page says after it.
ACTIONS: dict[str, tuple[Callable[[Services, str], Awaitable[None]], str]] = {
    "pause": (actions.pause, "paused"),
    "resume": (actions.resume, "resumed"),
    "train": (actions.train_now, "train"),
    "promote": (actions.promote, "promoted"),
    "reject": (actions.reject, "rejected"),
}
Action = Annotated[str, Parameter(pattern=f"^({'|'.join(ACTIONS)})$", description="pause, resume, train, promote or reject")]


@post("/policies/{name:str}/{action:str}", opt=ADMIN, status_code=303)
async def act(name: PolicyName, action: Action, request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> Response[Any]:
    same_site(request)
    visible_policy(svc, caller, name)
    do, done = ACTIONS[action]
    await do(svc, name)
    return await _back(request, name, done)


@post("/policies/{name:str}/rollback", opt=ADMIN, status_code=303)
async def rollback(
    name: PolicyName,
    request: Request,
    data: Annotated[RollbackForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
    svc: NamedDependency[Services],
    caller: NamedDependency[Principal],
) -> Response[Any]:
    same_site(request)
    visible_policy(svc, caller, name)
    await actions.rollback(svc, name, data.step)
    return await _back(request, name, "rollback")


@get("/policies/{name:str}/versions/{step:int}/adapter", opt=ADMIN, media_type="application/zip")
async def adapter(name: PolicyName, step: Annotated[int, Parameter(ge=1, le=2**31 - 1)], svc: NamedDependency[Services]) -> Stream:
    """The version row's download: the admin API's (gateway/policies/downloads.py)."""
    return await downloads.adapter_zip(svc, name, step)


route_handlers = [act, rollback, adapter]
