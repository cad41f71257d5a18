"""Replicas caught up: every ``trainer_catch_up_every`` seconds the trainer looks at each vLLM
replica and loads what it lacks, the served version and the others the replicas hold (pinned
calls may ask for them), and records where each stands per policy.

So a replica that joins, or comes back empty after a restart, serves the policy again within
seconds, and gets its calls only from then on: one that does not list the served version gets
none of the policy's calls from the gateways (``core/platform/replicas.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from burnish_server.core.api.views import ReplicaView
from burnish_server.core.learning.policies import Policy
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.adapters import VLLMAdapters, steps_of
from burnish_server.serving.fleet import UNREACHABLE, Fleet
from burnish_server.store.database import Database
from burnish_server.store.models import iso
from burnish_server.store.policies import load_policies, mark_replicas
from burnish_server.trainer.checkpoints import Checkpoints
from burnish_server.trainer.publisher import Refusals, checked

log = logging.getLogger("burnish.trainer")


class CatchUp:
    def __init__(self, settings: Settings, db: Database, checkpoints: Checkpoints, fleet: Fleet, refusals: Refusals) -> None:
        self.settings, self.db, self.checkpoints, self.fleet, self.refusals = settings, db, checkpoints, fleet, refusals
        self.views: dict[str, list[ReplicaView]] = {}  # policy -> as last written to the store
        self.done_at = float("-inf")
        self.lock = asyncio.Lock()  # the worker's loop and its catch-up beside it: one at a time

    def soon(self) -> None:
        """Look again at the next pass (a version was just published)."""
        self.done_at = float("-inf")

    @property
    def due(self) -> bool:
        return time.monotonic() - self.done_at >= self.settings.trainer_catch_up_every

    async def run(self) -> None:
        """Load into each replica what it lacks, and record where each stands per policy."""
        async with self.lock:
            await self._run()

    async def _run(self) -> None:
        self.done_at = time.monotonic()
        policies = await self.db.read(load_policies)
        if not policies:
            return
        views = await asyncio.to_thread(self.bring_all, policies)
        for policy in policies:
            view = views.get(policy.name, [])
            if [_standing(v) for v in view] != [_standing(v) for v in self.views.get(policy.name, [])]:
                await self.db.transaction(mark_replicas, policy.name, view)
                self.views[policy.name] = view

    def bring_all(self, policies: list[Policy]) -> dict[str, list[ReplicaView]]:
        """For each policy, the versions it should have everywhere: the served one, and those any
        replica holds (keep_loaded newest in all, with their checkpoints on disk). Each reachable
        replica loads the ones it lacks; what it holds then is its view."""
        listed = self.fleet.each(lambda vllm: vllm.model_ids())
        reachable = {url: ids for url, ids in listed.items() if not isinstance(ids, Exception)}
        wanted: dict[str, list[int]] = {}
        for policy in policies:
            held = {step for ids in reachable.values() for step in steps_of(policy.name, ids)}
            # The served version and the candidate on trial first, then the newest others it held.
            first = [s for s in (policy.step, policy.candidate) if s]
            steps = [*first, *sorted(held - set(first), reverse=True)][: max(self.settings.trainer_keep_loaded, len(first))]
            wanted[policy.name] = [s for s in steps if self.checkpoints.adapter(policy.name, s).exists()]
        brought = self.fleet.each(lambda vllm: self.bring(vllm, reachable[vllm.url], policies, wanted) if vllm.url in reachable else {})
        now = iso(utcnow())
        views: dict[str, list[ReplicaView]] = {}
        for policy in policies:
            rows = []
            for url in listed:
                result = brought.get(url)
                if url not in reachable or isinstance(result, Exception) or result is None or policy.name not in result:
                    rows.append(ReplicaView(url=url, reachable=False, steps=[], serving=False, since=now))
                    continue
                steps, error = result[policy.name]
                rows.append(ReplicaView(url=url, reachable=True, steps=steps, serving=policy.step == 0 or policy.step in steps, error=error, since=now))
            views[policy.name] = self._keep_since(policy.name, rows)
        return views

    def bring(self, vllm: VLLMAdapters, ids: list[str], policies: list[Policy], wanted: dict[str, list[int]]) -> dict[str, tuple[list[int], str | None]]:
        """One replica (listing ``ids``): load each policy's wanted versions it lacks. Per policy,
        the steps it then holds and the error of one it refused, if any."""
        out: dict[str, tuple[list[int], str | None]] = {}
        for policy in policies:
            holds = set(steps_of(policy.name, ids))
            error = None
            for step in wanted[policy.name]:
                name = adapter_name(policy.name, step)
                if step in holds:
                    continue
                refused = self.refusals.recent(vllm.url, name)
                if refused is not None:
                    error = error or refused
                    continue
                try:  # every version loaded is checked, the served one and those kept for pinned calls alike
                    vllm.load(name, self.checkpoints.adapter(policy.name, step))
                    probe = self.checkpoints.probe(policy.name, step) if self.settings.trainer_fidelity else None
                    checked(vllm, name, name, probe, self.settings.trainer_fidelity_tolerance)
                except UNREACHABLE:
                    raise
                except Exception as exc:
                    noted = self.refusals.note(vllm.url, name, exc)
                    error = error or noted
                    continue
                log.info("replica %s caught up: it now serves %s", vllm.url, name)
                self.refusals.clear(vllm.url, name)
                holds.add(step)
            out[policy.name] = (sorted(holds, reverse=True), error)
        return out

    def _keep_since(self, policy: str, rows: list[ReplicaView]) -> list[ReplicaView]:
        """A replica standing as before keeps the time it came to stand so."""
        before = {v.url: v for v in self.views.get(policy, [])}
        out = []
        for row in rows:
            old = before.get(row.url)
            same = old is not None and _standing(old) == _standing(row)
            out.append(old if same and old is not None else row)
        return out


def _standing(view: ReplicaView) -> tuple[object, ...]:
    """Where a replica stands, whenever it was seen so."""
    return (view.url, view.reachable, view.steps, view.serving, view.error)
