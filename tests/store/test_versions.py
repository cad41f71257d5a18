"""A version's life: the transitions of ``core/learning/promotion.py`` as one table (what each event does
to a policy's head, served step and candidate, and which decision it records), and
``store/versions.py`` writing them on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from burnish_server.core.learning.policies import Policy, PromotionSettings
from burnish_server.core.learning.promotion import (
    DecisionRecord,
    Move,
    Outcome,
    Publishing,
    Versions,
    admin_rolled_back,
    decided,
    on_trial,
    publishing,
    recorded,
    rolled_back,
    served,
)
from burnish_server.core.learning.steps import StepMetrics

IMMEDIATE, CANARY, EVAL, MANUAL = (PromotionSettings(rule=rule) for rule in ("immediate", "canary", "eval", "manual"))
FROM_CANDIDATE = PromotionSettings(rule="canary", train_from="candidate")
PROMOTE = DecisionRecord(decision=Outcome.PROMOTED, by="test", reason="not worse")
REJECT = DecisionRecord(decision=Outcome.REJECTED, by="test", reason="worse")
ADMIN_REJECT = DecisionRecord(decision=Outcome.REJECTED, by="admin", reason="rejected by an admin")
REGRESSED = DecisionRecord(decision=Outcome.ROLLED_BACK, by="test", reason="regressed")
WHY = "an admin rolled back to step {}"


def v(head: int, step: int, candidate: int | None = None) -> Versions:
    return Versions(head=head, step=step, candidate=candidate)


def admin(decision: Outcome, to: int) -> DecisionRecord:
    return DecisionRecord(decision=decision, by="admin", reason=WHY.format(to))


# (case, transition, the versions after it or None for "nothing moves", the decisions it records)
TABLE: list[tuple[str, Callable[[], Move | None], Versions | None, tuple[tuple[int, DecisionRecord], ...]]] = [
    # immediate: a recorded step becomes the head, then serves once vLLM answers with it.
    ("immediate: recorded", lambda: recorded(v(0, 0), 0, 1), v(1, 0), ()),
    ("immediate: served", lambda: served(v(1, 0), 1), v(1, 1), ()),
    # A crash between record and serve: the head is ahead of the served step; the restarted
    # trainer publishes it, unless a rollback moved the head meanwhile.
    ("crash, then served on restart", lambda: served(v(2, 1), 2), v(2, 2), ()),
    ("crash, a rollback meanwhile: not served", lambda: served(v(0, 1), 2), None, ()),
    ("recorded after a rollback moved the head: kept, not the head", lambda: recorded(v(0, 1), 1, 2), None, ()),
    # canary, eval and manual: on trial first, then decided.
    ("on trial", lambda: on_trial(v(2, 1), 2), v(2, 1, 2), ()),
    ("on trial, a rollback meanwhile", lambda: on_trial(v(1, 1), 2), None, ()),
    ("promoted", lambda: decided(v(2, 1, 2), CANARY, 2, PROMOTE), v(2, 2), ((2, PROMOTE),)),
    ("rejected: the head back to the served step", lambda: decided(v(2, 1, 2), EVAL, 2, REJECT), v(1, 1), ((2, REJECT),)),
    ("rejected, training from candidates: the head stays", lambda: decided(v(2, 1, 2), FROM_CANDIDATE, 2, REJECT), v(2, 1), ((2, REJECT),)),
    ("manual: rejected by an admin", lambda: decided(v(2, 1, 2), MANUAL, 2, ADMIN_REJECT), v(1, 1), ((2, ADMIN_REJECT),)),
    ("decided elsewhere first: stands", lambda: decided(v(1, 1), CANARY, 2, PROMOTE), None, ()),
    # The served version regressed: the head goes back; the trainer publishes it next.
    ("rolled back", lambda: rolled_back(v(3, 3), v(3, 3), 2, REGRESSED), v(2, 3), ((3, REGRESSED),)),
    ("rolled back, moved since the test read it", lambda: rolled_back(v(4, 3), v(3, 3), 2, REGRESSED), None, ()),
    # An admin's rollback: any kept step; a candidate on trial is rejected; a rejected step counts as promoted.
    ("admin rollback", lambda: admin_rolled_back(v(3, 3), 1, Outcome.PROMOTED), v(1, 3), ()),
    (
        "admin rollback to a rejected step, a candidate on trial",
        lambda: admin_rolled_back(v(3, 2, 3), 1, Outcome.REJECTED),
        v(1, 2),
        ((3, admin(Outcome.REJECTED, 1)), (1, admin(Outcome.PROMOTED, 1))),
    ),
    ("admin rollback to the candidate itself: its trial goes on", lambda: admin_rolled_back(v(3, 2, 3), 3, None), v(3, 2, 3), ()),
    ("admin rollback to the base", lambda: admin_rolled_back(v(2, 2), 0, None), v(0, 2), ()),
]


@pytest.mark.parametrize(("case", "transition", "after", "decisions"), TABLE, ids=[row[0] for row in TABLE])
def test_a_transition_moves_the_versions_and_records_its_decisions(
    case: str, transition: Callable[[], Move | None], after: Versions | None, decisions: tuple
) -> None:
    move = transition()
    if after is None:
        assert move is None, case
    else:
        assert move == Move(after, decisions), case


@pytest.mark.parametrize(
    ("rule", "head", "decision", "published", "how"),
    [
        (IMMEDIATE, 2, None, False, Publishing.SERVE),
        (CANARY, 2, None, False, Publishing.TRIAL),
        (EVAL, 2, None, False, Publishing.TRIAL),
        (MANUAL, 2, None, False, Publishing.TRIAL),
        (CANARY, 0, None, False, Publishing.SERVE),  # the base model is never on trial
        (CANARY, 2, None, True, Publishing.SERVE),  # served before: a rollback's target
        (CANARY, 2, Outcome.PROMOTED, True, Publishing.SERVE),
        (CANARY, 2, Outcome.ROLLED_BACK, True, Publishing.SERVE),  # rolled back to again by an admin
        (CANARY, 2, Outcome.REJECTED, True, Publishing.KEEP),  # kept only to train from
        (IMMEDIATE, 2, Outcome.REJECTED, True, Publishing.KEEP),
    ],
)
def test_how_a_head_is_published(rule: PromotionSettings, head: int, decision: Outcome | None, published: bool, how: Publishing) -> None:
    assert publishing(rule, head, decision, published) is how


async def test_the_store_writes_a_versions_life_and_nothing_else_moves_it(store) -> None:
    """Record, trial, rejection, an admin's rollback to the rejected step, promotion and an
    automatic rollback, through ``store/versions.py``, each read back from the policy's row and
    its steps' decisions."""
    from burnish_server.store import versions
    from burnish_server.store.policies import create_policy, get_policy, list_steps

    db, _ = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny", promotion=CANARY))

    async def now() -> tuple[Policy, Versions]:
        policy = await db.read(get_policy, "agent")
        return policy, v(policy.head, policy.step, policy.candidate)

    async def step_decisions() -> dict[int, list[tuple[Outcome, str]]]:
        return {s.step: [(d.decision, d.by) for d in s.decisions] for s in await db.read(list_steps, "agent")}

    assert await db.transaction(versions.record_step, "agent", 1, 0, [], "w1", StepMetrics(), "/ckpt/1")
    policy, at = await now()
    assert at == v(1, 0) and await db.read(versions.publishing_of, policy) is Publishing.TRIAL
    assert await db.transaction(versions.mark_candidate, "agent", 1, 0.01)
    policy, at = await now()
    assert at == v(1, 0, 1) and policy.candidate_since is not None
    assert await db.transaction(versions.decide, policy, 1, REJECT)
    policy, at = await now()
    assert at == v(0, 0) and policy.candidate_since is None
    assert not await db.transaction(versions.decide, policy, 1, PROMOTE)  # decided already: stands

    # An admin rolls back to the rejected step: it counts as promoted by the admin, and serves outright.
    await db.transaction(versions.request_rollback, "agent", 1)
    policy, at = await now()
    assert at == v(1, 0) and await db.read(versions.publishing_of, policy) is Publishing.SERVE
    assert await db.transaction(versions.mark_served, "agent", 1, 0.01)
    assert (await step_decisions())[1] == [(Outcome.REJECTED, "test"), (Outcome.PROMOTED, "admin")]

    # The next step on trial, promoted; then it regresses and rolls back, unless something moved first.
    assert await db.transaction(versions.record_step, "agent", 2, 1, [], "w1", StepMetrics(), "/ckpt/2")
    assert await db.transaction(versions.mark_candidate, "agent", 2, 0.01)
    policy, _ = await now()
    assert await db.transaction(versions.decide, policy, 2, PROMOTE)
    policy, at = await now()
    assert at == v(2, 2)
    stale = policy
    assert await db.transaction(versions.roll_back, policy, 1, REGRESSED)
    assert (await now())[1] == v(1, 2)
    assert not await db.transaction(versions.roll_back, stale, 0, REGRESSED)  # read before the first rollback
    assert (await step_decisions())[2] == [(Outcome.PROMOTED, "test"), (Outcome.ROLLED_BACK, "test")]
    await db.transaction(versions.request_rollback, "agent", 0)
    assert (await now())[1] == v(0, 2)
