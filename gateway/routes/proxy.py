"""The OpenAI-compatible surface: forward each call upstream, relay the answer, record it.

Flow of one call::

    body ─ parse only model/stream ─▶ upstream (retried while nothing was sent)
         ◀─ plain: read, record, commit, then the body
         ◀─ stream: each event as it arrives; record and commit; then the terminal event

The client's bytes go upstream untouched, and the upstream's bytes come back
untouched: the gateway only adds ``X-Trajectory-Id``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from time import perf_counter
from typing import Any

import anyio
import httpx
import msgspec
from litestar import Request, get, post
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Send

from burnish_server.core.policies import Route
from burnish_server.core.records import CLIENT_DISCONNECTED, OK, UPSTREAM_CUT, UPSTREAM_ERROR, CallRecord
from burnish_server.gateway import keys
from burnish_server.gateway.capture import (
    ENDPOINTS,
    Endpoint,
    Injected,
    StreamCapture,
    Tokens,
    extract_tokens,
    inject,
)
from burnish_server.gateway.errors import APIError, error_body
from burnish_server.gateway.services import Services, services
from burnish_server.gateway.upstream import UpstreamFailure, response_headers
from burnish_server.store.models import utcnow

log = logging.getLogger("burnish.gateway")

# /v1/..., /t/{trajectory}/v1/... and /g/{group}/t/{trajectory}/v1/...
PREFIXES = ("", "/t/{trajectory_id:str}", "/g/{group_id:str}/t/{trajectory_id:str}")


class RequestHead(msgspec.Struct):
    """The only fields the gateway reads from a request body."""

    model: str | None = None
    stream: bool | None = None


_decode_head = msgspec.json.Decoder(RequestHead).decode
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def parse_head(body: bytes) -> RequestHead:
    if not body.strip():
        raise APIError(400, "the request body is empty; expected a JSON object", "invalid_json")
    try:
        return _decode_head(body)
    except msgspec.ValidationError as exc:
        raise APIError(400, f"invalid request body: {exc}", "invalid_request") from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None


def _json_or_none(raw: bytes) -> Any:
    try:
        return _decode(raw)
    except msgspec.DecodeError:
        return None


def _ms(since: float) -> float:
    return round((perf_counter() - since) * 1000, 3)


class Call:
    """One call in flight: what it needs to be recorded, whatever happens to it."""

    def __init__(self, svc: Services, endpoint: Endpoint, key: keys.CallKey, head: RequestHead, body: bytes) -> None:
        self.svc = svc
        self.endpoint = endpoint
        self.key = key
        self.head = head
        self.body = body  # as the client sent it: that is what gets recorded
        self.upstream_body = body
        self.route: Route | None = svc.policies.resolve(head.model)
        self.injected: Injected | None = None
        if self.route is not None:
            # A policy call: send vLLM the served version, and ask for the sampled tokens.
            request = _decode(body)
            request["model"] = self.route.upstream_model
            self.injected = inject(endpoint, request)
            self.upstream_body = _encode(request)
        self.started_at = utcnow()
        self.sent_at = perf_counter()
        self.attempts = 1
        self.first_byte_ms: float | None = None

    @property
    def version(self) -> str:
        return self.route.version if self.route is not None else (self.head.model or "")

    def answer(self, parsed: Any) -> tuple[Tokens | None, Any]:
        """The tokens in the full answer, then the answer as the client should see it."""
        tokens = extract_tokens(self.endpoint, parsed)
        if self.injected is not None:
            parsed = self.injected.scrub(parsed)
        return tokens, parsed

    def record(
        self,
        status: str,
        http_status: int | None,
        *,
        response: bytes | None = None,
        parsed: Any = None,
        tokens: Tokens | None = None,
        error: str | None = None,
    ) -> CallRecord:
        usage = parsed.get("usage") if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict) else None
        return CallRecord(
            trajectory_id=self.key.trajectory_id,
            group_id=self.key.group_id,
            group_size=self.key.group_size,
            endpoint=self.endpoint.name,
            model=self.head.model,
            stream=bool(self.head.stream),
            status=status,
            http_status=http_status,
            request=self.body,
            response=response,
            error=error,
            usage=usage,
            prompt_token_ids=tokens.prompt_token_ids if tokens else None,
            completion_token_ids=tokens.completion_token_ids if tokens else None,
            completion_logprobs=tokens.completion_logprobs if tokens else None,
            completion_lengths=tokens.completion_lengths if tokens else None,
            attempts=self.attempts,
            upstream_first_byte_ms=self.first_byte_ms,
            upstream_ms=_ms(self.sent_at),
            started_at=self.started_at,
            finished_at=utcnow(),
            policy=self.route.policy if self.route else None,
            policy_step=self.route.step if self.route else None,
            upstream_model=self.route.upstream_model if self.route else self.head.model,
        )

    async def commit(self, record: CallRecord) -> None:
        """Wait until the record is durable; raise APIError 503 if it cannot be."""
        if not self.svc.settings.record:
            self.observe(record)
            return
        try:
            await self.svc.writer.write(record)
        except Exception as exc:
            log.error("call for trajectory %s not recorded: %s", self.key.trajectory_id, exc)
            self.observe(record, status=503)
            raise APIError(503, "the gateway could not record this call; it was not completed", "record_failed") from exc
        self.observe(record)
        if self.svc.settings.log_bodies:
            log.debug("call %s/%s: request %s response %s", self.key.trajectory_id, self.endpoint.name, record.request[:4000], (record.response or b"")[:4000])

    def observe(self, record: CallRecord, status: int | None = None) -> None:
        """Count the call for /metrics: its whole time so far, and the upstream's part of it."""
        upstream = record.upstream_ms / 1000 if record.upstream_ms is not None else None
        self.svc.metrics.observe_call(self.endpoint.name, status or record.http_status or 502, perf_counter() - self.sent_at, upstream)


