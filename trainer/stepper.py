"""One training step of a policy, from claim to record:

    claim groups_per_step ready groups        (store/training.py; all or nothing,
                                               or what is ready when training was asked for)
    calls -> (sequence, advantage) pairs      (trainer/sequences.py; the recorded ids; a call without them is skipped)
    one GRPO step on the LoRA                  (trainer/models.py -> policy_model.py, grpo.py)
    save checkpoint <step>                     (trainer/checkpoints.py; whole or absent)
    record the step: groups trained, metrics, new head             (store/policies.py; now it counts)

A step that fails releases its groups (they wait again) and records nothing. A trainer
killed mid-step loses nothing either: ``recover`` (below) runs at its next start, releases
its own stale claims and sets aside a checkpoint whose step was never recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time

from burnish_server.core.learning.lone import lone_advantages, moved_baselines
from burnish_server.core.learning.policies import Policy
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.settings import Settings
from burnish_server.store.baselines import read_baselines
from burnish_server.store.database import Database
from burnish_server.store.policies import clear_training_request, get_policy, last_step, load_policies
from burnish_server.store.training import claim_groups, group_calls, other_trainer_busy, release_groups
from burnish_server.store.versions import record_step
from burnish_server.telemetry.watchers import Step
from burnish_server.trainer.checkpoints import Checkpoints
from burnish_server.trainer.models import Models
from burnish_server.trainer.sequences import lone_attempts

log = logging.getLogger("burnish.trainer")


class Stepper:
    def __init__(self, settings: Settings, db: Database, checkpoints: Checkpoints, models: Models, worker_id: str) -> None:
        self.settings, self.db, self.checkpoints, self.models, self.worker_id = settings, db, checkpoints, models, worker_id
        self.done = 0

    async def step(self, policy: Policy) -> Step | None:
        """Claim the policy's ready groups and train one step on them, if there are enough."""
        t0 = time.perf_counter()
        requested = policy.train_requested_at is not None
        count = policy.train.groups_per_step
        ids = await self.db.transaction(claim_groups, policy.name, self.worker_id, count, self.settings.trainer_lease, 0 if requested else count)
        if not ids:
            if requested:  # asked for, but the groups went to another trainer
                await self.db.transaction(clear_training_request, policy.name)
            return None
        try:
            # The policy as it is now, not as the pass read it: another trainer may have stepped
            # it since (the claim means no one is mid-step on it now), and a step from a stale
            # head would be recorded but never served.
            policy = await self.db.read(get_policy, policy.name)
            rows = await self.db.read(group_calls, ids)
            step = 1 + await self.db.read(last_step, policy.name)
            # Lone attempts (groups of one) against their kinds' baselines, read before the step moves them.
            attempts = lone_attempts(rows) if policy.train.lone_baseline is not None else {}
            kept = await self.db.read(read_baselines, policy.name) if attempts and policy.train.lone_baseline == "kept" else None
            train = policy.train
            lone = lone_advantages(attempts, kept, scale=train.scale_advantages, eps=train.advantage_eps) if attempts else None
            log.info(
                "%s step %d: claimed %d groups (%d lone attempts rewarded), training from step %d", policy.name, step, len(ids), len(attempts), policy.head
            )
            read_s = time.perf_counter() - t0
            metrics = await asyncio.to_thread(self.models.step, policy, rows, step, lone)
            metrics.seconds_read, metrics.groups = read_s, len(ids)
            checkpoint = str(self.checkpoints.step(policy.name, step))
            moved = moved_baselines(kept, attempts) if kept is not None else None
            became_head = await self.db.transaction(record_step, policy.name, step, policy.head, ids, self.worker_id, metrics, checkpoint, moved)
        except Exception:
            log.exception("step for %s failed; its groups wait again", policy.name)
            await self.db.transaction(release_groups, self.worker_id, ids)
            if self.models.ranks.world > 1:
                raise  # the ranks are out of step (one may be dead): torchrun restarts them all, from the last checkpoint
            self.models.forget(policy.name)  # the in-memory model may hold the failed step
            return None
        if not became_head:
            log.warning("%s was rolled back during step %d: the step is kept but not served", policy.name, step)
        self.done += 1
        return Step(policy.name, step, policy.head, ids, metrics, utcnow())

    async def recover(self) -> None:
        """Clean up after a trainer with this worker id that died mid-step."""
        await self.db.migrate()
        released = await self.db.transaction(release_groups, self.worker_id)
        if released:
            log.info("released %d groups left claimed by an earlier run", released)
        for policy in await self.db.read(load_policies):
            if await self.db.read(other_trainer_busy, policy.name, self.worker_id, self.settings.trainer_lease):
                continue  # another trainer is mid-step on it: what looks unrecorded may be its step
            self.checkpoints.tidy(policy.name, await self.db.read(last_step, policy.name))
