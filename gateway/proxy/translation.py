"""How one call's answer gets from the upstream's words to the client's: a ``Translation``.

The proxy (``forward.py: forward``) serves every call the same way: send, then relay a
stream or read a plain answer, record, commit, answer. What differs by surface and by
model is only what goes upstream and how the answer comes back, and that is a Translation:

- ``PassThrough``: the upstream speaks the client's protocol. The body goes as it came (for
  a policy, with token ids and logprobs asked for); the answer comes back as it came, less
  what the client did not ask for. Every model that is no policy, and every policy call on
  a surface vLLM returns token ids on (chat completions, completions).
- ``ThroughChat``: a policy's call on ``/v1/responses`` or ``/v1/messages``, which vLLM
  returns no token ids on. It goes to vLLM as a chat completion (the surface's translator,
  ``core/protocols/translate/``) and its answer, or each chunk of its stream, comes back translated.

What is recorded either way: the client's request (for a Responses call that continues an
earlier one, with ``input`` resolved to the whole conversation, so every reader sees what
the model saw), the answer the client received, and the token ids and logprobs.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from burnish_server.core.platform.access import local
from burnish_server.core.platform.errors import Invalid
from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.records import OK, UPSTREAM_CUT, UPSTREAM_ERROR, CallRecord
from burnish_server.core.protocols.surfaces import CHAT, MESSAGES, RESPONSES
from burnish_server.core.protocols.translate import common as translate
from burnish_server.core.protocols.translate import messages, responses
from burnish_server.core.protocols.translate.common import HostedTools
from burnish_server.gateway.proxy.call import Call, json_or_none, read_answer, upstream_message
from burnish_server.gateway.proxy.capture import StreamCapture, extract_tokens
from burnish_server.gateway.upstream.client import UpstreamResponse, response_headers
from burnish_server.store.responses import stored_response

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_decode_responses = msgspec.json.Decoder(wire.ResponsesCreate).decode
_decode_messages = msgspec.json.Decoder(wire.MessagesCreate).decode
# Names the hosted tools a policy's call was served without (the policy's serving.hosted_tools).
OMITTED_TOOLS_HEADER = "x-burnish-omitted-tools"


class Translation:
    """What one call sends upstream and how its answer comes back (the base: as it came)."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.capture: StreamCapture | None = None

    def upstream_path(self, query: bytes | None) -> str:
        raise NotImplementedError

    def headers(self, response: UpstreamResponse, streams: bool) -> dict[str, str]:
        """The answer's headers, the gateway's own among them."""
        raise NotImplementedError

    async def answer(self, status: int, raw: bytes, headers: dict[str, str]) -> tuple[bytes, int, CallRecord]:
        """A plain answer: the bytes the client gets, their status, and the call's record
        (``headers``, the answer's, changed to fit where the bytes do)."""
        raise NotImplementedError

    # A stream: ``start`` once, ``feed`` each chunk the upstream sends (the bytes to relay
    # now), ``end`` once it is over (the bytes to send before the record is committed, and the
    # last event, sent after), ``record`` whatever way it ended.
    def start(self) -> None:
        raise NotImplementedError

    def feed(self, chunk: bytes) -> bytes:
        raise NotImplementedError

    def end(self, status: str, error: str | None) -> tuple[bytes, bytes]:
        raise NotImplementedError

    def record(self, status: str, error: str | None) -> CallRecord:
        raise NotImplementedError

    def _ours(self, headers: dict[str, str]) -> dict[str, str]:
        headers["x-trajectory-id"] = local(self.call.filing.trajectory_id)
        headers["x-policy-version"] = self.call.version
        if omitted := self.call.adjustments.omitted_tools:
            headers[OMITTED_TOOLS_HEADER] = ", ".join(omitted)
        return headers


class PassThrough(Translation):
    """The upstream speaks the client's protocol: the call goes, and comes back, as it is."""

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        if call.route is not None:  # a policy: ask vLLM for the sampled tokens
            call.to_policy(call.surface, _decode(call.body))

    def upstream_path(self, query: bytes | None) -> str:
        path = f"/v1/{self.call.surface.path}"
        return f"{path}?{query.decode('latin-1')}" if query else path

    def headers(self, response: UpstreamResponse, streams: bool) -> dict[str, str]:
        return self._ours(response_headers(response))

    async def answer(self, status: int, raw: bytes, headers: dict[str, str]) -> tuple[bytes, int, CallRecord]:
        call = self.call
        parsed = json_or_none(raw)
        if status < 400:
            tokens, parsed = call.answer(parsed)
            if call.injected is not None and isinstance(parsed, dict):
                raw = _encode(parsed)
            return raw, status, call.record(OK, status, response=raw if parsed is not None else None, parsed=parsed, tokens=tokens)
        # An upstream error: relayed with its status (the gateway's secrets masked); a body that
        # is no error JSON becomes one in the surface's format.
        raw, parsed = call.masked(raw, parsed)
        message = upstream_message(status, parsed, raw)
        if not (isinstance(parsed, dict) and "error" in parsed):
            raw = call.surface.error_body(status, message, "upstream_error")
            headers["content-type"] = "application/json"
        return raw, status, call.record(UPSTREAM_ERROR, status, response=raw, error=message)

    def start(self) -> None:
        self.capture = StreamCapture(self.call.surface, self.call.injected, redact=self.call.svc.redact)

    def feed(self, chunk: bytes) -> bytes:
        assert self.capture is not None
        return self.capture.feed(chunk)

    def end(self, status: str, error: str | None) -> tuple[bytes, bytes]:
        assert self.capture is not None
        # An upstream's error event was relayed as it came; a cut stream gets one of ours.
        return b"", self.call.surface.error_event(error or "the upstream stream was cut") if status == UPSTREAM_CUT else self.capture.held

    def record(self, status: str, error: str | None) -> CallRecord:
        assert self.capture is not None
        tokens, result = self.call.answer(self.capture.result())
        return self.call.record(status, self.call.http_status, response=_encode(result), parsed=result, tokens=tokens, error=error)


