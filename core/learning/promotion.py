"""Whether a candidate version may serve: the test that decides it, on trajectories' rewards.

A trained version under the ``canary`` or ``eval`` rule (``core/learning/policies.py:
PromotionSettings``) is a *candidate*: it serves a share of the policy's trajectories (or
only pinned held-out ones), and it is compared with the version served. The comparison is a
one-sided non-inferiority test on the difference of mean rewards, d = candidate - served,
with Welch's t interval (unequal variances, unequal counts):

    promote  when the interval's lower bound is above  -margin  (not worse by more than it)
    reject   when the interval's upper bound is below  -margin  (worse by more than it)
    wait     otherwise, until each side has more rewarded trajectories

Each bound is one-sided at ``confidence``: with confidence 0.95, a candidate truly worse by
more than the margin is promoted at most 5% of the times it is tested, and one truly not
worse is rejected at most 5%. Nothing is decided with fewer than ``min_trajectories`` on
either side. A candidate still undecided with ``max_trajectories`` on both sides is rejected:
a tie that much evidence cannot break is not worth the risk of a new version.

The same test, on a window of the served version's latest rewards against the version it
replaced, decides an automatic rollback (``regressed``).

What a decision is lives here too, typed: ``Outcome`` (what ended a version's trial, or its
serving) and ``DecisionRecord`` (who made it, why, and the test's figures), as the store keeps
them on the step's row and the API, the dashboard and the trackers read them. The rule's
questions (is a new step tried first? does a test decide?) are ``PromotionSettings``'
(``core/learning/policies.py``); nothing else compares a rule or a decision by its string.

So is a version's life: every move of a policy's head, served step and candidate is one of the
transitions at the end (``Versions`` in, a ``Move`` out), which ``store/versions.py`` alone writes.

Pure functions of counts, means, variances and versions: the store computes the samples in SQL
(``store/promotion.py``); the trainer's ``Promoter`` (``trainer/promoter.py``) acts on them.
"""

from __future__ import annotations

import enum
import math
from datetime import datetime
from statistics import NormalDist
from typing import Literal

import msgspec

from burnish_server.core.learning.policies import PromotionSettings

# What the test says to do with a candidate (a verb: its figures are read before anything is done).
Verdict = Literal["promote", "reject"]


class Outcome(enum.StrEnum):
    """What ended a version's trial, or its serving: the step row's ``decision``."""

    PROMOTED = "promoted"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"


Decider = Literal["test", "admin", "rule"]


class Sample(msgspec.Struct, frozen=True):
    """Rewarded trajectories of one version: how many, their mean reward and its variance
    (the sample variance, n - 1 in the denominator; 0 for fewer than two)."""

    n: int
    mean: float | None
    variance: float

    @classmethod
    def of(cls, rewards: list[float]) -> Sample:
        n = len(rewards)
        mean = sum(rewards) / n if n else None
        variance = sum((r - mean) ** 2 for r in rewards) / (n - 1) if n > 1 and mean is not None else 0.0
        return cls(n, mean, variance)


class Comparison(msgspec.Struct, frozen=True):
    """The test's figures, as the status and the metrics history show them."""

    served: Sample
    candidate: Sample
    margin: float
    confidence: float
    difference: float | None = None  # candidate's mean minus served's
    lower: float | None = None  # the one-sided bounds of the difference at `confidence`
    upper: float | None = None
    degrees_of_freedom: float | None = None
    decision: Verdict | None = None
    reason: str = ""

    @property
    def outcome(self) -> Outcome | None:
        """The decision the test's verdict makes (None: none yet)."""
        return None if self.decision is None else Outcome.PROMOTED if self.decision == "promote" else Outcome.REJECTED


class DecisionRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One decision about a version, as the step's row keeps it (its ``decisions``, in order)."""

    decision: Outcome
    by: Decider
    reason: str
    # The test's figures, where a test decided (or, for an admin's decision, as they stood).
    test: Comparison | None = None
    decided_at: datetime | None = None  # set by the store when it writes the record


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile at ``p`` for ``df`` degrees of freedom: the normal quantile
    corrected by the Cornish-Fisher expansion (Abramowitz and Stegun 26.7.5), within 0.15% of
    the table for p up to 0.99 and 4 or more degrees of freedom (tests/trainer/test_promotion.py)."""
    z = NormalDist().inv_cdf(p)
    if math.isinf(df):
        return z
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def compare(served: Sample, candidate: Sample, *, margin: float, confidence: float, min_n: int, max_n: int | None = None) -> Comparison:
    """The non-inferiority test of ``candidate`` against ``served`` (see the module's text)."""
    base = Comparison(served, candidate, margin, confidence)
    if served.n < min_n or candidate.n < min_n or served.mean is None or candidate.mean is None:
        return msgspec.structs.replace(base, reason=f"waiting for {min_n} rewarded trajectories on each side ({candidate.n} candidate, {served.n} served)")
    difference = candidate.mean - served.mean
    a, b = served.variance / served.n, candidate.variance / candidate.n
    se = math.sqrt(a + b)
    if se == 0:  # every reward on each side alike: the difference is exact
        df, half = math.inf, 0.0
    else:
        # Welch-Satterthwaite; a side with no spread contributes no uncertainty.
        df = (a + b) ** 2 / ((a * a / (served.n - 1) if a else 0.0) + (b * b / (candidate.n - 1) if b else 0.0))
        half = t_quantile(confidence, max(df, 1.0)) * se
    lower, upper = difference - half, difference + half
    figures = msgspec.structs.replace(base, difference=difference, lower=lower, upper=upper, degrees_of_freedom=None if math.isinf(df) else df)
    if lower > -margin:
        return msgspec.structs.replace(figures, decision="promote", reason=f"not worse by more than {margin:g}: the lower bound {lower:+.4f} > {-margin:+.4f}")
    if upper < -margin:
        return msgspec.structs.replace(figures, decision="reject", reason=f"worse by more than {margin:g}: the upper bound {upper:+.4f} < {-margin:+.4f}")
    if max_n is not None and served.n >= max_n and candidate.n >= max_n:
        return msgspec.structs.replace(figures, decision="reject", reason=f"undecided after {max_n} rewarded trajectories on each side")
    return msgspec.structs.replace(figures, reason=f"undecided: {-margin:+.4f} lies between the bounds {lower:+.4f} and {upper:+.4f}")


def regressed(before: Sample, now: Sample, *, margin: float, confidence: float, min_n: int) -> Comparison:
    """Whether the served version (``now``) is worse than the one it replaced (``before``) by
    more than the margin: the same test, where only its rejection counts (a rollback)."""
    result = compare(before, now, margin=margin, confidence=confidence, min_n=min_n)
    return result if result.decision == "reject" else msgspec.structs.replace(result, decision=None)


def trial(rule: PromotionSettings, served: Sample, candidate: Sample) -> Comparison:
    """The candidate's test under the policy's rule, on the samples the rule reads."""
    return compare(served, candidate, margin=rule.margin, confidence=rule.confidence, min_n=rule.min_trajectories, max_n=rule.max_trajectories)


def regression(rule: PromotionSettings, before: Sample, now: Sample) -> Comparison:
    """The served version's rollback test under the policy's rule."""
    return regressed(before, now, margin=rule.margin, confidence=rule.confidence, min_n=rule.min_trajectories)


# ---- a version's life: where the head, the served step and the candidate move -------------
#
# Every move of a policy's versions is one of the functions below, of where the versions stand
# and what happened; the store writes what they return (``store/versions.py``), in the same
# transaction that read where they stood, and nothing else writes them. None: nothing moves
# (what the move assumed no longer holds: another decision or a rollback came first, and stands).


class Versions(msgspec.Struct, frozen=True):
    """Where a policy's versions stand: ``head`` is the version to serve, and the next step
    trains from it; ``step`` is the version served; ``candidate`` is the version on trial."""

    head: int
    step: int
    candidate: int | None = None


class Move(msgspec.Struct, frozen=True):
    """A transition: the versions after it, and the decisions it records (each with its step), in order."""

    versions: Versions
    decisions: tuple[tuple[int, DecisionRecord], ...] = ()


class Publishing(enum.Enum):
    """How a policy's head is published: served outright, on trial as the candidate, or not at
    all (a rejected candidate kept as the head only to train from)."""

    SERVE = "serve"
    TRIAL = "trial"
    KEEP = "keep"


def publishing(rule: PromotionSettings, head: int, decision: Outcome | None, published: bool) -> Publishing:
    """A step goes on trial under a rule that tries steps when it never served nor was decided;
    a version served before (a rollback's target, the base model) serves outright."""
    if head == 0:
        return Publishing.SERVE
    if decision == Outcome.REJECTED:
        return Publishing.KEEP
    fresh = decision is None and not published
    return Publishing.TRIAL if rule.trials and fresh else Publishing.SERVE


def recorded(now: Versions, parent: int, step: int) -> Move | None:
    """A step trained from ``parent`` is recorded: it becomes the head, unless a rollback moved
    the head while it trained (then it is kept, never served)."""
    return Move(msgspec.structs.replace(now, head=step)) if now.head == parent else None


def served(now: Versions, step: int) -> Move | None:
    """vLLM serves ``step`` (loaded and checked): it is the served version, if it is still the
    head (a rollback during the load wins, and is published next)."""
    return Move(msgspec.structs.replace(now, step=step)) if now.head == step else None


def on_trial(now: Versions, step: int) -> Move | None:
    """vLLM serves ``step`` (loaded and checked) as the candidate: its trial begins, if it is still the head."""
    return Move(msgspec.structs.replace(now, candidate=step)) if now.head == step else None


def decided(now: Versions, rule: PromotionSettings, step: int, record: DecisionRecord) -> Move | None:
    """``step``'s trial ends: promoted, it serves; rejected, the served version stays, and the
    head goes back to it unless the policy trains from candidates. Only if ``step`` is still the
    candidate: a decision made elsewhere meanwhile stands."""
    if now.candidate != step:
        return None
    after = msgspec.structs.replace(now, candidate=None)
    if record.decision == Outcome.PROMOTED:
        after = msgspec.structs.replace(after, step=step)
    elif rule.train_from == "served":
        after = msgspec.structs.replace(after, head=now.step)
    return Move(after, ((step, record),))


def rolled_back(now: Versions, seen: Versions, to: int, record: DecisionRecord) -> Move | None:
    """The served version regressed: ``to`` is the head again (the trainer loads it), and the
    served version's record says why. Only if nothing moved since the test read ``seen``."""
    if (now.step, now.head) != (seen.step, seen.head):
        return None
    return Move(msgspec.structs.replace(now, head=to), ((now.step, record),))


def admin_rolled_back(now: Versions, to: int, target: Outcome | None) -> Move:
    """An admin makes ``to`` the version to serve and to train from (``target``: its step's
    latest decision). A candidate on trial is rejected; a rejected version rolled back to counts
    as promoted by the admin, so it serves outright, not on trial."""
    why = f"an admin rolled back to step {to}"
    after, decisions = msgspec.structs.replace(now, head=to), []
    if now.candidate is not None and now.candidate != to:
        after = msgspec.structs.replace(after, candidate=None)
        decisions.append((now.candidate, DecisionRecord(decision=Outcome.REJECTED, by="admin", reason=why)))
    if target == Outcome.REJECTED:
        decisions.append((to, DecisionRecord(decision=Outcome.PROMOTED, by="admin", reason=why)))
    return Move(after, tuple(decisions))
