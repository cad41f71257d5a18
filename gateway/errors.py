"""Errors in the OpenAI format, everywhere on the gateway.

Every failure a client can see is ``{"error": {"message", "type", "param", "code"}}``
with a 4xx/5xx status. Unexpected exceptions become a 500 with a generic message:
no stack trace ever reaches a client.
"""

from __future__ import annotations

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

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


class APIError(HTTPException):
    """An error a client is meant to read: status, message and a short machine code."""

    def __init__(self, status_code: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(status_code=status_code, detail=message)
        self.code = code
        self.param = param


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return msgspec.json.encode({"error": {"message": message, "type": kind, "param": param, "code": code}})


def error_response(status: int, message: str, code: str | None = None, param: str | None = None, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=error_body(status, message, code, param),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    if isinstance(exc, APIError):
        return error_response(exc.status_code, exc.detail, exc.code, exc.param, headers=exc.headers)
    status = exc.status_code
    message = exc.detail
    code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(status)
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict):
            message = f"{exc.detail}: {first.get('message', '')} ({first.get('key') or first.get('source') or 'body'})"
        code = "invalid_request"
    if status == 413:
        message = "request body is larger than the gateway's limit (BURNISH_MAX_BODY_BYTES)"
    return error_response(status, message, code, headers=exc.headers)


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal error in the gateway; the request was not completed", "internal_error")
