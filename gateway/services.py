"""What a request handler needs, built once per app by its lifespan and kept on ``app.state``.

JSON API handlers receive it by dependency injection (``svc: Services``, see
``routes/common.py``); the proxy, on the hot path, reads it from ``app.state`` (``gateway/edge/entry.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from litestar.connection import ASGIConnection

from burnish_server.core.platform.secrets import Redactor
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.access.admission import Access
from burnish_server.gateway.edge.metrics import Metrics
from burnish_server.gateway.policies.routing import Registry
from burnish_server.gateway.proxy.departure import Waiting
from burnish_server.gateway.upstream.client import Upstream
from burnish_server.store.database import Database, full
from burnish_server.store.writer import Writer
from burnish_server.telemetry.langfuse_export import LangfuseExport


@dataclass(slots=True)
class Services:
    settings: Settings
    db: Database
    writer: Writer
    upstream: Upstream
    policies: Registry
    # For RULER's judge, which may be another server than the upstream.
    judge_http: httpx.AsyncClient
    metrics: Metrics
    access: Access
    # Masks the configured secrets in the upstream's error answers (core/platform/secrets.py).
    redact: Redactor
    # None unless the Langfuse keys are set.
    langfuse: LangfuseExport | None = None
    # Proxied calls being served now (gateway/edge/entry.py): a lone one commits its record at once.
    in_flight: int = 0
    # Each policy's served window in tokens, learned from the upstream's refusals (gateway/proxy/window.py).
    windows: dict[str, int] = field(default_factory=dict)
    # The proxied calls waiting on the upstream, whose clients are watched (gateway/proxy/departure.py).
    waiting: Waiting = field(default_factory=Waiting)

    def store_warning(self) -> str | None:
        """What is wrong with the store now, in a line, or None: its writes failing (since when,
        and why: "store full" for a full disk), or less free space than its WAL may need.
        ``/health``, ``burnish status`` and the dashboard's every page show it."""
        if self.writer.failing is not None:
            error, since = self.writer.failing
            failing = f"failing since {datetime.fromtimestamp(since, UTC).isoformat(timespec='seconds')}: {error}"
            return f"store full: {failing}" if full(error) else failing
        room = self.db.room()
        return room.said() if room is not None and room.short else None


def services(connection: ASGIConnection) -> Services:
    return connection.app.state.services
