"""Errors at the gateway's edge: every failure a client sees is in its surface's error format.

One tree, ``core/platform/errors.py``, each error with its HTTP status, mapped to a body here and
only here. The format is the surface's (``core/protocols/surfaces/``): OpenAI's body on ``/v1`` and
every JSON API, Anthropic's on ``/v1/messages``. The gateway's entry point (``entry.py``)
puts the surface a path names in the request's scope state; a request without one gets
OpenAI's. Litestar's own errors (a body that does not decode or validate, a path parameter
off its pattern, 404/405/413) are mapped by their status; anything unexpected becomes a 500
with a generic message, so no stack trace ever reaches a client.

The proxy's calls are served before Litestar's exception layer (``gateway/edge/entry.py``):
``asgi_error`` gives them the same answers. ``responses`` documents the body in the
OpenAPI schema.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import ClientException, HTTPException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.response.base import ASGIResponse
from litestar.types import ExceptionHandlersMap, Scope

from burnish_server.core.platform.errors import BurnishError
from burnish_server.core.platform.ids import ID_REGEX, ID_RULE
from burnish_server.core.protocols.surfaces import Surface
from burnish_server.core.protocols.surfaces.base import openai_error_body

log = logging.getLogger("burnish.gateway")

# How msgspec quotes ID_REGEX in its message (up to the first escaped character).
_ID_PATTERN_TEXT = ID_REGEX.split("\\")[0]
BODY_TOO_LARGE = "request body is larger than the gateway's limit (BURNISH_MAX_BODY_BYTES)"
INTERNAL = "internal error in the gateway; the request was not completed"
SURFACE = "surface"  # the key of the request's surface in its scope state


def surface_of(scope: Scope) -> Surface | None:
    """The surface whose path a request is on (set by ``entry.py``), if any."""
    state = scope.get("state")
    return state.get(SURFACE) if state else None


def error_body(scope: Scope | None, status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    """An error answer's body in the format of the request's surface (OpenAI's without one)."""
    surface = surface_of(scope) if scope is not None else None
    return surface.error_body(status, message, code, param) if surface is not None else openai_error_body(status, message, code, param)


def error_response(
    scope: Scope, status: int, message: str, code: str | None = None, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    return Response(content=error_body(scope, status, message, code, param), status_code=status, media_type="application/json", headers=headers)


def handle_burnish_error(request: Request, exc: BurnishError) -> Response:
    return error_response(request.scope, exc.status, exc.message, exc.code, exc.param, exc.headers or None)


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    if isinstance(exc, ValidationException):
        return _invalid(request, exc)
    return error_response(request.scope, *_http_error(exc), headers=exc.headers)


def _http_error(exc: HTTPException) -> tuple[int, str, str | None, str | None]:
    """Status, message, code and param of one of Litestar's own ``HTTPException``s."""
    status = exc.status_code
    message = exc.detail
    code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(status)
    if status == 413:
        message = BODY_TOO_LARGE
    elif status == 400 and isinstance(exc, ClientException):  # a body Litestar could not decode as JSON
        message, code = f"the request body is not valid JSON: {exc.detail}", "invalid_json"
    return status, message, code, None


def _invalid(request: Request, exc: ValidationException) -> Response:
    """A request Litestar refused: a path parameter off its pattern is ``invalid_id``; a body
    that does not fit its struct gets the route's own code (``opt["invalid"]``)."""
    first: dict[str, Any] = exc.extra[0] if isinstance(exc.extra, list) and exc.extra and isinstance(exc.extra[0], dict) else {}
    where, key, message = first.get("source"), first.get("key"), str(first.get("message", ""))
    if where == "path" or (where == "body" and _ID_PATTERN_TEXT in message):  # an id off its pattern, wherever it is
        return error_response(request.scope, 400, f"invalid {key}: use {_rule(request, key) if where == 'path' else ID_RULE}", "invalid_id", key)
    if where == "body":
        what = request.route_handler.opt.get("invalid", "invalid_request")
        if message == "'data'":  # Litestar's words for a missing body
            message = "the request body is empty; expected a JSON object"
        param = key if key and key != "data" else None
        at = f" ({param})" if param else ""
        return error_response(request.scope, 400, f"invalid {what.removeprefix('invalid_')}: {message}{at}", what, param)
    detail = f"{exc.detail}: {message} ({key or where})" if first else exc.detail
    return error_response(request.scope, 400, detail, "invalid_request", key)


def _rule(request: Request, key: str | None) -> str:
    """The rule a path parameter's pattern stands for, as the parameter's description states it
    after its colon (``routes/common.py``: "a project: 1 to 64 characters ..."); else the ids' rule."""
    field = request.route_handler.parsed_fn_signature.parameters.get(key or "")
    described = getattr(field.kwarg_definition, "description", None) if field is not None else None
    return described.split(": ", 1)[1] if isinstance(described, str) and ": " in described else ID_RULE


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(request.scope, 500, INTERNAL, "internal_error")


def asgi_error(exc: Exception, scope: Scope) -> ASGIResponse:
    """The answer to an error on the proxy's own entry (``gateway/edge/entry.py``), which Litestar's
    exception layer does not see: the same body and headers the handlers above give."""
    headers: dict[str, str] | None = None
    code: str | None
    if isinstance(exc, BurnishError):
        status, message, code, param, headers = exc.status, exc.message, exc.code, exc.param, exc.headers or None
    elif isinstance(exc, HTTPException):
        (status, message, code, param), headers = _http_error(exc), exc.headers
    else:
        log.exception("unhandled error on POST %s", scope["path"])
        status, message, code, param = 500, INTERNAL, "internal_error", None
    return ASGIResponse(body=error_body(scope, status, message, code, param), status_code=status, media_type="application/json", headers=headers)


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    """Every error the gateway answers, on every route."""

    error: ErrorDetail


MEANING = {
    400: "Invalid request: a body, query or id that does not fit (code says which)",
    401: "Missing, unknown, revoked or expired API key",
    403: "The API key lacks the scope this route needs",
    404: "Not found",
    409: "Conflict with the current state (code says which)",
    413: "Body larger than BURNISH_MAX_BODY_BYTES",
    429: "The API key's rate or concurrency limit was reached; retry after Retry-After seconds",
    502: "A service behind the gateway failed (the upstream, a judge)",
    503: "Away for the moment, nothing changed (code says which: the store, vLLM); retry after Retry-After seconds",
}


def responses(*statuses: int) -> dict[int, ResponseSpec]:
    """The error statuses a route can answer, each with the error body, for its OpenAPI entry."""
    return {s: ResponseSpec(data_container=ErrorBody, description=MEANING[s], generate_examples=False) for s in statuses}


# The app's exception handlers: the tree's errors, Litestar's own, and anything else (a 500).
EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    BurnishError: handle_burnish_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
