"""Groups that close themselves: every few seconds, each policy's open groups that have seen
no member's call and no reward for its ``group_idle_close_s`` are closed (close_reason
"idle"), so they train (or RULER scores them) without X-Group-Size or POST /close. The lone
attempts that waited as long for their reward are counted as expired (store/lone.py: sweep).

Every gateway runs it; closing is idempotent and skips a group another gateway holds."""

from __future__ import annotations

import asyncio
import logging

from burnish_server.core.platform.clock import utcnow
from burnish_server.gateway.services import Services
from burnish_server.store.lone import sweep
from burnish_server.store.writes import close_idle_groups

log = logging.getLogger("burnish.groups")

# How often to look, at most; a policy idle for less is looked at twice per its time.
EVERY_S = 10.0
LEAST_S = 0.5


async def close_idle(svc: Services) -> None:
    """Until cancelled: close the idle groups of every policy that sets a time."""
    while True:
        idle = {p.name: p.train.group_idle_close_s for p in svc.policies.policies.values() if p.train.group_idle_close_s is not None}
        await asyncio.sleep(max(LEAST_S, min([EVERY_S, *(s / 2 for s in idle.values())])))
        if not idle:
            continue
        try:
            closed = await svc.db.transaction(close_idle_groups, idle)
            expired = await svc.db.transaction(sweep, idle, utcnow())
        except Exception as exc:  # the store away for a moment: try again next time
            log.warning("could not close idle groups: %s", exc)
            continue
        if closed:
            log.info("closed %d idle group(s): %s", len(closed), ", ".join(closed[:10]))
        for policy, n in expired.items():
            log.info("%d lone attempt(s) of %s expired with no reward", n, policy)
