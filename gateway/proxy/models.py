"""``GET /v1/models`` through the gateway: the caller's policies listed first, then what the
upstream serves, without another project's adapters."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from litestar.response.base import ASGIResponse

from burnish_server.core.platform.access import ANONYMOUS, Principal
from burnish_server.core.platform.errors import UpstreamError
from burnish_server.gateway.proxy.call import json_or_none
from burnish_server.gateway.services import Services
from burnish_server.gateway.upstream.client import failed, response_headers

_encode = msgspec.json.Encoder().encode


async def list_models(svc: Services, caller: Principal, request_headers: Iterable[tuple[bytes, bytes]]) -> ASGIResponse:
    """The caller's policies, then the upstream's models (another project's adapters left out)."""
    headers = svc.upstream.request_headers(request_headers, ours=caller is not ANONYMOUS)
    response, _ = await svc.upstream.send("GET", "/v1/models", content=None, headers=headers)
    try:
        raw = await response.aread()
    except UpstreamError as exc:
        raise failed(exc, "the upstream broke off its answer") from exc
    finally:
        await response.aclose()
    listing = json_or_none(raw)
    if response.status_code == 200 and isinstance(listing, dict) and isinstance(listing.get("data"), list) and svc.policies.policies:
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
