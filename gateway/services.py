"""What a request handler needs, built once per app by its lifespan and kept on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from litestar.connection import ASGIConnection

from gateway.langfuse_export import LangfuseExport
from gateway.metrics import Metrics
from gateway.policies import Registry
from gateway.settings import Settings
from gateway.store.database import Database
from gateway.store.writer import Writer
from gateway.upstream import Upstream


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
    # None unless the Langfuse keys are set.
    langfuse: LangfuseExport | None = None


def services(connection: ASGIConnection) -> Services:
    return connection.app.state.services
