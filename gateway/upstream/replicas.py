"""Keeping a gateway's picture of the replicas current: who is up, what each serves.

With several replicas (or discovery), ``watch`` runs beside the app: every
``upstream_health_every`` seconds it asks each replica for ``/v1/models``, in parallel. A
replica that answers is healthy and serves what it lists (the base model and each LoRA
adapter loaded in it); one that does not is down, and gets no calls while another is up.
The proxy marks a replica down at once when a call cannot reach it (``client.py``); this
brings it back. With ``upstream_discover`` the list itself is re-resolved every
``upstream_discover_every`` seconds.

One upstream and no discovery: nothing to choose, so nothing runs.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from burnish_server.core.platform.errors import BurnishError
from burnish_server.core.platform.replicas import Replica, ReplicaSet
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.upstream.client import Upstream
from burnish_server.serving.discovery import upstreams

log = logging.getLogger("burnish.gateway")

# Seconds a health check may take before the replica counts as down.
CHECK_TIMEOUT_S = 2.0


class _Model(msgspec.Struct):
    id: str


class _Models(msgspec.Struct):
    data: list[_Model]


_decode_models = msgspec.json.Decoder(_Models).decode


def watched(settings: Settings) -> bool:
    return bool(settings.upstream_discover) or len(upstreams(settings)) > 1


def initial(settings: Settings) -> ReplicaSet:
    """The replicas a gateway starts with (none yet if discovery fails: ``watch`` retries)."""
    try:
        urls = upstreams(settings)
    except OSError as exc:
        log.warning("upstream_discover: %s; no replica until it resolves", exc)
        urls = ()
    return ReplicaSet(urls, settings.upstream_balance)


async def check(upstream: Upstream, replica: Replica, headers: list[tuple[bytes, bytes]]) -> None:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):  # the whole exchange, connecting included
            response = await upstream.request("GET", replica.url, "/v1/models", None, headers, timeout=CHECK_TIMEOUT_S)
            try:
                body = await response.aread()
            finally:
                await response.aclose()
    except (BurnishError, OSError) as exc:  # an upstream error, or a header refused
        if replica.healthy:
            log.warning("replica %s is down: %s", replica.url, exc or type(exc).__name__)
        replica.healthy = False
        return
    if response.status_code >= 500:
        replica.healthy = False
        return
    if not replica.healthy:
        log.info("replica %s is up", replica.url)
    replica.healthy = True
    try:
        replica.models = frozenset(m.id for m in _decode_models(body).data) if response.status_code == 200 else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        replica.models = None  # an upstream that does not list its models serves whatever it is asked


async def check_all(settings: Settings, upstream: Upstream) -> None:
    headers = [(b"authorization", f"Bearer {settings.upstream_api_key}".encode())] if settings.upstream_api_key else []
    await asyncio.gather(*(check(upstream, r, headers) for r in upstream.replicas.replicas))


async def watch(settings: Settings, upstream: Upstream) -> None:
    """Check every replica until cancelled (and re-resolve the list, with discovery)."""
    replicas = upstream.replicas
    resolved_at = time.monotonic()
    while True:
        if settings.upstream_discover and (not replicas.replicas or time.monotonic() - resolved_at >= settings.upstream_discover_every):
            resolved_at = time.monotonic()
            try:
                urls = await asyncio.to_thread(upstreams, settings)
            except OSError as exc:
                log.warning("upstream_discover: %s; keeping the %d replicas known", exc, len(replicas.replicas))
            else:
                if urls != tuple(r.url for r in replicas.replicas):
                    log.info("replicas now: %s", ", ".join(urls))
                replicas.update(urls)
        await check_all(settings, upstream)
        await asyncio.sleep(settings.upstream_health_every)
