"""The trainer process: a loop over the policies, each pass doing five jobs in turn.

    recovery      at start: release this worker's stale claims, set aside an unrecorded checkpoint
                                               (trainer/stepper.py: Stepper.recover)
    publishing    serve each policy's head where it is not served yet (a new step, a rollback,
                  a crash between the two), or put it on trial     (trainer/publisher.py)
    review        end a candidate's trial where its test decides; roll back a regression
                                               (trainer/promoter.py)
    training      claim ready groups, take a step, record it, publish it (trainer/stepper.py)
    catch-up      load into each vLLM replica what it lacks        (trainer/catch_up.py)

and tells whoever watches training (trainer/tracking.py) each step and decision, and the
trackers each version's held-out score. Training and catching up each run until stopped, every
so many seconds (``repeat``).

A trainer killed at any point loses nothing and trains nothing twice: its next start
recovers, and publishing serves a recorded step that was never switched to.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from burnish_server.core.learning.policies import Policy
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.fleet import Fleet
from burnish_server.store.database import Database
from burnish_server.store.evals import any_unscored, settle_unscored
from burnish_server.store.policies import get_policy, load_policies
from burnish_server.trainer.catch_up import CatchUp
from burnish_server.trainer.checkpoints import Checkpoints
from burnish_server.trainer.distributed import Ranks
from burnish_server.trainer.models import Models
from burnish_server.trainer.promoter import Promoter
from burnish_server.trainer.publisher import Publisher, Refusals
from burnish_server.trainer.stepper import Stepper
from burnish_server.trainer.tracking import Tracking
from burnish_server.trainer.turns import Turns

log = logging.getLogger("burnish.trainer")


@dataclass(frozen=True)
class WorkerSettings:
    """Who this trainer is (its claims on groups carry it); what it does is in ``Settings``
    (``trainer_*``)."""

    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")


class TrainerWorker:
    """The trainer's loop over its jobs: recover, then pass after pass, publish, review and step
    each policy, catching the replicas up beside the passes, until stopped."""

    def __init__(self, settings: Settings, worker: WorkerSettings = WorkerSettings(), ranks: Ranks | None = None) -> None:
        self.settings, self.worker = settings, worker
        self.db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        self.checkpoints = Checkpoints(settings.data_path)
        # The models in memory, on this rank and (under torchrun) on every other (trainer/models.py).
        self.fleet = Fleet(settings)
        self.held = Models(settings, self.checkpoints, ranks, Turns(self.fleet, settings.trainer_pause_sampling))
        refusals = Refusals(settings.trainer_publish_retry)
        self.replicas = CatchUp(settings, self.db, self.checkpoints, self.fleet, refusals)
        self.publisher = Publisher(settings, self.db, self.checkpoints, self.fleet, refusals, on_published=self.replicas.soon)
        self.stepper = Stepper(settings, self.db, self.checkpoints, self.held, worker.worker_id)
        self.tracking = Tracking(settings, self.db)
        self.promoter = Promoter(self.db, settings.trainer_review_every, self.tracking.decision)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.recover()
        ranks = self.held.ranks
        log.info("trainer %s started: %s", self.worker.worker_id, f"rank 0 of {ranks.world} ({ranks.parallel})" if ranks.world > 1 else "one rank")

        async def train() -> bool:
            trained = await self.run_once()
            if not trained:
                self.held.keep_alive()
            return trained

        async def catch_up_if_due() -> bool:
            if self.replicas.due:
                try:
                    await self.catch_up()
                except Exception:  # the store or a replica away: the next look tries again
                    log.exception("catching the replicas up failed")
            return False  # looks again after its period, whatever it did

        # Replicas are caught up beside the loop too: a vLLM that restarted mid-step gets the
        # served adapters back within seconds, not after the step (minutes on a CPU).
        beside = asyncio.create_task(repeat(catch_up_if_due, self.settings.trainer_catch_up_every, stop), name="catch-up")
        try:
            await repeat(train, self.settings.trainer_poll_every, stop)
        finally:
            beside.cancel()

    async def run_once(self) -> bool:
        """One pass over the policies: serve what should be served, decide candidates' trials,
        train what is ready. Trained anything?"""
        trained = False
        if await self.db.read(any_unscored):  # held-out trajectories called after their reward
            await self.db.transaction(settle_unscored)
        policies = await self.db.read(load_policies)
        for policy in policies:
            if await self.publisher.pending(policy):  # it may have put a candidate on trial
                policy = await self.db.read(get_policy, policy.name)
            policy = await self.promoter.review(policy)
            # One candidate at a time: the next step waits for its trial's end, so that steps
            # never outrun the evidence that would let any of them serve.
            if not policy.paused and policy.candidate is None:
                trained |= await self.train_once(policy)
        if self.replicas.due:
            await self.catch_up()
        await self.tracking.held_out(policies)
        self.held.unload_idle()
        return trained

    async def train_once(self, policy: Policy) -> bool:
        """A step of the policy if enough of its groups are ready, told to the watchers and published."""
        step = await self.stepper.step(policy)
        if step is None:
            return False
        self.tracking.step(step)
        await self.publisher.pending(await self.db.read(get_policy, policy.name))
        return True

    async def recover(self) -> None:
        await self.stepper.recover()
        await asyncio.to_thread(self.held.turns.release)

    async def catch_up(self) -> None:
        await self.replicas.run()

    async def close(self) -> None:
        self.held.stop()
        await asyncio.to_thread(self.tracking.close)
        self.fleet.close()
        await self.db.dispose()


async def repeat(job: Callable[[], Awaitable[bool]], every: float, stop: asyncio.Event) -> None:
    """``job`` until ``stop`` is set: again at once after a pass that did something (True), else
    after ``every`` seconds, or as soon as ``stop`` is set."""
    while not stop.is_set():
        if not await job():
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass
