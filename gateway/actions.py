"""What an admin can do to a policy, once for both doors: the admin API (``routes/admin.py``)
and the dashboard's controls (``ui/controls.py``).

Each states intent in the store (the trainer acts on it at its next pass) and re-reads this
gateway's routing table at once; other gateways follow within ``REFRESH_EVERY_S``.
"""

from __future__ import annotations

from typing import Any

from burnish_server.core.errors import Conflict
from burnish_server.core.promotion import Outcome
from burnish_server.gateway.services import Services
from burnish_server.store import policies as store
from burnish_server.store import promotion


async def write(svc: Services, fn: Any, *args: Any) -> Any:
    """A write, then the gateway's own routing table re-read at once."""
    result = await svc.db.transaction(fn, *args)
    svc.policies.replace(await svc.db.read(store.load_policies))
    return result


def _update(conn: Any, name: str, values: dict[str, Any]) -> Any:
    return store.update_policy(conn, name, **values)


async def pause(svc: Services, name: str) -> None:
    """Stop training (the served version stays); a step already running finishes."""
    await write(svc, _update, name, {"paused": True})


async def resume(svc: Services, name: str) -> None:
    await write(svc, _update, name, {"paused": False})


async def train_now(svc: Services, name: str) -> None:
    """Train on the groups ready now, even fewer than groups_per_step (Conflict if paused)."""
    if (await svc.db.read(store.get_policy, name)).paused:
        raise Conflict(f"policy {name!r} is paused; resume it first", "policy_paused")
    await write(svc, store.request_training, name)


async def rollback(svc: Services, name: str, step: int) -> None:
    """Serve (and train on from) an earlier step; 0 is the base model."""
    await write(svc, store.request_rollback, name, step)


def _decide(conn: Any, name: str, decision: Outcome) -> Any:
    store.lock_policy(conn, name)
    return promotion.admin_decide(conn, store.get_policy(conn, name), decision)


async def promote(svc: Services, name: str) -> None:
    """Serve the candidate on trial to every trajectory now (Conflict if there is none)."""
    await write(svc, _decide, name, Outcome.PROMOTED)


async def reject(svc: Services, name: str) -> None:
    """End the candidate's trial: the served version keeps serving (Conflict if there is none)."""
    await write(svc, _decide, name, Outcome.REJECTED)
