"""Errors at the gateway's edge: every failure a client sees is OpenAI's error body,
except on ``/v1/messages``, where it is Anthropic's (that surface's clients parse that one):

    {"error": {"message", "type", "param", "code"}}              with a 4xx/5xx status
    {"type": "error", "error": {"type", "message"}}              on /v1/messages

One tree, mapped here and only here: the domain's errors (``core/errors.py``: not found,
conflict, invalid, unavailable) by their class; Litestar's own (a body that does not
decode or validate, a path parameter that does not match its pattern, 404/405/413) by
their status; anything unexpected becomes a 500 with a generic message, so no stack trace
ever reaches a client. ``APIError`` is for the few errors that exist only at the edge
(authentication, an upstream's status).

The proxy's calls are served before Litestar's exception layer (``gateway/edge.py``):
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

from burnish_server.core.errors import BurnishError, Conflict, Invalid, NotFound, Unavailable
from burnish_server.core.ids import ID_REGEX, ID_RULE

log = logging.getLogger("burnish.gateway")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
# How msgspec quotes ID_REGEX in its message (up to the first escaped character).
_ID_PATTERN_TEXT = ID_REGEX.split("\\")[0]
_STATUS = {NotFound: 404, Conflict: 409, Invalid: 400, Unavailable: 502}
BODY_TOO_LARGE = "request body is larger than the gateway's limit (BURNISH_MAX_BODY_BYTES)"
INTERNAL = "internal error in the gateway; the request was not completed"


class APIError(HTTPException):
    """An error that exists only at the edge: status, message and a short machine code."""

    def __init__(self, status_code: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(status_code=status_code, detail=message)
        self.code = code
        self.param = param


def status_of(error: BurnishError) -> int:
    return next((status for kind, status in _STATUS.items() if isinstance(error, kind)), 400)


# Anthropic's error types by status (its API answers 529 overloaded_error; 5xx otherwise api_error).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return msgspec.json.encode({"error": {"message": message, "type": kind, "param": param, "code": code}})


def anthropic_error_body(status: int, message: str) -> bytes:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return msgspec.json.encode({"type": "error", "error": {"type": kind, "message": message}})


def is_anthropic(path: str) -> bool:
    """Whether a path is the Messages surface, whose errors are Anthropic's."""
    return path.endswith("/v1/messages")


def error_response(
    status: int, message: str, code: str | None = None, param: str | None = None, headers: dict[str, str] | None = None, *, anthropic: bool = False
) -> Response:
    body = anthropic_error_body(status, message) if anthropic else error_body(status, message, code, param)
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


def handle_domain_error(request: Request, exc: BurnishError) -> Response:
    return error_response(status_of(exc), exc.message, exc.code, exc.param, anthropic=is_anthropic(request.scope["path"]))


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    if isinstance(exc, ValidationException):
        return _invalid(request, exc)
    return error_response(*_http_error(exc), headers=exc.headers, anthropic=is_anthropic(request.scope["path"]))


def _http_error(exc: HTTPException) -> tuple[int, str, str | None, str | None]:
    """Status, message, code and param of an ``HTTPException`` (ours, or Litestar's own)."""
    if isinstance(exc, APIError):
        return exc.status_code, exc.detail, exc.code, exc.param
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
        return error_response(400, f"invalid {key}: use {ID_RULE}", "invalid_id", key)
    if where == "body":
        what = request.route_handler.opt.get("invalid", "invalid_request")
        if message == "'data'":  # Litestar's words for a missing body
            message = "the request body is empty; expected a JSON object"
        param = key if key and key != "data" else None
        at = f" ({param})" if param else ""
        return error_response(400, f"invalid {what.removeprefix('invalid_')}: {message}{at}", what, param)
    detail = f"{exc.detail}: {message} ({key or where})" if first else exc.detail
    return error_response(400, detail, "invalid_request", key)


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, INTERNAL, "internal_error", anthropic=is_anthropic(request.scope["path"]))


def asgi_error(exc: Exception, path: str) -> ASGIResponse:
    """The answer to an error on the proxy's own entry (``gateway/edge.py``), which Litestar's
    exception layer does not see: the same body and headers the handlers above give."""
    headers: dict[str, str] | None = None
    code: str | None
    if isinstance(exc, BurnishError):
        status, message, code, param = status_of(exc), exc.message, exc.code, exc.param
    elif isinstance(exc, HTTPException):
        (status, message, code, param), headers = _http_error(exc), exc.headers
    else:
        log.exception("unhandled error on POST %s", path)
        status, message, code, param = 500, INTERNAL, "internal_error", None
    body = anthropic_error_body(status, message) if is_anthropic(path) else error_body(status, message, code, param)
    return ASGIResponse(body=body, status_code=status, media_type="application/json", headers=headers)


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    """Every error the gateway answers, on every route."""

    error: ErrorDetail


_MEANING = {
    400: "Invalid request: a body, query or id that does not fit (code says which)",
    401: "Missing, unknown, revoked or expired API key",
    403: "The API key lacks the scope this route needs",
    404: "Not found",
    409: "Conflict with the current state (code says which)",
    413: "Body larger than BURNISH_MAX_BODY_BYTES",
    429: "The API key's rate or concurrency limit was reached; retry after Retry-After seconds",
    502: "A service behind the gateway failed (the upstream, a judge)",
    503: "The gateway could not record the call",
}


def responses(*statuses: int) -> dict[int, ResponseSpec]:
    """The error statuses a route can answer, each with the error body, for its OpenAPI entry."""
    return {s: ResponseSpec(data_container=ErrorBody, description=_MEANING[s], generate_examples=False) for s in statuses}
