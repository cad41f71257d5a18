"""The OpenAI-compatible surface: forward each call upstream, relay the answer, record it.

Flow of one call::

    body ─ parse only model/stream ─▶ upstream (retried while nothing was sent)
         ◀─ plain: read, record, commit, then the body
         ◀─ stream: each event as it arrives; record and commit; then the terminal event

The client's bytes go upstream untouched, and the upstream's bytes come back
untouched: the gateway only adds ``X-Trajectory-Id``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping

import httpx
import msgspec
from litestar import Request, get, post
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope

from burnish_server.core.access import ANONYMOUS, DEFAULT_PROJECT, Principal, qualify_optional
from burnish_server.core.records import OK, UPSTREAM_CUT, UPSTREAM_ERROR, CallRecord
from burnish_server.gateway import keys, openapi
from burnish_server.gateway.access import BEARER, principal
from burnish_server.gateway.call import Call, json_or_none, parse_head, upstream_message
from burnish_server.gateway.capture import ENDPOINTS, Endpoint, StreamCapture
from burnish_server.gateway.errors import BODY_TOO_LARGE, APIError, error_body
from burnish_server.gateway.routes import translated
from burnish_server.gateway.services import Services, services
from burnish_server.gateway.streaming import Relay, Relayed, RelayResponse
from burnish_server.gateway.upstream import UpstreamFailure, UpstreamResponse, response_headers

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

# /v1/..., /t/{trajectory}/v1/... and /g/{group}/t/{trajectory}/v1/...; each also under
# /eval, which marks the call held out for evaluation (keys.py).
KEY_PREFIXES = ("", "/t/{trajectory_id:str}", "/g/{group_id:str}/t/{trajectory_id:str}")
PREFIXES = KEY_PREFIXES + tuple(keys.EVAL_PREFIX + prefix for prefix in KEY_PREFIXES)


@dataclasses.dataclass(slots=True)
class Inbound:
    """A request to a proxy route, however it came in: from the gateway's entry point
    (``gateway/edge.py``, the hot path) or through Litestar's routing (``_proxy_handler``)."""

    svc: Services
    caller: Principal
    scope: Scope
    receive: Receive
    params: Mapping[str, str]  # the path's trajectory_id and group_id, where it has them

    async def body(self) -> bytes:
        """The whole body; ``APIError`` 413 beyond ``max_body_bytes`` (counted as it arrives, so
        a client cannot make the gateway hold more than that), 400 if the client left first."""
        limit = self.svc.settings.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise APIError(400, "the client disconnected before the end of its request body", "client_disconnected")
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            size += len(chunk)
            if size > limit:
                raise APIError(413, BODY_TOO_LARGE, "body_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def forward(inbound: Inbound, endpoint: Endpoint) -> ASGIResponse:
    svc, caller, scope = inbound.svc, inbound.caller, inbound.scope
    key = keys.resolve(inbound.params, keys.key_headers(scope["headers"]), eval_path=keys.is_eval_path(scope["path"]))
    shown = key.trajectory_id
    if caller.project != DEFAULT_PROJECT:  # stored under the caller's project (core/access.py)
        key = dataclasses.replace(key, trajectory_id=caller.stored(key.trajectory_id), group_id=qualify_optional(caller.project, key.group_id))
    try:
        body = await inbound.body()
        head = parse_head(body)
    except HTTPException as exc:  # refused, but still told which trajectory it would have joined
        exc.headers = {**(exc.headers or {}), "x-trajectory-id": shown}
        raise
    call = Call(svc, endpoint, key, head, body, caller)
    if call.route is not None:
        if endpoint.name in translated.SURFACES:  # Responses, Messages: served through chat completions
            return await translated.serve(scope, call)
        call.to_policy(endpoint, _decode(body))
    path = f"/v1/{endpoint.path}"
    if query := scope.get("query_string"):
        path += "?" + query.decode("latin-1")

    response = await call.send(scope["headers"], path)
    if isinstance(response, ASGIResponse):
        return response

    headers = response_headers(response)
    headers["x-trajectory-id"] = shown
    headers["x-policy-version"] = call.version
    if response.status_code < 400 and response.headers.get("content-type", "").startswith("text/event-stream"):
        return RelayResponse(StreamRelay(call, response), response.status_code, headers)

    raw = await call.read(response)
    if isinstance(raw, ASGIResponse):
        return raw

    parsed = json_or_none(raw)
    if response.status_code < 400:
        tokens, parsed = call.answer(parsed)
        if call.injected is not None and isinstance(parsed, dict):
            raw = _encode(parsed)
        await call.commit(call.record(OK, response.status_code, response=raw if parsed is not None else None, parsed=parsed, tokens=tokens))
        return Relayed(raw, response.status_code, headers)

    # An upstream error: relayed with its status (and the gateway's secrets masked); a body that
    # is no error JSON becomes one.
    if (masked := svc.redact(raw)) is not raw:
        raw, parsed = masked, json_or_none(masked)
    message = upstream_message(response.status_code, parsed, raw)
    if not (isinstance(parsed, dict) and "error" in parsed):
        raw = endpoint.error_body(response.status_code, message, "upstream_error")
        headers["content-type"] = "application/json"
    await call.commit(call.record(UPSTREAM_ERROR, response.status_code, response=raw, error=message))
    return Relayed(raw, response.status_code, headers)


class StreamRelay(Relay):
    """Passes a stream through event by event and records it, whatever way it ends."""

    def __init__(self, call: Call, response: UpstreamResponse) -> None:
        super().__init__(call, response)
        self.capture = StreamCapture(call.endpoint, call.injected, redact=call.svc.redact)

    def _record(self, status: str, error: str | None) -> CallRecord:
        tokens, result = self.call.answer(self.capture.result())
        self.recorded = True
        return self.call.record(status, self.response.status_code, response=_encode(result), parsed=result, tokens=tokens, error=error)

    async def events(self) -> AsyncIterator[bytes]:
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


def _proxy_handler(endpoint: Endpoint) -> HTTPRouteHandler:
    async def handler(request: Request) -> ASGIResponse:
        inbound = Inbound(services(request), principal(request.scope), request.scope, request.receive, request.path_params)
        return await forward(inbound, endpoint)

    handler.__name__ = f"proxy_{endpoint.name.replace('.', '_')}"
    return post(
        [f"{prefix}/v1/{endpoint.path}" for prefix in PREFIXES],
        name=handler.__name__,
        status_code=200,
        opt={"scope": "call"},
        security=BEARER,
        operation_class=openapi.proxy_operation(endpoint.name),
    )(handler)


@get([f"{prefix}/v1/models" for prefix in PREFIXES], name="models", opt={"scope": "call"}, security=BEARER, operation_class=openapi.models_operation)
async def models(request: Request) -> ASGIResponse:
    """The policies, then the upstream's models."""
    svc = services(request)
    try:
        response, _ = await svc.upstream.send(
            "GET", "/v1/models", content=None, headers=svc.upstream.request_headers(request.scope["headers"], ours=principal(request.scope) is not ANONYMOUS)
        )
    except UpstreamFailure as failure:
        return ASGIResponse(body=error_body(failure.status, failure.message, "upstream_unavailable"), status_code=failure.status)
    try:
        raw = await response.aread()
    except httpx.HTTPError as exc:
        broken = UpstreamFailure.from_error(exc, "the upstream broke off its answer")
        return ASGIResponse(body=error_body(broken.status, broken.message, "upstream_unavailable"), status_code=broken.status)
    finally:
        await response.aclose()
    listing = json_or_none(raw)
    if response.status_code == 200 and isinstance(listing, dict) and isinstance(listing.get("data"), list) and svc.policies.policies:
        entries = [
            {"id": p.name, "object": "model", "owned_by": "burnish", "root": p.base_model, "parent": p.base_model, "step": p.step}
            for p in svc.policies.policies.values()
        ]
        listing["data"] = entries + listing["data"]
        raw = _encode(listing)
    elif response.status_code >= 400:
        raw = svc.redact(raw)
    return ASGIResponse(body=raw, status_code=response.status_code, headers=response_headers(response))


route_handlers = [_proxy_handler(endpoint) for endpoint in ENDPOINTS] + [models]
