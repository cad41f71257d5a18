"""What every wire protocol (a surface) the gateway serves has to say about itself: ``Surface``.

A protocol's facts live in its own module (``chat.py``, ``completions.py``, ``responses.py``,
``messages.py``), each ending in one ``Surface``; ``__init__.py`` registers them. Everything
that depends on the protocol a call speaks asks its ``Surface``: the proxy's routes and its
entry point (the path), capture (the stream's assembler and terminal event), the errors at the
edge (the error body and the stream's error event), the transcript (the reader), the OpenAPI
schema (the request's name and description), and the translated surfaces (the translator).

Also here, the pieces the protocols' stream assemblers share: streamed strings joined once,
lists grown in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from burnish_server.core.protocols import window

if TYPE_CHECKING:
    from burnish_server.core.protocols.conversation import Exchange

_encode = msgspec.json.Encoder().encode


class Assembler(Protocol):
    """Folds a stream's events (as ``Surface.event``, core/protocols/answers.py) into the protocol's
    plain answer, as they pass."""

    def add(self, event: Any) -> None: ...

    def result(self) -> dict[str, Any]: ...


# ---- error formats -------------------------------------------------------------------------

# OpenAI's error types by status.
_OPENAI_TYPES = {
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
# Anthropic's error types by status (its API answers 529 overloaded_error; 5xx otherwise api_error).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def _kind(types: dict[int, str], status: int) -> str:
    return types.get(status, "api_error" if status >= 500 else "invalid_request_error")


@dataclass(frozen=True, slots=True)
class ErrorFormat:
    """How a protocol's clients are told of an error: the body of an error answer, the event
    that ends a stream that failed, and the words for a prompt past the served window (from its
    tokens and the window: core/protocols/window.py)."""

    body: Callable[[int, str, str | None, str | None], bytes]
    event: Callable[[str], bytes]
    too_long: Callable[[int, int], str] = window.openai_message


def openai_error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}``: OpenAI's, and every JSON API's of the gateway."""
    return _encode({"error": {"message": message, "type": _kind(_OPENAI_TYPES, status), "param": param, "code": code}})


def _anthropic_error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    # Anthropic's errors have neither code nor param: the param leads a message that does not name it.
    if param and param not in message:
        message = f"{param}: {message}"
    return _encode({"type": "error", "error": {"type": _kind(_ANTHROPIC_TYPES, status), "message": message}})


def _openai_error_event(message: str) -> bytes:
    return b"data: " + _encode({"error": {"message": message, "type": "api_error", "param": None, "code": "upstream_error"}}) + b"\n\n"


def _responses_error_event(message: str) -> bytes:
    return b"event: error\ndata: " + _encode({"type": "error", "code": "upstream_error", "message": message, "param": None}) + b"\n\n"


def _anthropic_error_event(message: str) -> bytes:
    return b"event: error\ndata: " + _encode({"type": "error", "error": {"type": "api_error", "message": message}}) + b"\n\n"


OPENAI_ERRORS = ErrorFormat(openai_error_body, _openai_error_event)
RESPONSES_ERRORS = ErrorFormat(openai_error_body, _responses_error_event)
ANTHROPIC_ERRORS = ErrorFormat(_anthropic_error_body, _anthropic_error_event, window.anthropic_message)


# ---- the protocol --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Surface:
    """One wire protocol, as the gateway serves, records and reads it."""

    name: str  # as recorded (a call's ``endpoint``): stable, stored
    path: str  # under /v1
    request: type[msgspec.Struct]  # its request and answer as the readers see them (core/protocols/wire.py)
    response: type[msgspec.Struct]
    # One stream event as the assembler reads it (core/protocols/answers.py): each event is converted
    # to it before it is read, so an event of the wrong shape fails there, as the upstream's.
    event: type[msgspec.Struct]
    read: Callable[[Any, Any], Exchange]  # a request and its answer as one exchange in chat form
    assembler: Callable[[], Assembler]  # a stream's events into the plain answer
    # Whether an event ends the stream, from its name, its data and itself as ``event`` (None
    # where it is not one: no JSON, or of the wrong shape).
    terminal: Callable[[str | None, bytes, Any], bool]
    errors: ErrorFormat
    # vLLM returns token ids and logprobs on it (``choices``): a policy call is served as it
    # is; otherwise it is served through chat completions by ``translator``.
    has_choices: bool
    translator: ModuleType | None  # core/protocols/translate/<protocol>.py: chat_request() and its Translator
    # For the OpenAPI schema: the request's title and what it is.
    schema_title: str
    schema_description: str

    def decode_request(self, raw: bytes) -> Any:
        """A recorded request body, typed; ``msgspec.ValidationError``/``DecodeError`` if it is not one."""
        return msgspec.json.decode(raw, type=self.request)

    def decode_response(self, raw: bytes | None) -> Any:
        """A recorded answer, typed (None for no body)."""
        return msgspec.json.decode(raw, type=self.response) if raw else None

    def error_body(self, status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
        return self.errors.body(status, message, code, param)

    def error_event(self, message: str) -> bytes:
        return self.errors.event(message)


# ---- pieces of the assemblers -----------------------------------------------------------------


class StreamedText(list[str]):
    """A streamed string's pieces, joined once by ``joined``. Adding each piece to a string
    held in a dict copies the whole string every time: quadratic in a long answer (an
    8,000-token stream took 0.3 s of the loop's time to assemble that way)."""


def append(target: dict[str, Any], key: str, piece: str | None) -> None:
    if piece is not None:
        pieces = target.get(key)
        if isinstance(pieces, StreamedText):
            pieces.append(piece)
        else:
            target[key] = StreamedText((pieces or "", piece))


def joined(target: dict[str, Any]) -> dict[str, Any]:
    """``target`` with its streamed strings whole."""
    for key, value in target.items():
        if isinstance(value, StreamedText):
            target[key] = "".join(value)
    return target


def extend(target: dict[str, Any], key: str, items: list[Any] | None) -> None:
    """Add a chunk's list (token ids, logprobs) to ``target[key]``, in place: a new list per
    chunk would copy all the earlier ones again (quadratic, as for strings above)."""
    if items is None:
        return
    current = target.get(key)
    if current is None:
        target[key] = list(items)  # our own: the chunk's list is not ours to grow
    else:
        current.extend(items)
