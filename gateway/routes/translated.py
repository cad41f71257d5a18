"""Responses API and Anthropic Messages calls to a policy, served through chat completions.

vLLM returns token ids on chat completions only, so a policy call on ``/v1/responses`` or
``/v1/messages`` goes to vLLM as a chat completion (``core/translate``) and comes back in
the protocol the client spoke::

    body ─ decode (the surface's struct) ─ previous_response_id resolved from the store
         ─ chat_request() ─ token ids and logprobs asked for ─▶ vLLM /v1/chat/completions
         ◀─ plain: Translator.answer(); record, commit, then the body
         ◀─ stream: each chunk's events as it arrives; record, commit, then the terminal event

What is recorded: the client's request (for a Responses call that continues an earlier
one, with ``input`` resolved to the whole conversation, so every reader sees what the
model saw), the answer the client received, and the chat completion's token ids and
logprobs. Calls to models that are not policies never come here: they pass through.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
from litestar.response.base import ASGIResponse
from litestar.types import Scope

from burnish_server.core import wire
from burnish_server.core.access import local
from burnish_server.core.errors import Invalid
from burnish_server.core.records import MESSAGES, OK, RESPONSES, UPSTREAM_CUT, UPSTREAM_ERROR, CallRecord
from burnish_server.core.translate import common as translate
from burnish_server.core.translate import messages, responses
from burnish_server.gateway.call import Call, json_or_none, read_answer, upstream_message
from burnish_server.gateway.capture import CHAT, StreamCapture, extract_tokens
from burnish_server.gateway.errors import APIError
from burnish_server.gateway.streaming import Relay, RelayResponse
from burnish_server.gateway.upstream import UpstreamResponse
from burnish_server.store.responses import stored_response

SURFACES = frozenset({RESPONSES, MESSAGES})

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_decode_responses = msgspec.json.Decoder(wire.ResponsesCreate).decode
_decode_messages = msgspec.json.Decoder(wire.MessagesCreate).decode

Translator = translate.Translator[Any]


def _refuse(call: Call, status: int, message: str, code: str, param: str | None = None) -> APIError:
    if param and call.endpoint.name == MESSAGES:  # Anthropic's errors have no param field: it leads the message
        message = f"{param}: {message}"
    error = APIError(status, message, code, param)
    error.headers = {"x-trajectory-id": local(call.key.trajectory_id)}
    return error


async def _prepare(call: Call) -> tuple[dict[str, Any], Translator]:
    """The chat request for vLLM and the translator for the answer; ``APIError`` 400 if refused."""
    try:
        if call.endpoint.name == RESPONSES:
            return await _prepare_responses(call)
        request = _decode_messages(call.body)
        return messages.chat_request(request), messages.Translator(request, message_id=f"msg_{uuid.uuid4().hex}", model=request.model or "")
    except msgspec.ValidationError as exc:
        raise _refuse(call, 400, f"invalid request body: {exc}", "invalid_request") from None
    except Invalid as exc:
        raise _refuse(call, 400, exc.message, exc.code, exc.param) from None


async def _prepare_responses(call: Call) -> tuple[dict[str, Any], Translator]:
    request = _decode_responses(call.body)
    history = await _history(call, request)
    chat = responses.chat_request(request, msgspec.convert(history, list[wire.ResponsesItem]))
    if history:  # recorded with the whole conversation the model saw
        body = _decode(call.body)
        body["input"] = history + responses.input_json(body.get("input"))
        call.body = _encode(body)
    translator = responses.Translator(request, response_id=f"resp_{uuid.uuid4().hex}", created_at=int(time.time()), model=request.model or "")
    if request.store is not False:
        call.response_id = translator.id
    return chat, translator


async def _history(call: Call, request: wire.ResponsesCreate) -> list[Any]:
    """The conversation ``previous_response_id`` continues, as JSON items (the earlier call's
    input was recorded resolved, so one lookup has it all). Only a response of the same
    policy, and of the caller's project, continues."""
    if not request.previous_response_id:
        return []
    earlier = await call.svc.db.read(stored_response, request.previous_response_id)
    if earlier is None or earlier.policy != (call.route.policy if call.route else None) or not call.caller.owns(earlier.trajectory_id):
        message = f"Previous response with id '{request.previous_response_id}' not found."
        raise _refuse(call, 400, message, "previous_response_not_found", "previous_response_id")
    return responses.continued(earlier.request_json(), json_or_none(earlier.response or b""))


async def serve(scope: Scope, call: Call) -> ASGIResponse:
    chat, translator = await _prepare(call)
    call.to_policy(CHAT, chat)
    response = await call.send(scope["headers"], "/v1/chat/completions")
    if isinstance(response, ASGIResponse):
        return response
    headers = {"x-trajectory-id": local(call.key.trajectory_id), "x-policy-version": call.version}

    if response.status_code < 400 and response.headers.get("content-type", "").startswith("text/event-stream"):
        relay = TranslatedStream(call, response, translator)
        return RelayResponse(relay, 200, {**headers, "content-type": "text/event-stream; charset=utf-8"})

    raw = await call.read(response)
    if isinstance(raw, ASGIResponse):
        return raw

    completion = json_or_none(raw)
    headers["content-type"] = "application/json"
    if response.status_code < 400 and (answer := read_answer(translator.answer, completion)) is not None:
        out = _encode(answer)
        tokens = extract_tokens(CHAT, completion)
        await call.commit(call.record(OK, response.status_code, response=out, parsed=completion, tokens=tokens))
        return ASGIResponse(body=out, status_code=response.status_code, headers=headers)

    # An upstream error (or a 2xx that is not a completion): in the surface's error format.
    status = response.status_code if response.status_code >= 400 else 502
    message = call.svc.redact.text(upstream_message(response.status_code, completion, raw))
    out = call.endpoint.error_body(status, message, "upstream_error")
    await call.commit(call.record(UPSTREAM_ERROR, status, response=out, error=message))
    return ASGIResponse(body=out, status_code=status, headers=headers)


class TranslatedStream(Relay):
    """Chat chunks in, the surface's events out as each chunk arrives; recorded whatever way it ends."""

    def __init__(self, call: Call, response: UpstreamResponse, translator: Translator) -> None:
        super().__init__(call, response)
        self.translator = translator
        self.pending: list[bytes] = []
        self.capture = StreamCapture(CHAT, call.injected, listener=self._chunk, redact=call.svc.redact)

    def _chunk(self, chunk: dict[str, Any]) -> None:
        self.pending += self.translator.feed(chunk)

    def _record(self, status: str, error: str | None) -> CallRecord:
        completion = self.capture.result()
        self.recorded = True
        answer = _encode(self.translator.result())
        return self.call.record(status, 200, response=answer, parsed=completion, tokens=extract_tokens(CHAT, completion), error=error)

    async def events(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self.response.aiter_bytes():
                self.capture.feed(piece)
                if self.pending:
                    out, self.pending = b"".join(self.pending), []
                    yield out
            status, error = self.capture.outcome()
        except httpx.HTTPError as exc:
            status, error = UPSTREAM_CUT, f"the upstream stream failed: {exc or type(exc).__name__}"
        terminal = b""
        if status == OK:
            closing, terminal = self.translator.finish()
            if closing:
                yield b"".join(closing)
        record = self._record(status, error)
        try:
            await self.call.commit(record)
        except APIError as exc:
            yield self.call.endpoint.error_event(exc.detail)
            return
        yield terminal if status == OK else self.call.endpoint.error_event(error or "the upstream stream was cut")
