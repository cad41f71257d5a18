"""The trainer's side of promotion: end a candidate's trial where its test decides, and roll
the served version back where it regressed.

What the figures mean is ``core/learning/promotion.py``'s (the test, the outcomes, the record); what
the rule asks is ``PromotionSettings``' (``core/learning/policies.py``); the store reads the samples
(``store/promotion.py``) and writes the decisions (``store/versions.py``). This class only puts them together, on each of
the trainer's passes, and tells whoever watches the decisions (``on_decision``: Langfuse and the
trackers, through the worker).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from burnish_server.core.learning.policies import Policy
from burnish_server.core.learning.promotion import DecisionRecord, Outcome, regression
from burnish_server.core.platform.clock import utcnow
from burnish_server.store import promotion, versions
from burnish_server.store.database import Database
from burnish_server.store.policies import get_policy

log = logging.getLogger("burnish.trainer")

OnDecision = Callable[[str, int, DecisionRecord], None]


class Promoter:
    def __init__(self, db: Database, review_every_s: float, on_decision: OnDecision) -> None:
        self.db, self.review_every_s, self.on_decision = db, review_every_s, on_decision
        self.reviewed_at: dict[str, float] = {}  # policy -> when its trial or watch was last tested

    async def review(self, policy: Policy) -> Policy:
        """Decide the candidate's trial where its evidence does, and roll the served version
        back where it regressed; return the policy as it then stands. Tested every
        ``review_every_s`` seconds at most, and only where there is something to test."""
        if policy.candidate is None and not policy.promotion.watched:
            return policy
        now = time.monotonic()
        if now - self.reviewed_at.get(policy.name, float("-inf")) < self.review_every_s:
            return policy
        self.reviewed_at[policy.name] = now
        if policy.candidate is not None:
            record = await self.verdict(policy)
            if record is None:
                return policy
            if await self.db.transaction(versions.decide, policy, policy.candidate, record):
                log.info("%s@%d %s: %s", policy.name, policy.candidate, record.decision, record.reason)
                self.on_decision(policy.name, policy.candidate, record)
            return await self.db.read(get_policy, policy.name)
        found = await self.db.read(promotion.regression_samples, policy)
        if found is None:
            return policy
        to, before, served = found
        test = regression(policy.promotion, before, served)
        if test.outcome is not Outcome.REJECTED:
            return policy
        record = DecisionRecord(decision=Outcome.ROLLED_BACK, by="test", reason=f"regressed against step {to}: {test.reason}", test=test, decided_at=utcnow())
        if await self.db.transaction(versions.roll_back, policy, to, record):
            log.warning("%s@%d rolled back to step %d: %s", policy.name, policy.step, to, record.reason)
            self.on_decision(policy.name, policy.step, record)
        return await self.db.read(get_policy, policy.name)

    async def verdict(self, policy: Policy) -> DecisionRecord | None:
        """How the candidate's trial ends now, if it does: by its test, or at once where the
        rule stopped trying steps during the trial."""
        if not policy.promotion.trials:
            return DecisionRecord(decision=Outcome.PROMOTED, by="rule", reason="the promotion rule became immediate", decided_at=utcnow())
        test = await self.db.read(promotion.evidence, policy)
        if test is None:
            return None
        if test.outcome is None:
            if policy.promotion.canary:  # the status shows a canary's test as read here
                await self.db.transaction(versions.record_test, policy.name, policy.candidate, test)
            return None
        return DecisionRecord(decision=test.outcome, by="test", reason=test.reason, test=test, decided_at=utcnow())
