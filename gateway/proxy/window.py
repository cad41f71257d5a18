"""A policy's call fitted to the window vLLM serves it with (core/protocols/window.py reads vLLM's refusals).

- A ``max_tokens`` past the window is lowered to the window, not refused: vLLM then gives the
  call what its prompt leaves. The first such call of a policy is refused by vLLM and sent again
  (the gateway learns the window from the refusal); later ones are lowered before they go. The
  recorded call says so (``adjustments``: asked, sent).
- A prompt past the window is answered with the protocol's own error (core/protocols/window.py), naming
  the prompt's tokens as vLLM's ``/tokenize`` counts them (its refusal stops counting one past
  the window), and recorded as refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from burnish_server.core.platform.errors import Invalid, UpstreamError
from burnish_server.core.protocols import window
from burnish_server.core.protocols.records import UPSTREAM_ERROR
from burnish_server.gateway.proxy.call import Call, json_or_none, upstream_message
from burnish_server.gateway.upstream.client import UpstreamResponse

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class Read:
    """An answer whose body was read already, to hand on as it came."""

    def __init__(self, response: UpstreamResponse, body: bytes) -> None:
        self.status_code = response.status_code
        self.headers = response.headers
        self.body = body

    async def aread(self) -> bytes:
        return self.body

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        yield self.body

    async def aclose(self) -> None:
        return None


async def refit(call: Call, response: UpstreamResponse, send: Callable[[], Awaitable[UpstreamResponse]]) -> UpstreamResponse:
    """A policy call's 400 from vLLM, seen for what it says of the window: sent again with its
    budget lowered, refused in the surface's words (``Invalid``: the call is recorded here), or,
    for any other refusal, handed on as it came."""
    assert call.route is not None
    for _ in range(2):  # lowered once; the prompt may then be refused too
        body = await call.read(response)
        found = window.refusal(upstream_message(400, json_or_none(body), body))
        if isinstance(found, window.MaxTokensPastWindow) and found.window < found.asked:
            call.svc.windows[call.route.policy] = found.window
            request = _decode(call.upstream_body)
            call.fit_budget(request)
            call.upstream_body = _encode(request)
            response = await send()
            if response.status_code != 400:
                return response
        elif isinstance(found, window.PromptPastWindow):
            await _refuse(call, found)
        else:
            return Read(response, body)
    return response


async def _refuse(call: Call, found: window.PromptPastWindow) -> None:
    tokens = await _count(call) or found.at_least or found.window + 1
    message = call.surface.errors.too_long(tokens, found.window)
    error = Invalid(message, window.CONTEXT_LENGTH_EXCEEDED)
    await call.commit(call.record(UPSTREAM_ERROR, 400, response=call.surface.error_body(400, message, error.code), error=message))
    raise error


async def _count(call: Call) -> int | None:
    """The prompt's tokens as vLLM's ``/tokenize`` counts them (None where it cannot)."""
    assert call.route is not None
    request = _decode(call.upstream_body)
    ask: dict[str, Any] = {"model": call.route.upstream_model}
    if "messages" in request:
        ask |= {"messages": request["messages"], "add_generation_prompt": True}
        if request.get("tools"):
            ask["tools"] = request["tools"]
    elif isinstance(request.get("prompt"), str):
        ask["prompt"] = request["prompt"]
    else:
        return None
    try:
        upstream = call.svc.upstream
        headers = upstream.request_headers([(b"content-type", b"application/json")], ours=True)
        response, _ = await upstream.send(
            "POST", "/tokenize", content=_encode(ask), headers=headers, sticky=call.filing.trajectory_id, model=call.route.upstream_model
        )
        try:
            body = await response.aread()
        finally:  # a read broken off, or the call cancelled (its client gone): the connection given back all the same
            await response.aclose()
    except UpstreamError:
        return None
    counted = json_or_none(body)
    return counted.get("count") if response.status_code == 200 and isinstance(counted, dict) and isinstance(counted.get("count"), int) else None
