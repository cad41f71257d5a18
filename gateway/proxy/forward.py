"""One proxied call, whatever its surface and model: ``forward`` reads top to bottom in the order
a call goes::

    body ─ parse only model/stream ─ the call's Translation ─▶ upstream (retried while nothing was sent)
         ◀─ plain: read, translate, record, commit, then the body
         ◀─ stream: each event as it arrives; record and commit; then the terminal event
    a failure: raised once (core/platform/errors.py), recorded, answered in the surface's error format

The call's ``Translation`` (``translation.py``) is all that differs: a call passes through as
it came (the gateway adds only ``X-Trajectory-Id`` and ``X-Policy-Version``, and for a policy
asks vLLM for token ids and logprobs, which the client does not see unless it asked), or a
policy's call on a surface vLLM returns no token ids on goes through chat completions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import anyio
from litestar.types import ASGIApp, Receive, Scope, Send

from burnish_server.core.platform.access import DEFAULT_PROJECT, Principal, qualify_optional
from burnish_server.core.platform.errors import BurnishError, Invalid, TooLarge, UpstreamError
from burnish_server.core.protocols.records import CLIENT_DISCONNECTED, UPSTREAM_ERROR
from burnish_server.core.protocols.surfaces import Surface
from burnish_server.gateway.edge.errors import BODY_TOO_LARGE
from burnish_server.gateway.proxy import filing, window
from burnish_server.gateway.proxy.call import Call, parse_head
from burnish_server.gateway.proxy.departure import ClientGone, Departure
from burnish_server.gateway.proxy.paths import is_eval_path
from burnish_server.gateway.proxy.streaming import Relay, Relayed, RelayResponse, unheard
from burnish_server.gateway.proxy.translation import translation
from burnish_server.gateway.services import Services
from burnish_server.gateway.upstream.client import is_stream
from burnish_server.gateway.upstream.connections.base import UpstreamResponse


@dataclasses.dataclass(slots=True)
class Inbound:
    """A request to a proxy route, however it came in: from the gateway's entry point
    (``gateway/edge/entry.py``, the hot path) or through Litestar's routing (``_proxy_handler``)."""

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
    filed = filing.resolve(inbound.params, filing.filing_headers(scope["headers"]), eval_path=is_eval_path(scope["path"]))
    shown = filed.trajectory_id
    if caller.project != DEFAULT_PROJECT:  # stored under the caller's project (core/platform/access.py)
        filed = dataclasses.replace(filed, trajectory_id=caller.stored(filed.trajectory_id), group_id=qualify_optional(caller.project, filed.group_id))
    try:
        body = await inbound.body()
        head = parse_head(body)
        call = Call(svc, surface, filed, head, body, caller)
        way = await translation(call)
    except BurnishError as exc:  # refused, but still told which trajectory it would have joined
        exc.headers["x-trajectory-id"] = shown
        raise
    response: UpstreamResponse | None = None
    try:
        with Departure(inbound.receive, svc.waiting):  # a client that leaves stops the call upstream
            path = way.upstream_path(scope.get("query_string"))
            response = await call.send(scope["headers"], path)
            if response.status_code == 400 and call.route is not None:  # the served window? (gateway/proxy/window.py)
                response = await window.refit(call, response, lambda: call.send(scope["headers"], path))
            streams = is_stream(response)
            headers = way.headers(response, streams)
            if streams:
                return RelayResponse(Relay(call, response, way), response.status_code, headers)
            raw = await call.read(response)
    except ClientGone as gone:
        return await left(call, response, str(gone))
    except (UpstreamError, Invalid) as failure:  # answered in the surface's format, naming the call
        if isinstance(failure, UpstreamError):  # no usable answer: recorded (a refused header: nothing was sent)
            failure.message = svc.redact.text(failure.message)
            await call.commit(call.record(UPSTREAM_ERROR, failure.status, error=failure.message))
        failure.headers.update({"x-trajectory-id": shown, "x-policy-version": call.version})
        raise
    out, status, record = await way.answer(response.status_code, raw, headers)
    await call.commit(record)
    return Relayed(out, status, headers)


async def left(call: Call, response: UpstreamResponse | None, why: str) -> ASGIApp:
    """The client left before its answer: the upstream's answer let go (its connection closed, so
    vLLM stops), the call recorded as disconnected without waiting on the commit, and nothing sent."""
    if response is not None:
        with anyio.CancelScope(shield=True):
            await response.aclose()
    record = call.record(CLIENT_DISCONNECTED, None, error=why)
    if call.svc.settings.record and not call.recorded:  # a refusal's record may be on its way already (window.refit)
        call.svc.writer.submit(record).add_done_callback(unheard)
    call.observe(record, status=499)  # nginx's "client closed request"
    return _nothing


async def _nothing(scope: Scope, receive: Receive, send: Send) -> None:
    """No answer: no one is there to read it."""
