"""The trainer process: claim ready groups, take a GRPO step, publish the adapter to vLLM.

One iteration, for each policy in the store that is not paused:

    claim groups_per_step ready groups        (store/training.py; all or nothing,
                                               or what is ready when training was asked for)
    calls -> (sequence, advantage) pairs      (trainer/sequences.py; the recorded ids; a call without them is skipped)
    one GRPO step on the LoRA                  (trainer/policy_model.py, trainer/grpo.py)
    save checkpoint <step>                     (trainer/checkpoints.py; whole or absent)
    record the step: groups trained, metrics, new head             (store/policies.py; now it counts)
    load it into every vLLM replica as <name>@<step>, check each answers, then switch the policy to it
                                               (serving/fleet.py, serving/adapters.py)

Publishing also serves a rollback: whenever a policy's head (what should be served)
differs from its step (what is), the head is loaded, checked and switched to.

A trainer killed at any point loses nothing and trains nothing twice: at start it
releases its own stale claims, sets aside a checkpoint whose step was never recorded
(its groups wait again), and publishes a recorded step that was never switched to. A
publish that fails (vLLM away) is recorded in the policy's status and retried every
``publish_retry_s``; the old version keeps serving.

With several replicas, a version is switched to once every replica that can be reached has
loaded it and answered with it. A replica that refuses it is reported in the policy's
``replicas`` and, not listing the version, gets none of its calls from the gateways
(``core/replicas.py``). Every ``catch_up_s`` the trainer looks at each replica and loads
what it lacks: the served version, and the others the replicas hold (pinned calls may ask
for them). So a replica that joins, or comes back empty after a restart, serves the
policy again within seconds, and gets its calls only from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field

from burnish_server.core.policies import Policy, adapter_name, served_name
from burnish_server.core.promotion import DecisionRecord
from burnish_server.core.settings import Settings
from burnish_server.core.views import ReplicaView
from burnish_server.serving.adapters import AdapterError, VLLMAdapters, steps_of
from burnish_server.serving.fleet import UNREACHABLE, Fleet
from burnish_server.store import promotion
from burnish_server.store.database import Database
from burnish_server.store.evals import Score, scores_by_step
from burnish_server.store.models import iso, utcnow
from burnish_server.store.policies import clear_training_request, get_policy, last_step, load_policies, mark_load_error, mark_replicas, mark_served, record_step
from burnish_server.store.training import claim_groups, group_calls, other_trainer_busy, release_groups
from burnish_server.telemetry.langfuse_export import LangfuseExport
from burnish_server.telemetry.trackers import Trackers
from burnish_server.telemetry.watchers import Decision, Step, Watchers
from burnish_server.trainer.checkpoints import Checkpoints
from burnish_server.trainer.distributed import Ranks
from burnish_server.trainer.models import Models
from burnish_server.trainer.promoter import Promoter

log = logging.getLogger("burnish.trainer")


@dataclass(frozen=True)
class WorkerSettings:
    """Who this trainer is (its claims on groups carry it); what it does is in ``Settings``
    (``trainer_*``)."""

    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")


class TrainerWorker:
    def __init__(self, settings: Settings, worker: WorkerSettings = WorkerSettings(), ranks: Ranks | None = None) -> None:
        self.settings, self.worker = settings, worker
        self.db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        self.checkpoints = Checkpoints(settings.data_path)
        # The models in memory, on this rank and (under torchrun) on every other (trainer/models.py).
        self.held = Models(settings, self.checkpoints, ranks)
        self.fleet = Fleet(settings)
        self.steps_done = 0
        self.failed_publish: dict[str, tuple[int, float]] = {}  # policy -> (step, when it failed)
        self.refused: dict[tuple[str, str], tuple[str, float]] = {}  # (replica, adapter) -> (its error, when)
        self.replica_views: dict[str, list[ReplicaView]] = {}  # policy -> as last written to the store
        self.caught_up_at = float("-inf")
        # W&B, MLflow, TensorBoard, those configured. This worker runs on rank 0 alone (the other
        # ranks follow it: cli/main.py), so each step is logged once.
        self.trackers = Trackers.from_settings(settings)
        # Each step and decision to Langfuse (as events, when keys are set) and the trackers.
        self.watchers = Watchers([LangfuseExport.from_settings(settings), self.trackers])
        self.tracked: dict[tuple[str, int], Score] = {}  # (policy, step) -> held-out score as last logged
        self.tracked_at = float("-inf")
        self.promoter = Promoter(self.db, settings.trainer_review_every, self.record_decision)

    async def policies(self) -> list[Policy]:
        return await self.db.read(load_policies)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.recover()
        ranks = self.held.ranks
        log.info("trainer %s started: %s", self.worker.worker_id, f"rank 0 of {ranks.world} ({ranks.parallel})" if ranks.world > 1 else "one rank")
        while not stop.is_set():
            if not await self.run_once():
                self.held.keep_alive()
                try:
                    await asyncio.wait_for(stop.wait(), self.settings.trainer_poll_every)
                except TimeoutError:
                    pass

    async def run_once(self) -> bool:
        """One pass over the policies: serve what should be served, decide candidates' trials,
        train what is ready. Trained anything?"""
        trained = False
        policies = await self.policies()
        for policy in policies:
            if await self.publish_pending(policy):  # it may have put a candidate on trial
                policy = await self.db.read(get_policy, policy.name)
            policy = await self.promoter.review(policy)
            # One candidate at a time: the next step waits for its trial's end, so that steps
            # never outrun the evidence that would let any of them serve.
            if not policy.paused and policy.candidate is None:
                trained |= await self.train_once(policy)
        if time.monotonic() - self.caught_up_at >= self.settings.trainer_catch_up_every:
            await self.catch_up()
        if self.trackers is not None and time.monotonic() - self.tracked_at >= self.settings.trackers_eval_every:
            await self.track_held_out(self.trackers, policies)
        self.held.unload_idle()
        return trained

    async def close(self) -> None:
        self.held.stop()
        await asyncio.to_thread(self.watchers.close)
        self.fleet.close()
        await self.db.dispose()

    async def recover(self) -> None:
        """Clean up after a trainer with this worker id that died mid-step."""
        await self.db.migrate()
        released = await self.db.transaction(release_groups, self.worker.worker_id)
        if released:
            log.info("released %d groups left claimed by an earlier run", released)
        for policy in await self.policies():
            if await self.db.read(other_trainer_busy, policy.name, self.worker.worker_id, self.settings.trainer_lease):
                continue  # another trainer is mid-step on it: what looks unrecorded may be its step
            self.checkpoints.tidy(policy.name, await self.db.read(last_step, policy.name))

    async def publish_pending(self, policy: Policy) -> bool:
        """Serve the policy's head if it is not served yet (a new step, a rollback, a crash between
        the two); under a promotion rule other than immediate, a new step goes on trial instead.
        Returns whether it published one."""
        if policy.head in (policy.step, policy.candidate):
            return False
        trial = await self.db.read(promotion.goes_on_trial, policy)
        if trial is None:  # a rejected candidate, kept as the head only to train from
            return False
        failed = self.failed_publish.get(policy.name)
        if failed is not None and failed[0] == policy.head and time.monotonic() - failed[1] < self.settings.trainer_publish_retry:
            return False
        try:
            seconds = await asyncio.to_thread(self.publish, policy, policy.head)
        except Exception as exc:
            log.error("%s@%d is not served: %s", policy.name, policy.head, exc)
            self.failed_publish[policy.name] = (policy.head, time.monotonic())
            await self.db.transaction(mark_load_error, policy.name, f"{policy.name}@{policy.head}: {exc}")
            return False
        self.failed_publish.pop(policy.name, None)
        if trial:
            await self.db.transaction(promotion.mark_candidate, policy.name, policy.head, seconds)
            log.info("%s@%d is on trial under %s (loaded and checked in %.3fs)", policy.name, policy.head, policy.promotion.rule, seconds)
        else:
            await self.db.transaction(mark_served, policy.name, policy.head, seconds)
            log.info("%s now serves %s@%d (loaded and checked in %.3fs)", policy.name, policy.name, policy.head, seconds)
        self.caught_up_at = float("-inf")  # report where each replica stands at the next pass
        return True

    def record_decision(self, policy: str, step: int, record: DecisionRecord) -> None:
        self.watchers.decision(Decision(policy, step, record))

    async def track_held_out(self, trackers: Trackers, policies: list[Policy]) -> None:
        """Each version's held-out score to the trackers, when it is new or changed (more eval
        trajectories rewarded) since it was last logged."""
        self.tracked_at = time.monotonic()
        for policy in policies:
            for step, score in (await self.db.read(scores_by_step, policy.name)).items():
                if self.tracked.get((policy.name, step)) != score:
                    self.tracked[(policy.name, step)] = score
                    trackers.held_out(policy.name, step, score.score, score.trajectories)

    async def train_once(self, policy: Policy) -> bool:
        t0 = time.perf_counter()
        requested = policy.train_requested_at is not None
        count = policy.train.groups_per_step
        ids = await self.db.transaction(claim_groups, policy.name, self.worker.worker_id, count, self.settings.trainer_lease, 1 if requested else count)
        if not ids:
            if requested:  # asked for, but the groups went to another trainer
                await self.db.transaction(clear_training_request, policy.name)
            return False
        try:
            # The policy as it is now, not as this pass read it: another trainer may have stepped
            # it since (the claim means no one is mid-step on it now), and a step from a stale
            # head would be recorded but never served.
            policy = await self.db.read(get_policy, policy.name)
            rows = await self.db.read(group_calls, ids)
            step = 1 + await self.db.read(last_step, policy.name)
            log.info("%s step %d: claimed %d groups, training from step %d", policy.name, step, len(ids), policy.head)
            read_s = time.perf_counter() - t0
            metrics = await asyncio.to_thread(self.held.step, policy, rows, step)
            metrics.seconds_read, metrics.groups = read_s, len(ids)
            became_head = await self.db.transaction(
                record_step, policy.name, step, policy.head, ids, self.worker.worker_id, metrics, str(self.checkpoints.step(policy.name, step))
            )
        except Exception:
            log.exception("step for %s failed; its groups wait again", policy.name)
            await self.db.transaction(release_groups, self.worker.worker_id, ids)
            if self.held.ranks.world > 1:
                raise  # the ranks are out of step (one may be dead): torchrun restarts them all, from the last checkpoint
            self.held.forget(policy.name)  # the in-memory model may hold the failed step
            return False
        if not became_head:
            log.warning("%s was rolled back during step %d: the step is kept but not served", policy.name, step)
        self.watchers.step(Step(policy.name, step, policy.head, ids, metrics, utcnow()))
        self.steps_done += 1
        await self.publish_pending(await self.db.read(get_policy, policy.name))
        return True

    def publish(self, policy: Policy, step: int) -> float:
        """Load ``<name>@<step>`` into every replica and check that each answers with it; return
        the seconds it took. Step 0 is the base model, always loaded. A replica that cannot be
        reached is left to ``catch_up``; one that refuses is remembered (and reported). With no
        replica serving it, ``AdapterError``. The caller switches the policy afterwards."""
        t0 = time.perf_counter()
        name = adapter_name(policy.name, step)
        path = self.checkpoints.adapter(policy.name, step) if step > 0 else None

        def serve(vllm: VLLMAdapters) -> None:
            if path is not None:
                vllm.load(name, path)
            checked(vllm, name if path is not None else None, served_name(policy, step))

        outcomes = self.fleet.each(serve)
        seconds = time.perf_counter() - t0
        served = [url for url, outcome in outcomes.items() if not isinstance(outcome, Exception)]
        for url, outcome in outcomes.items():
            if isinstance(outcome, Exception):
                log.warning("replica %s does not serve %s: %s", url, name, outcome)
                if not isinstance(outcome, UNREACHABLE):
                    self.refused[(url, name)] = (str(outcome)[:500], time.monotonic())
            else:
                self.refused.pop((url, name), None)
        if not served:
            raise AdapterError("; ".join(f"{url}: {outcome}" for url, outcome in outcomes.items()) or "no vLLM replica is known")
        self.fleet.each(lambda vllm: self.unload_old(vllm, policy.name, step) if vllm.url in served else None)
        return seconds

    def unload_old(self, vllm: VLLMAdapters, name: str, serving: int) -> None:
        """Keep the served adapter and the newest others, keep_loaded in all; unload the rest."""
        others = [step for step in vllm.loaded_steps(name) if step != serving]
        for old in others[max(self.settings.trainer_keep_loaded - 1, 0) :]:
            vllm.unload(adapter_name(name, old))

    async def catch_up(self) -> None:
        """Load into each replica what it lacks, and record where each stands per policy."""
        self.caught_up_at = time.monotonic()
        policies = await self.policies()
        if not policies:
            return
        views = await asyncio.to_thread(self.catch_up_replicas, policies)
        for policy in policies:
            view = views.get(policy.name, [])
            if [_standing(v) for v in view] != [_standing(v) for v in self.replica_views.get(policy.name, [])]:
                await self.db.transaction(mark_replicas, policy.name, view)
                self.replica_views[policy.name] = view

    def catch_up_replicas(self, policies: list[Policy]) -> dict[str, list[ReplicaView]]:
        """For each policy, the versions it should have everywhere: the served one, and those any
        replica holds (keep_loaded newest in all, with their checkpoints on disk). Each reachable
        replica loads the ones it lacks; what it holds then is its view."""
        listed = self.fleet.each(lambda vllm: vllm.model_ids())
        reachable = {url: ids for url, ids in listed.items() if not isinstance(ids, Exception)}
        wanted: dict[str, list[int]] = {}
        for policy in policies:
            held = {step for ids in reachable.values() for step in steps_of(policy.name, ids)}
            steps = sorted(held | ({policy.step} if policy.step > 0 else set()), reverse=True)[: self.settings.trainer_keep_loaded]
            wanted[policy.name] = [s for s in steps if self.checkpoints.adapter(policy.name, s).exists()]

        def bring(vllm: VLLMAdapters) -> dict[str, tuple[list[int], str | None]]:
            ids = reachable[vllm.url]
            out: dict[str, tuple[list[int], str | None]] = {}
            for policy in policies:
                holds = set(steps_of(policy.name, ids))
                error = None
                for step in wanted[policy.name]:
                    name = adapter_name(policy.name, step)
                    if step in holds:
                        continue
                    refused = self.refused.get((vllm.url, name))
                    if refused is not None and time.monotonic() - refused[1] < self.settings.trainer_publish_retry:
                        error = error or refused[0]
                        continue
                    try:
                        vllm.load(name, self.checkpoints.adapter(policy.name, step))
                        if step == policy.step:
                            checked(vllm, name, name)
                    except UNREACHABLE:
                        raise
                    except Exception as exc:
                        self.refused[(vllm.url, name)] = (str(exc)[:500], time.monotonic())
                        error = error or str(exc)[:500]
                        continue
                    log.info("replica %s caught up: it now serves %s", vllm.url, name)
                    self.refused.pop((vllm.url, name), None)
                    holds.add(step)
                out[policy.name] = (sorted(holds, reverse=True), error)
            return out

        brought = self.fleet.each(lambda vllm: bring(vllm) if vllm.url in reachable else {})
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

    def _keep_since(self, policy: str, rows: list[ReplicaView]) -> list[ReplicaView]:
        """A replica standing as before keeps the time it came to stand so."""
        before = {v.url: v for v in self.replica_views.get(policy, [])}
        out = []
        for row in rows:
            old = before.get(row.url)
            same = old is not None and _standing(old) == _standing(row)
            out.append(old if same and old is not None else row)
        return out


def checked(vllm: VLLMAdapters, loaded: str | None, model: str) -> None:
    """``vllm.check(model)``; if it fails, the adapter just ``loaded`` is unloaded again, so that
    no gateway sends calls to a replica that listed it but could not answer with it."""
    try:
        vllm.check(model)
    except Exception:
        if loaded is not None:
            with contextlib.suppress(Exception):
                vllm.unload(loaded)
        raise


def _standing(view: ReplicaView) -> tuple[object, ...]:
    """Where a replica stands, whenever it was seen so."""
    return (view.url, view.reachable, view.steps, view.serving, view.error)
