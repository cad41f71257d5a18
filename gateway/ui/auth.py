"""Signing in to the dashboard, and what a page answers when access is refused.

The dashboard takes the same credentials as the API, under the same rules
(``gateway/access/admission.py``): the admin token, or a key with the ``read`` scope (its project's
data only); on an open gateway, anyone may read. A browser cannot add an ``Authorization``
header to a link, so the sign-in form checks the credential once and makes a session
(``gateway/access/sessions.py``): the cookie holds the session's random secret, never the
credential, and the access middleware lets it in on ``/ui`` routes only (``opt["session"]``).
Signing out ends the session in the store, so a copy of the cookie stops working too. The
cookie is

- ``HttpOnly``: no script on a page can read it;
- ``SameSite=Strict``: no other site's page can make the browser send it, so another site
  cannot post a control (a cross-site request forgery) in the signed-in user's name; the
  controls also refuse a request whose ``Origin`` is another site (``ui/controls.py``);
- over HTTPS ``__Host-burnish_ui``, ``Secure``, ``Path=/``; over HTTP ``burnish_ui``, ``Path=/ui``.

A page refused for want of a credential redirects to the sign-in form; one refused for want
of a scope (a read key on a control) answers 403 with a page that says which scope it needs.
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Any
from urllib.parse import quote

import msgspec
from litestar import Request, Response, get, post
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import Body, FromQuery
from litestar.response import Redirect, Template

from burnish_server.core.platform.access import ANONYMOUS, Principal
from burnish_server.core.platform.errors import BurnishError, Unauthorized
from burnish_server.gateway.access.admission import PUBLIC
from burnish_server.gateway.access.sessions import SECURE_COOKIE, cookie_name
from burnish_server.gateway.services import Services

log = logging.getLogger("burnish.gateway")


class SignIn(msgspec.Struct):
    token: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    next: str = "/ui"


def safe_next(target: str) -> str:
    """Where to go after signing in: a dashboard page only, never another site."""
    return target if target.startswith("/ui") and not target.startswith("//") and "\\" not in target else "/ui"


def who(caller: Principal) -> str:
    if caller is ANONYMOUS:
        return "anyone (open gateway)"
    if caller.key_id is None:
        return "admin token"
    return f"key {caller.key_id} (project {caller.project})"


@get("/login", opt={"scope": PUBLIC}, name="ui-login")
async def login_form(next: FromQuery[str] = "/ui", error: FromQuery[str | None] = None) -> Template:
    return Template("login.html", context={"next": safe_next(next), "error": error, "caller": None})


def set_cookie(response: Response[Any], scheme: str, secret: str, max_age: int) -> None:
    """The session cookie for a request over ``scheme``: a ``__Host-`` cookie must be ``Secure``
    with ``Path=/`` (gateway/access/sessions.py); the plain one stays under /ui. (Litestar's
    ``delete_cookie`` cannot say ``Secure``, without which a browser ignores any ``Set-Cookie``
    of a ``__Host-`` cookie: sign-out sets an empty one with ``max_age`` 0 here instead.)"""
    name = cookie_name(scheme)
    secure = name == SECURE_COOKIE
    expires = 0 if max_age == 0 else None
    response.set_cookie(name, secret, max_age=max_age, expires=expires, path="/" if secure else "/ui", httponly=True, samesite="strict", secure=secure)


@post("/login", opt={"scope": PUBLIC}, status_code=303)
async def login(request: Request, data: Annotated[SignIn, Body(media_type=RequestEncodingType.URL_ENCODED)]) -> Response[Any]:
    """Check the credential as the API would, then start a session; the cookie holds its secret."""
    svc: Services = request.app.state.services
    target = safe_next(data.next)
    try:
        caller = await svc.access.principal([(b"authorization", b"Bearer " + data.token.strip().encode("latin-1", "replace"))])
    except Unauthorized as exc:
        return Redirect(f"/ui/login?next={quote(target)}&error={quote(exc.message)}", status_code=303)
    if caller is ANONYMOUS or not (caller.can("read") or caller.can("admin")):
        why = "this gateway is open: any token reads it, only the admin token controls it" if caller is ANONYMOUS else "this key lacks the read scope"
        return Redirect(f"/ui/login?next={quote(target)}&error={quote(why)}", status_code=303)
    scheme = request.scope["scheme"]
    if (previous := request.cookies.get(cookie_name(scheme))) is not None:  # signing in again, maybe as another: the old session ends
        await svc.access.sessions.end(previous)
    secret = await svc.access.sessions.start(caller)
    response = Redirect(target, status_code=303)
    # The browser keeps the cookie as long as the session can last; the store decides when it ends.
    set_cookie(response, scheme, secret, max_age=math.ceil(svc.settings.ui_session_lifetime))
    return response


@post("/logout", opt={"scope": PUBLIC}, status_code=303)
async def logout(request: Request) -> Response[Any]:
    """End the session in the store (every copy of the cookie with it), then forget the cookie."""
    svc: Services = request.app.state.services
    scheme = request.scope["scheme"]
    if (secret := request.cookies.get(cookie_name(scheme))) is not None:
        await svc.access.sessions.end(secret)
    response = Redirect("/ui/login", status_code=303)
    set_cookie(response, scheme, "", max_age=0)
    return response


def _page(request: Request, status: int, title: str, message: str) -> Response[Any]:
    return Template("refused.html", context={"title": title, "message": message, "caller": None}, status_code=status)


def refused(request: Request, exc: BurnishError) -> Response[Any]:
    """A ``BurnishError`` on a dashboard page: to the sign-in form where a credential is missing
    or wrong, else a page saying what went wrong, with the error's own status."""
    if exc.status == 401:
        if request.method == "GET":
            return Redirect(
                f"/ui/login?next={quote(safe_next(request.url.path + ('?' + request.url.query if request.url.query else '')))}&error={quote(exc.message)}"
            )
        return _page(request, 401, "Sign in", exc.message)
    titles = {403: "Not allowed", 404: "Not found", 409: "Not now", 429: "Too many requests"}
    return _page(request, exc.status, titles.get(exc.status, "Bad request"), exc.message)


def http_error(request: Request, exc: HTTPException) -> Response[Any]:
    if isinstance(exc, NotFoundException):
        return _page(request, 404, "Not found", "no such page")
    return _page(request, exc.status_code, "Bad request", str(exc.detail))


def unexpected(request: Request, exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _page(request, 500, "Internal error", "the gateway could not show this page; its log says why")
