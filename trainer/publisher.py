"""Serving a policy's head: load ``<name>@<step>`` into every vLLM replica, check each answers
with it, then switch the policy to it (or put it on trial, under a promotion rule).

Publishing serves a new step, a rollback, and a step a crashed trainer recorded but never
switched to: whenever a policy's head differs from what it serves. A publish that fails
(vLLM away) is recorded in the policy's status and retried every ``trainer_publish_retry``
seconds; the old version keeps serving. A replica that refuses a version is remembered in
``Refusals``, which the catch-up (trainer/catch_up.py) also reads, so that neither hammers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from burnish_server.core.learning.fidelity import Probe, noise_floor
from burnish_server.core.learning.policies import Policy, served_name
from burnish_server.core.learning.promotion import Publishing
from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.adapters import AdapterError, Unfaithful, VLLMAdapters
from burnish_server.serving.fleet import UNREACHABLE, Fleet
from burnish_server.store import versions
from burnish_server.store.database import Database
from burnish_server.trainer.checkpoints import Checkpoints

log = logging.getLogger("burnish.trainer")


class Refusals:
    """Adapters a replica refused to load or answer with: its error, and when."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self.seen: dict[tuple[str, str], tuple[str, float]] = {}  # (replica, adapter) -> (error, when)

    def note(self, url: str, adapter: str, error: object) -> str:
        self.seen[(url, adapter)] = (str(error)[:500], time.monotonic())
        return self.seen[(url, adapter)][0]

    def clear(self, url: str, adapter: str) -> None:
        self.seen.pop((url, adapter), None)

    def recent(self, url: str, adapter: str) -> str | None:
        """The error, if the replica refused the adapter less than ``retry_s`` ago."""
        found = self.seen.get((url, adapter))
        return found[0] if found is not None and time.monotonic() - found[1] < self.retry_s else None


class Publisher:
    def __init__(self, settings: Settings, db: Database, checkpoints: Checkpoints, fleet: Fleet, refusals: Refusals, on_published: Callable[[], None]) -> None:
        self.settings, self.db, self.checkpoints, self.fleet, self.refusals = settings, db, checkpoints, fleet, refusals
        self.on_published = on_published  # the catch-up reports where each replica stands next
        self.failed: dict[str, tuple[int, float]] = {}  # policy -> (step, when its publish failed)

    async def pending(self, policy: Policy) -> bool:
        """Serve the policy's head if it is not served yet; under a promotion rule other than
        immediate, a new step goes on trial instead. Returns whether it published one."""
        if policy.head in (policy.step, policy.candidate):
            return False
        how = await self.db.read(versions.publishing_of, policy)
        if how is Publishing.KEEP:  # a rejected candidate, kept as the head only to train from
            return False
        failed = self.failed.get(policy.name)
        if failed is not None and failed[0] == policy.head and time.monotonic() - failed[1] < self.settings.trainer_publish_retry:
            return False
        version = adapter_name(policy.name, policy.head)
        try:
            seconds = await asyncio.to_thread(self.publish, policy, policy.head)
        except Exception as exc:
            log.error("%s is not served: %s", version, exc)
            self.failed[policy.name] = (policy.head, time.monotonic())
            await self.db.transaction(versions.mark_load_error, policy.name, f"{version}: {exc}")
            return False
        self.failed.pop(policy.name, None)
        if how is Publishing.TRIAL:
            await self.db.transaction(versions.mark_candidate, policy.name, policy.head, seconds)
            log.info("%s is on trial under %s (loaded and checked in %.3fs)", version, policy.promotion.rule, seconds)
        else:
            await self.db.transaction(versions.mark_served, policy.name, policy.head, seconds)
            log.info("%s now serves %s (loaded and checked in %.3fs)", policy.name, version, seconds)
        self.on_published()
        return True

    def publish(self, policy: Policy, step: int) -> float:
        """Load ``<name>@<step>`` into every replica and check that each answers with it; return
        the seconds it took. Step 0 is the base model, always loaded. A replica that cannot be
        reached is left to the catch-up; one that refuses is remembered (and reported). With no
        replica serving it, ``AdapterError``. The caller switches the policy afterwards."""
        t0 = time.perf_counter()
        name = adapter_name(policy.name, step)
        path = self.checkpoints.adapter(policy.name, step) if step > 0 else None

        probe = self.checkpoints.probe(policy.name, step) if step > 0 and self.settings.trainer_fidelity else None
        tolerance = self.settings.trainer_fidelity_tolerance

        def serve(vllm: VLLMAdapters) -> None:
            if path is None:
                return checked(vllm, None, served_name(policy, step))
            vllm.load(name, path)
            try:
                checked(vllm, name, name, probe, tolerance)
            except Unfaithful as exc:  # once more, from the checkpoint: a load that went wrong once may not again
                log.warning("replica %s: %s; loading it again", vllm.url, exc)
                vllm.load(name, path)
                checked(vllm, name, name, probe, tolerance)

        outcomes = self.fleet.each(serve)
        seconds = time.perf_counter() - t0
        served = [url for url, outcome in outcomes.items() if not isinstance(outcome, Exception)]
        for url, outcome in outcomes.items():
            if isinstance(outcome, Exception):
                log.warning("replica %s does not serve %s: %s", url, name, outcome)
                if not isinstance(outcome, UNREACHABLE):
                    self.refusals.note(url, name, outcome)
            else:
                self.refusals.clear(url, name)
        if not served:
            raise AdapterError("; ".join(f"{url}: {outcome}" for url, outcome in outcomes.items()) or "no vLLM replica is known")
        self.fleet.each(lambda vllm: self.unload_old(vllm, policy.name, step) if vllm.url in served else None)
        return seconds

    def unload_old(self, vllm: VLLMAdapters, name: str, serving: int) -> None:
        """Keep the served adapter and the newest others, keep_loaded in all; unload the rest."""
        others = [step for step in vllm.loaded_steps(name) if step != serving]
        for old in others[max(self.settings.trainer_keep_loaded - 1, 0) :]:
            vllm.unload(adapter_name(name, old))


def checked(vllm: VLLMAdapters, loaded: str | None, model: str, probe: Probe | None = None, tolerance: float = 0.0) -> None:
    """``vllm.check(model)``, and where there is a probe, that vLLM answers as the trainer made
    the adapter (``Unfaithful`` if not, past ``tolerance``, or where it is 0 the noise floor of
    the probe's dtype: core/learning/fidelity.py); if either fails, the adapter just
    ``loaded`` is unloaded again, so that no gateway sends calls to a replica that listed it but
    could not answer with it, or would answer with other weights."""
    try:
        vllm.check(model)
        if probe is not None:
            fidelity, floor = vllm.fidelity(model, probe), tolerance or noise_floor(probe)
            if not fidelity.within(floor):
                raise Unfaithful(f"vLLM does not serve {model} as trained: {fidelity}, past the noise floor {floor:.1e}")
            log.info("replica %s serves %s as trained: %s", vllm.url, model, fidelity)
    except Exception:
        if loaded is not None:
            with contextlib.suppress(Exception):
                vllm.unload(loaded)
        raise
