"""The gateway's routing table: a snapshot of the policies, looked up on every call.

The store holds the policies; each gateway keeps them in a ``Registry`` (a dict read per
call) and re-reads the table every ``REFRESH_EVERY_S`` in the background (``follow``), so
a version the trainer switched to is routed to within that time by every gateway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from burnish_server.core.policies import Policy, Route, resolve
from burnish_server.store.database import Database
from burnish_server.store.policies import load_policies

log = logging.getLogger("burnish.gateway")

# How often a gateway re-reads the policies table: the most a new version waits to be routed to.
# A constant: part of the adapter swap's budget (under 1 s), and a read of one small table.
REFRESH_EVERY_S = 0.25


class Registry:
    """The gateway's snapshot of the policies, looked up on every call (a dict read)."""

    def __init__(self, policies: Iterable[Policy] = ()) -> None:
        self.policies: dict[str, Policy] = {p.name: p for p in policies}

    def replace(self, policies: Iterable[Policy]) -> None:
        self.policies = {p.name: p for p in policies}

    def resolve(self, model: str | None, trajectory_id: str = "") -> Route | None:
        return resolve(self.policies, model, trajectory_id)


async def follow(db: Database, registry: Registry, every_s: float = REFRESH_EVERY_S) -> None:
    """Keep ``registry`` in step with the store until cancelled. A failed read keeps the last snapshot."""
    while True:
        await asyncio.sleep(every_s)
        try:
            registry.replace(await db.read(load_policies))
        except Exception as exc:  # the store away for a moment must not stop routing
            log.warning("policies not refreshed: %s", exc)
