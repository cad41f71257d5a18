"""The admin's list of dashboard sign-ins (``gateway/access/sessions.py``), each with a button that ends it.

Both need the ``admin`` scope, as ``/admin/sessions`` does; the button is a control like the
policy page's (``ui/controls.py``): a POST, refused when posted from another site, that
redirects back to the list (post/redirect/get).
"""

from __future__ import annotations

import re
from typing import Any

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromQuery
from litestar.response import Redirect, Template

from burnish_server.core.platform.access import Principal
from burnish_server.core.platform.sessions import SESSION_ID_REGEX
from burnish_server.gateway.access.sessions import cookie_name
from burnish_server.gateway.routes.common import SessionId
from burnish_server.gateway.services import Services
from burnish_server.gateway.ui.controls import ADMIN, same_site
from burnish_server.gateway.ui.pages import context


@get("/sessions", opt=ADMIN, name="ui-sessions")
async def sessions_page(request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal], done: FromQuery[str | None] = None) -> Template:
    listed = await svc.access.sessions.listing()
    mine = await svc.access.sessions.id_of(request.cookies.get(cookie_name(request.scope["scheme"])))
    ended = done if done is not None and re.match(SESSION_ID_REGEX, done) else None
    return Template("sessions.html", context=context(request, caller, sessions=listed, mine=mine, ended=ended))


@post("/sessions/{session_id:str}/end", opt=ADMIN, status_code=303)
async def end(session_id: SessionId, request: Request, svc: NamedDependency[Services]) -> Response[Any]:
    same_site(request)
    await svc.access.sessions.end_by_id(session_id)
    return Redirect(f"/ui/sessions?done={session_id}", status_code=303)


route_handlers = [sessions_page, end]
