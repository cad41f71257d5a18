"""What the policy pages show of a policy, kept as snapshots refreshed in the background.

A policy's status reads its whole history: the groups ready (every member's reward), the
held-out score of each version (every held-out trajectory's calls), the last groups' ties, the
candidate's evidence. At a million calls that is 0.3 to 1.5 s of the store's time
(bench/dashboard_pages.py), too long to spend on each page view, and the live part of a page
asks again every few seconds. So a page reads a snapshot: computed when a policy is first
viewed, then refreshed every ``EVERY_S`` for as long as someone views it (``KEEP_S``), off the
request path, once per gateway however many pages are open. A control refreshes its policy's
snapshot at once, so the page it redirects to shows what it did.
"""

from __future__ import annotations

import asyncio
import logging
import time

from burnish_server.core.platform.errors import NotFound
from burnish_server.store import controls
from burnish_server.store.controls import Timeline
from burnish_server.store.database import Database

log = logging.getLogger("burnish.gateway")

EVERY_S = 5.0  # as often as a page's live part asks (pages.LIVE_EVERY_S)
KEEP_S = 60.0  # a policy nobody viewed for this long is no longer refreshed
BUSY_SHARE = 0.2  # at most this share of the time spent refreshing


class Statuses:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.snapshots: dict[str, Timeline] = {}
        self.viewed: dict[str, float] = {}

    async def get(self, name: str) -> Timeline:
        self.viewed[name] = time.monotonic()
        found = self.snapshots.get(name)
        return found if found is not None else await self.refresh(name)

    async def refresh(self, name: str) -> Timeline:
        self.snapshots[name] = snapshot = await self.db.read(controls.timeline, name)
        return snapshot

    async def run(self, every_s: float = EVERY_S) -> None:
        """Refresh the snapshots of the policies viewed lately, until cancelled. A pass that
        took long waits longer (``BUSY_SHARE``): on a big store the refresh never takes more than
        a fifth of the store's time, and the snapshots are older instead."""
        took = 0.0
        while True:
            await asyncio.sleep(max(every_s, took * (1 / BUSY_SHARE - 1)))
            now = time.monotonic()
            for name, seen in list(self.viewed.items()):
                if now - seen > KEEP_S:
                    del self.viewed[name]
                    self.snapshots.pop(name, None)
                    continue
                try:
                    await self.refresh(name)
                except NotFound:  # deleted: nothing to show
                    self.viewed.pop(name, None)
                    self.snapshots.pop(name, None)
                except Exception as exc:  # the store away for a moment: keep the last snapshot
                    log.warning("dashboard: status of %s not refreshed: %s", name, exc)
            took = time.monotonic() - now