async def forward(request: Request, endpoint: Endpoint) -> ASGIResponse:
    svc = services(request)
    key = keys.resolve(request.path_params, keys.key_headers(request.scope["headers"]))
    try:
        body = await request.body()
        head = parse_head(body)
    except HTTPException as exc:  # refused, but still told which trajectory it would have joined
        exc.headers = {**(exc.headers or {}), "x-trajectory-id": key.trajectory_id}
        raise
    call = Call(svc, endpoint, key, head, body)
    path = f"/v1/{endpoint.path}"
    if query := request.scope.get("query_string"):
        path += "?" + query.decode("latin-1")

    try:
        response, call.attempts = await svc.upstream.send(
            "POST", path, content=call.upstream_body, headers=svc.upstream.request_headers(request.scope["headers"])
        )
    except UpstreamFailure as failure:
        call.attempts = failure.attempts
        await call.commit(call.record(UPSTREAM_ERROR, failure.status, error=failure.message))
        return _error(failure.status, failure.message, call)
    call.first_byte_ms = _ms(call.sent_at)

    headers = response_headers(response)
    headers["x-trajectory-id"] = key.trajectory_id
    headers["x-policy-version"] = call.version
    if response.status_code < 400 and response.headers.get("content-type", "").startswith("text/event-stream"):
        relay = StreamRelay(call, response)
        return RelayResponse(iterator=relay.events(), status_code=response.status_code, headers=headers)

    try:
        raw = await response.aread()
    except httpx.HTTPError as exc:
        broke = UpstreamFailure.from_error(exc, "the upstream broke off its answer", call.attempts)
        await call.commit(call.record(UPSTREAM_ERROR, broke.status, error=broke.message))
        return _error(broke.status, broke.message, call)
    finally:
        await response.aclose()

    parsed = _json_or_none(raw)
    if response.status_code < 400:
        tokens, parsed = call.answer(parsed)
        if call.injected is not None and isinstance(parsed, dict):
            raw = _encode(parsed)
        await call.commit(call.record(OK, response.status_code, response=raw if parsed is not None else None, parsed=parsed, tokens=tokens))
        return ASGIResponse(body=raw, status_code=response.status_code, headers=headers)

    # An upstream error: relayed with its status, in the OpenAI error format.
    message = f"upstream answered {response.status_code}"
    if isinstance(parsed, dict) and "error" in parsed:
        err = parsed["error"]
        message = str(err.get("message", message) if isinstance(err, dict) else err)
    else:
        raw_text = raw[:500].decode("utf-8", "replace")
        message = f"upstream answered {response.status_code}: {raw_text}" if raw_text else message
        raw = error_body(response.status_code, message, "upstream_error")
        headers["content-type"] = "application/json"
    await call.commit(call.record(UPSTREAM_ERROR, response.status_code, response=raw, error=message))
    return ASGIResponse(body=raw, status_code=response.status_code, headers=headers)


