"""The proxy: every surface's calls forwarded upstream, their answers relayed and recorded.

One pipeline for every call (``forward``)::

    body ─ parse only model/stream ─ the call's Translation ─▶ upstream (retried while nothing was sent)
         ◀─ plain: read, translate, record, commit, then the body
         ◀─ stream: each event as it arrives; record and commit; then the terminal event
    a failure: raised once (core/platform/errors.py), recorded, answered in the surface's error format

The call's ``Translation`` (``gateway/translation.py``) is all that differs: a call passes
through as it came (the gateway adds only ``X-Trajectory-Id`` and ``X-Policy-Version``,
and for a policy asks vLLM for token ids and logprobs, which the client does not see unless
it asked), or a policy's call on a surface vLLM returns no token ids on goes through chat
completions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Receive, Scope

from burnish_server.core.platform.access import ANONYMOUS, DEFAULT_PROJECT, Principal, qualify_optional
from burnish_server.core.platform.errors import BurnishError, Invalid, TooLarge, UpstreamError
from burnish_server.core.protocols.records import UPSTREAM_ERROR
from burnish_server.core.protocols.surfaces import SURFACES, Surface
from burnish_server.gateway import keys, openapi, window
from burnish_server.gateway.access import BEARER, principal
from burnish_server.gateway.call import Call, json_or_none, parse_head
from burnish_server.gateway.errors import BODY_TOO_LARGE
from burnish_server.gateway.services import Services, services
from burnish_server.gateway.streaming import Relay, Relayed, RelayResponse
from burnish_server.gateway.translation import translation
from burnish_server.gateway.upstream import failed, is_stream, response_headers

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
        """The whole body; ``TooLarge`` (413) beyond ``max_body_bytes`` (counted as it arrives, so
        a client cannot make the gateway hold more than that), 400 if the client left first."""
        limit = self.svc.settings.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise Invalid("the client disconnected before the end of its request body", "client_disconnected")
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            size += len(chunk)
            if size > limit:
                raise TooLarge(BODY_TOO_LARGE, "body_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def forward(inbound: Inbound, surface: Surface) -> ASGIApp:
    """One call, whatever its surface and model: the pipeline above."""
    svc, caller, scope = inbound.svc, inbound.caller, inbound.scope
    key = keys.resolve(inbound.params, keys.key_headers(scope["headers"]), eval_path=keys.is_eval_path(scope["path"]))
    shown = key.trajectory_id
    if caller.project != DEFAULT_PROJECT:  # stored under the caller's project (core/platform/access.py)
        key = dataclasses.replace(key, trajectory_id=caller.stored(key.trajectory_id), group_id=qualify_optional(caller.project, key.group_id))
    try:
        body = await inbound.body()
        head = parse_head(body)
        call = Call(svc, surface, key, head, body, caller)
        way = await translation(call)
    except BurnishError as exc:  # refused, but still told which trajectory it would have joined
        exc.headers["x-trajectory-id"] = shown
        raise
    try:
        path = way.upstream_path(scope.get("query_string"))
        response = await call.send(scope["headers"], path)
        if response.status_code == 400 and call.route is not None:  # the served window? (gateway/window.py)
            response = await window.refit(call, response, lambda: call.send(scope["headers"], path))
        streams = is_stream(response)
        headers = way.headers(response, streams)
        if streams:
            return RelayResponse(Relay(call, response, way), response.status_code, headers)
        raw = await call.read(response)
    except (UpstreamError, Invalid) as failure:  # answered in the surface's format, naming the call
        if isinstance(failure, UpstreamError):  # no usable answer: recorded (a refused header: nothing was sent)
            failure.message = svc.redact.text(failure.message)
            await call.commit(call.record(UPSTREAM_ERROR, failure.status, error=failure.message))
        failure.headers.update({"x-trajectory-id": shown, "x-policy-version": call.version})
        raise
    out, status, record = await way.answer(response.status_code, raw, headers)
    await call.commit(record)
    return Relayed(out, status, headers)


def _proxy_handler(surface: Surface) -> HTTPRouteHandler:
    """The surface's route in Litestar: documents it, and serves a path the entry point did
    not take as the proxy's (``edge.py``), a trailing slash say."""

    async def handler(request: Request) -> ASGIApp:
        inbound = Inbound(services(request), principal(request.scope), request.scope, request.receive, request.path_params)
        return await forward(inbound, surface)

    handler.__name__ = f"proxy_{surface.name.replace('.', '_')}"
    return post(
        [f"{prefix}/v1/{surface.path}" for prefix in PREFIXES],
        name=handler.__name__,
        status_code=200,
        opt={"scope": "call"},
        security=BEARER,
        operation_class=openapi.proxy_operation(surface),
    )(handler)


@get([f"{prefix}/v1/models" for prefix in PREFIXES], name="models", opt={"scope": "call"}, security=BEARER, operation_class=openapi.models_operation)
async def models(request: Request) -> ASGIResponse:
    """The policies, then the upstream's models."""
    svc = services(request)
    headers = svc.upstream.request_headers(request.scope["headers"], ours=principal(request.scope) is not ANONYMOUS)
    response, _ = await svc.upstream.send("GET", "/v1/models", content=None, headers=headers)
    try:
        raw = await response.aread()
    except UpstreamError as exc:
        raise failed(exc, "the upstream broke off its answer") from exc
    finally:
        await response.aclose()
    listing = json_or_none(raw)
    if response.status_code == 200 and isinstance(listing, dict) and isinstance(listing.get("data"), list) and svc.policies.policies:
        caller = principal(request.scope)
        shown = svc.policies.listed(caller)
        entries = [{"id": p.name, "object": "model", "owned_by": "burnish", "root": p.base_model, "parent": p.base_model, "step": p.step} for p in shown]
        # vLLM lists each policy's adapters (<policy>@<step>): another project's are not shown.
        hidden = {p.name for p in svc.policies.policies.values()} - {p.name for p in shown}
        upstream = [m for m in listing["data"] if not (isinstance(m, dict) and str(m.get("id", "")).rpartition("@")[0] in hidden)]
        listing["data"] = entries + upstream
        raw = _encode(listing)
    elif response.status_code >= 400:
        raw = svc.redact(raw)
    return ASGIResponse(body=raw, status_code=response.status_code, headers=response_headers(response))


route_handlers = [_proxy_handler(surface) for surface in SURFACES] + [models]
