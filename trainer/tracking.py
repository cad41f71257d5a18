"""Who watches training, told by the trainer worker (trainer/worker.py): each step and decision
to Langfuse and the trackers (telemetry/watchers.py), and each version's held-out score to the
trackers, when it is new or changed.

The trainer worker runs on rank 0 alone (the other ranks follow it: cli/main.py), so each is
told once.
"""

from __future__ import annotations

import time

from burnish_server.core.learning.policies import Policy
from burnish_server.core.learning.promotion import DecisionRecord
from burnish_server.core.platform.settings import Settings
from burnish_server.store.database import Database
from burnish_server.store.evals import Score, scores_by_step
from burnish_server.telemetry.langfuse_export import LangfuseExport
from burnish_server.telemetry.trackers import Trackers
from burnish_server.telemetry.watchers import Decision, Step, Watchers


class Tracking:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.db = db
        self.eval_every = settings.trackers_eval_every
        self.trackers = Trackers.from_settings(settings)  # W&B, MLflow, TensorBoard, those configured
        # Each step and decision to Langfuse (as events, when keys are set) and the trackers.
        self.watchers = Watchers([LangfuseExport.from_settings(settings), self.trackers])
        self.logged: dict[tuple[str, int], Score] = {}  # (policy, step) -> held-out score as last logged
        self.logged_at = float("-inf")

    def step(self, step: Step) -> None:
        self.watchers.step(step)

    def decision(self, policy: str, step: int, record: DecisionRecord) -> None:
        self.watchers.decision(Decision(policy, step, record))

    async def held_out(self, policies: list[Policy]) -> None:
        """Each version's held-out score to the trackers, when it is new or changed (more eval
        trajectories rewarded) since it was last logged; at most every ``trackers_eval_every`` seconds."""
        if self.trackers is None or time.monotonic() - self.logged_at < self.eval_every:
            return
        self.logged_at = time.monotonic()
        for policy in policies:
            for step, score in (await self.db.read(scores_by_step, policy.name)).items():
                if self.logged.get((policy.name, step)) != score:
                    self.logged[(policy.name, step)] = score
                    self.trackers.held_out(policy.name, step, score.score, score.trajectories)

    def close(self) -> None:
        self.watchers.close()