def _error(status: int, message: str, call: Call) -> ASGIResponse:
    code = "upstream_timeout" if status == 504 else "upstream_unavailable"
    headers = {"x-trajectory-id": call.key.trajectory_id, "x-policy-version": call.version}
    return ASGIResponse(body=error_body(status, message, code), status_code=status, headers=headers)


class StreamRelay:
    """Passes a stream through event by event and records it, whatever way it ends."""

    def __init__(self, call: Call, response: httpx.Response) -> None:
        self.call = call
        self.response = response
        self.capture = StreamCapture(call.endpoint, call.injected)
        self.recorded = False

    def _record(self, status: str, error: str | None) -> CallRecord:
        tokens, result = self.call.answer(self.capture.result())
        self.recorded = True
        return self.call.record(status, self.response.status_code, response=_encode(result), parsed=result, tokens=tokens, error=error)

    async def events(self) -> AsyncIterator[bytes]:
        try:
            try:
                async for chunk in self.response.aiter_bytes():
                    if out := self.capture.feed(chunk):
                        yield out
                status, error = self.capture.outcome()
            except httpx.HTTPError as exc:
                status, error = UPSTREAM_CUT, f"the upstream stream failed: {exc or type(exc).__name__}"
            record = self._record(status, error)
            try:
                await self.call.commit(record)
            except APIError as exc:
                yield self.call.endpoint.error_event(exc.detail)
                return
            if status == UPSTREAM_CUT:
                yield self.call.endpoint.error_event(error or "the upstream stream was cut")
            elif self.capture.held:
                yield self.capture.held
        finally:
            if not self.recorded and self.call.svc.settings.record:
                # The client went away: record what arrived, without waiting on the commit.
                record = self._record(CLIENT_DISCONNECTED, "the client disconnected before the end")
                self.call.svc.writer.submit(record)
                self.call.observe(record, status=499)  # nginx's "client closed request"
            with anyio.CancelScope(shield=True):
                await self.response.aclose()


class RelayResponse(ASGIStreamingResponse):
    """Litestar's streaming response, plus: the iterator is always closed.

    When the client disconnects, Litestar cancels the send loop, possibly while
    the generator sits at a ``yield``; closing it here runs its ``finally`` at
    once, so the call is recorded as disconnected and the upstream released.
    """

    async def send_body(self, send: Send, receive: Receive) -> None:
        try:
            await super().send_body(send, receive)
        finally:
            await self.iterator.aclose()  # type: ignore[union-attr]


def _proxy_handler(endpoint: Endpoint) -> HTTPRouteHandler:
    async def handler(request: Request) -> ASGIResponse:
        return await forward(request, endpoint)

    handler.__name__ = f"proxy_{endpoint.name.replace('.', '_')}"
    return post([f"{prefix}/v1/{endpoint.path}" for prefix in PREFIXES], name=handler.__name__, status_code=200)(handler)


@get([f"{prefix}/v1/models" for prefix in PREFIXES], name="models")
async def models(request: Request) -> ASGIResponse:
    """The policies, then the upstream's models."""
    svc = services(request)
    try:
        response, _ = await svc.upstream.send("GET", "/v1/models", content=None, headers=svc.upstream.request_headers(request.scope["headers"]))
    except UpstreamFailure as failure:
        return ASGIResponse(body=error_body(failure.status, failure.message, "upstream_unavailable"), status_code=failure.status)
    try:
        raw = await response.aread()
    finally:
        await response.aclose()
    listing = _json_or_none(raw)
    if response.status_code == 200 and isinstance(listing, dict) and isinstance(listing.get("data"), list) and svc.policies.policies:
        entries = [
            {"id": p.name, "object": "model", "owned_by": "burnish", "root": p.base_model, "parent": p.base_model, "step": p.step}
            for p in svc.policies.policies.values()
        ]
        listing["data"] = entries + listing["data"]
        raw = _encode(listing)
    return ASGIResponse(body=raw, status_code=response.status_code, headers=response_headers(response))


route_handlers = [_proxy_handler(endpoint) for endpoint in ENDPOINTS] + [models]