class ThroughChat(Translation):
    """A policy's call on a surface vLLM returns no token ids on, served as a chat completion."""

    def __init__(self, call: Call, chat: dict[str, Any], translator: translate.Translator[Any]) -> None:
        super().__init__(call)
        self.translator = translator
        self.pending: list[bytes] = []
        call.to_policy(CHAT, chat)

    @classmethod
    async def prepare(cls, call: Call) -> ThroughChat:
        """The chat request and the translator; ``Invalid`` (400) for a request the surface refuses."""
        try:
            chat, translator = await _PREPARE[call.surface.name](call)
        except msgspec.ValidationError as exc:
            raise Invalid(f"invalid request body: {exc}", "invalid_request") from None
        return cls(call, chat, translator)

    def upstream_path(self, query: bytes | None) -> str:
        return "/v1/chat/completions"

    def headers(self, response: UpstreamResponse, streams: bool) -> dict[str, str]:
        return self._ours({"content-type": "text/event-stream; charset=utf-8" if streams else "application/json"})

    async def answer(self, status: int, raw: bytes, headers: dict[str, str]) -> tuple[bytes, int, CallRecord]:
        call = self.call
        completion = json_or_none(raw)
        if status < 400 and (answer := read_answer(self.translator.answer, completion)) is not None:
            out = _encode(answer)
            return out, status, call.record(OK, status, response=out, parsed=completion, tokens=extract_tokens(CHAT, completion))
        # An upstream error (or a 2xx that is not a completion): in the surface's error format,
        # the gateway's secrets masked before the message is cut to its length.
        raw, completion = call.masked(raw, completion)
        message = upstream_message(status, completion, raw)
        status = status if status >= 400 else 502
        out = call.surface.error_body(status, message, "upstream_error")
        return out, status, call.record(UPSTREAM_ERROR, status, response=out, error=message)

    def start(self) -> None:
        self.capture = StreamCapture(CHAT, self.call.injected, listener=self._chunk, redact=self.call.svc.redact)

    def _chunk(self, chunk: answers.ChatChunk) -> None:
        self.pending += self.translator.feed(chunk)

    def feed(self, chunk: bytes) -> bytes:
        assert self.capture is not None
        self.capture.feed(chunk)
        out, self.pending = b"".join(self.pending), []
        return out

    def end(self, status: str, error: str | None) -> tuple[bytes, bytes]:
        if status != OK:
            return b"", self.call.surface.error_event(error or "the upstream stream was cut")
        closing, terminal = self.translator.finish()
        return b"".join(closing), terminal

    def record(self, status: str, error: str | None) -> CallRecord:
        assert self.capture is not None
        completion = self.capture.result()
        answer = _encode(self.translator.result())
        return self.call.record(status, 200, response=answer, parsed=completion, tokens=extract_tokens(CHAT, completion), error=error)


async def translation(call: Call) -> Translation:
    """The way a call is served: through chat completions for a policy on a surface vLLM
    returns no token ids on, else as it is."""
    if call.route is not None and call.surface.translator is not None:
        return await ThroughChat.prepare(call)
    return PassThrough(call)


def _hosted_tools(call: Call) -> HostedTools:
    return call.policy.serving.hosted_tools if call.policy is not None else "omit"


def _offered(call: Call, offered: translate.Offered) -> translate.Offered:
    """``offered``, its omitted tools noted on the call (its record and the answer's header)."""
    if offered.omitted:
        call.adjustments = msgspec.structs.replace(call.adjustments, omitted_tools=offered.omitted)
    return offered


async def _prepare_messages(call: Call) -> tuple[dict[str, Any], translate.Translator[Any]]:
    request = _decode_messages(call.body)
    offered = _offered(call, messages.offer_tools(request, _hosted_tools(call)))
    return messages.chat_request(request, offered), messages.MessagesTranslator(request, message_id=f"msg_{uuid.uuid4().hex}", model=request.model or "")


async def _prepare_responses(call: Call) -> tuple[dict[str, Any], translate.Translator[Any]]:
    request = _decode_responses(call.body)
    history = await _history(call, request)
    offered = _offered(call, responses.offer_tools(request.tools, _hosted_tools(call)))
    chat = responses.chat_request(request, msgspec.convert(history, list[wire.ResponsesItem]), offered)
    if history:  # recorded with the whole conversation the model saw
        body = _decode(call.body)
        body["input"] = history + responses.input_json(body.get("input"))
        call.body = _encode(body)
    translator = responses.ResponsesTranslator(
        request, response_id=f"resp_{uuid.uuid4().hex}", created_at=int(time.time()), model=request.model or "", offered=offered
    )
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
        raise Invalid(message, "previous_response_not_found", "previous_response_id")
    return responses.continued(earlier.request_json(), json_or_none(earlier.response or b""))


# How a call on each translated surface becomes a chat request and its translator. The
# Responses API's needs the store: a call may continue an earlier one (previous_response_id).
_PREPARE = {RESPONSES.name: _prepare_responses, MESSAGES.name: _prepare_messages}
