"""The gateway's routing table: a snapshot of the policies, looked up on every call.

The store holds the policies; each gateway keeps them in a ``Registry`` (a dict read per
call) and re-reads the table every ``REFRESH_EVERY_S`` in the background (``follow``), so
a version the trainer switched to is routed to within that time by every gateway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from burnish_server.core.learning.policies import Policy, Route, open_to, resolve
from burnish_server.core.platform.access import ROOT, Principal
from burnish_server.core.platform.errors import NotFound
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

    def resolve(self, model: str | None, trajectory_id: str = "", caller: Principal = ROOT) -> Route | None:
        """Where a call to ``model`` goes; ``NotFound`` (404 model_not_found) for a policy the
        caller's project may not use, as if it did not exist (pinned or not)."""
        route = resolve(self.policies, model, trajectory_id)
        if route is not None and not self.open_to(self.policies[route.policy], caller):
            raise NotFound(f"The model `{model}` does not exist or you do not have access to it.", "model_not_found", "model")
        return route

    @staticmethod
    def open_to(policy: Policy, caller: Principal) -> bool:
        """Whether the caller may call the policy: an admin any, a key its project's and those shared with it."""
        return caller.can("admin") or open_to(policy, caller.project)

    def listed(self, caller: Principal) -> list[Policy]:
        """The policies ``/v1/models`` shows the caller."""
        return [p for p in self.policies.values() if self.open_to(p, caller)]


async def follow(db: Database, registry: Registry, every_s: float = REFRESH_EVERY_S) -> None:
    """Keep ``registry`` in step with the store until cancelled. A failed read keeps the last snapshot."""
    while True:
        await asyncio.sleep(every_s)
        try:
            registry.replace(await db.read(load_policies))
        except Exception as exc:  # the store away for a moment must not stop routing
            log.warning("policies not refreshed: %s", exc)
