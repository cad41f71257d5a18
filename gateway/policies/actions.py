"""What an admin can do to a policy, once for both doors: the admin API (``routes/admin.py``)
and the dashboard's controls (``ui/controls.py``).

Each states intent in the store (the trainer acts on it at its next pass) and re-reads this
gateway's routing table at once; other gateways follow within ``REFRESH_EVERY_S``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from burnish_server.core.learning.promotion import Outcome
from burnish_server.core.platform.errors import Conflict
from burnish_server.gateway.services import Services
from burnish_server.store import controls, versions
from burnish_server.store import policies as store

T = TypeVar("T")


async def write(svc: Services, fn: Callable[..., T], *args: Any) -> T:
    """A write (a function of the store's, run in one transaction), then the gateway's own routing table re-read at once."""
    result = await svc.db.transaction(fn, *args)
    svc.policies.replace(await svc.db.read(store.load_policies))
    return result


async def pause(svc: Services, name: str) -> None:
    """Stop training (the served version stays); a step already running finishes."""
    await write(svc, functools.partial(store.update_policy, paused=True), name)


async def resume(svc: Services, name: str) -> None:
    await write(svc, functools.partial(store.update_policy, paused=False), name)


async def train_now(svc: Services, name: str) -> None:
    """Train on the groups ready now, even fewer than groups_per_step (Conflict if paused)."""
    if (await svc.db.read(store.get_policy, name)).paused:
        raise Conflict(f"policy {name!r} is paused; resume it first", "policy_paused")
    await write(svc, store.request_training, name)


async def rollback(svc: Services, name: str, step: int) -> None:
    """Serve (and train on from) an earlier step; 0 is the base model."""
    await write(svc, versions.request_rollback, name, step)


async def promote(svc: Services, name: str) -> None:
    """Serve the candidate on trial to every trajectory now (Conflict if there is none)."""
    await write(svc, controls.decide, name, Outcome.PROMOTED)


async def reject(svc: Services, name: str) -> None:
    """End the candidate's trial: the served version keeps serving (Conflict if there is none)."""
    await write(svc, controls.decide, name, Outcome.REJECTED)
