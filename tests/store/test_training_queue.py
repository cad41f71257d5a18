"""The training queue on SQLite and PostgreSQL: readiness, claims, crashes, and two trainers at once."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from sqlalchemy import event, select, update

from burnish_server.core.learning.groups import Lack
from burnish_server.core.platform.clock import utcnow
from burnish_server.store.database import Database
from burnish_server.store.models import Group
from burnish_server.store.policies import recent_groups
from burnish_server.store.training import claim_groups, complete_groups, count_ready, group_calls, release_groups
from burnish_server.store.writer import Writer
from burnish_server.store.writes import CloseGroup, PostReward
from tests.store.test_store import record


async def make_group(writer: Writer, name: str, rewards: list[float | None], *, policy: str = "agent", close: bool = True) -> None:
    await asyncio.gather(*(writer.write(record(f"{name}-{i}", group=name, policy=policy, policy_step=0)) for i in range(len(rewards))))
    for i, r in enumerate(rewards):
        if r is not None:
            await writer.write(PostReward(f"{name}-{i}", r))
    if close:
        await writer.write(CloseGroup(name))


async def test_only_closed_fully_rewarded_groups_with_spread_are_ready(store) -> None:
    db, writer = store
    await make_group(writer, "ready", [0.0, 1.0, 0.5])
    await make_group(writer, "flat", [0.3, 0.3, 0.3])
    await make_group(writer, "missing", [0.0, None, 1.0])
    await make_group(writer, "open", [0.0, 1.0], close=False)
    await make_group(writer, "other", [0.0, 1.0], policy="someone")
    assert await db.transaction(count_ready, "agent") == 1
    assert await db.transaction(claim_groups, "agent", "w1", 1) == ["ready"]
    assert await db.transaction(count_ready, "agent") == 0


async def test_claims_are_whole_steps_and_complete_or_release(store) -> None:
    db, writer = store
    for name in ("g1", "g2", "g3"):
        await make_group(writer, name, [0.0, 1.0])
    assert await db.transaction(claim_groups, "agent", "w1", 4) == []  # not a full step: nothing
    first = await db.transaction(claim_groups, "agent", "w1", 2)
    assert first == ["g1", "g2"]
    assert await db.transaction(claim_groups, "agent", "w2", 2) == []  # only g3 left
    await db.transaction(complete_groups, first, "w1", 1)
    with pytest.raises(RuntimeError):
        await db.transaction(complete_groups, ["g3"], "w1", 1)  # never claimed by w1
    solo = await db.transaction(claim_groups, "agent", "w2", 1)
    assert solo == ["g3"]
    assert await db.transaction(release_groups, "w2") == 1  # failed step: g3 waits again
    assert await db.transaction(claim_groups, "agent", "w1", 1) == ["g3"]
    rows = await db.transaction(group_calls, ["g1"])
    assert [r.trajectory_id for r in rows] == ["g1-0", "g1-1"] and [r.reward for r in rows] == [0.0, 1.0]


async def test_a_crashed_trainers_claim_expires(store) -> None:
    db, writer = store
    await make_group(writer, "lost", [0.0, 1.0])
    assert await db.transaction(claim_groups, "agent", "dead", 1, 60) == ["lost"]
    assert await db.transaction(claim_groups, "agent", "alive", 1, 60) == []

    def age(conn) -> None:
        conn.execute(update(Group).values(claimed_at=utcnow() - timedelta(seconds=120)))

    await db.transaction(age)
    assert await db.transaction(claim_groups, "agent", "alive", 1, 60) == ["lost"]
    await db.transaction(complete_groups, ["lost"], "alive", 3)
    with pytest.raises(RuntimeError):
        await db.transaction(complete_groups, ["lost"], "dead", 3)  # too late: trained once


async def test_two_trainers_claiming_at_once_take_each_group_once(store, database_url: str) -> None:
    db, writer = store
    for i in range(12):
        await make_group(writer, f"c{i:02d}", [0.0, 1.0])
    other = Database(database_url)
    try:

        async def trainer(database: Database, name: str) -> list[str]:
            taken: list[str] = []
            while ids := await database.transaction(claim_groups, "agent", name, 2):
                taken += ids
                await database.transaction(complete_groups, ids, name, 1)
            return taken

        a, b = await asyncio.gather(trainer(db, "a"), trainer(other, "b"))
    finally:
        await other.dispose()
    assert sorted(a + b) == [f"c{i:02d}" for i in range(12)]
    assert not set(a) & set(b)


async def test_one_trainer_at_a_time_trains_a_policy(store) -> None:
    """Each step builds on the last: while one trainer holds a policy's claim, another gets none of its groups."""
    db, writer = store
    for name in ("p1", "p2", "p3"):
        await make_group(writer, name, [0.0, 1.0])
    await make_group(writer, "other", [0.0, 1.0], policy="second")
    assert await db.transaction(claim_groups, "agent", "a", 1) == ["p1"]
    assert await db.transaction(claim_groups, "agent", "b", 1) == []  # "a" is training agent
    assert await db.transaction(claim_groups, "second", "b", 1) == ["other"]  # another policy is free
    assert await db.transaction(claim_groups, "agent", "a", 1) == ["p2"]  # "a" itself may go on
    await db.transaction(complete_groups, ["p1", "p2"], "a", 1)
    assert await db.transaction(claim_groups, "agent", "b", 1) == ["p3"]  # free again
    # A claim past its lease (a dead trainer) no longer holds the policy.
    await db.transaction(lambda c: c.execute(update(Group).where(Group.id == "p3").values(claimed_at=utcnow() - timedelta(hours=1))))
    assert await db.transaction(claim_groups, "agent", "c", 1, 900.0) == ["p3"]


async def answer(db: Any, read: Any, *args: Any) -> Any:
    """A read of the admin API's answers, as the JSON a client gets."""
    return msgspec.to_builtins(await db.read(read, *args))


async def test_steps_are_recorded_served_and_lose_to_a_rollback(store) -> None:
    """The trainer's side of the policies table on both databases: record, serve, rollback mid-step."""
    from burnish_server.core.learning.policies import Policy
    from burnish_server.core.learning.steps import StepMetrics
    from burnish_server.store.policies import create_policy, get_policy, list_steps, policy_status
    from burnish_server.store.versions import mark_load_error, mark_served, record_step, request_rollback

    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny"))
    for name in ("a", "b", "c"):
        await make_group(writer, name, [0.0, 1.0])
    first = await db.transaction(claim_groups, "agent", "w1", 2, 900.0, 1)
    mid_step = await answer(db, policy_status, "agent")  # the two claimed are neither closed nor trained
    assert (mid_step["groups_closed"], mid_step["groups_trained"], mid_step["groups_ready"]) == (1, 0, 1)
    assert await db.transaction(record_step, "agent", 1, 0, first, "w1", StepMetrics(loss=0.5), "/ckpt/1")
    assert (await db.read(get_policy, "agent")).head == 1
    await db.transaction(mark_load_error, "agent", "agent@1: vLLM away")
    assert (await answer(db, policy_status, "agent"))["load_error"] == "agent@1: vLLM away"
    await db.transaction(mark_served, "agent", 1, 0.02)
    status = await answer(db, policy_status, "agent")
    assert (status["step"], status["load_error"], status["groups_trained"], status["groups_ready"]) == (1, None, 2, 1)
    assert status["last_step"]["metrics"]["loss"] == 0.5 and status["last_step"]["publish_seconds"] == 0.02

    # A step trained from 1 while an operator rolls back to 0: it is kept, but the head stays at 0.
    second = await db.transaction(claim_groups, "agent", "w1", 2, 900.0, 1)
    await db.transaction(request_rollback, "agent", 0)
    assert not await db.transaction(record_step, "agent", 2, 1, second, "w1", StepMetrics(loss=0.1), "/ckpt/2")
    policy = await db.read(get_policy, "agent")
    assert (policy.step, policy.head) == (1, 0)
    assert [(s["step"], s["parent"], s["serving"], s["published_at"] is not None) for s in await answer(db, list_steps, "agent")] == [
        (1, 0, True, True),
        (2, 1, False, False),
    ]
    # A step's groups cannot be recorded twice.
    with pytest.raises(RuntimeError, match="lost its claim"):
        await db.transaction(record_step, "agent", 3, 0, first, "w1", StepMetrics(), "/ckpt/3")
    assert [s["step"] for s in await answer(db, list_steps, "agent")] == [1, 2]


async def test_a_group_of_equal_rewards_is_ready_when_a_call_carries_credit_of_its_own(store) -> None:
    """Equal trajectory rewards teach nothing, unless a call's own reward (not 0) gives its
    tokens credit; the trainer reads each call's newest reward beside the trajectory's."""
    from burnish_server.store.writes import PostCallReward

    db, writer = store
    await make_group(writer, "zero-credit", [0.3, 0.3], close=False)
    await writer.write(PostCallReward("zero-credit-0", 0, 0.0))
    await writer.write(CloseGroup("zero-credit"))
    await make_group(writer, "credited", [0.3, 0.3], close=False)
    await writer.write(PostCallReward("credited-1", -1, 0.5))
    await writer.write(PostCallReward("credited-1", 0, -0.25))  # the same call (its only one): the newest wins
    await writer.write(CloseGroup("credited"))
    assert await db.transaction(claim_groups, "agent", "w1", 2, 900.0, 1) == ["credited"]
    rows = await db.read(group_calls, ["credited"])
    assert [(r.trajectory_id, r.reward, r.call_reward) for r in rows] == [("credited-0", 0.3, None), ("credited-1", 0.3, -0.25)]


async def lacks_of(db: Database, group: str) -> int | None:
    async with db.reader.connect() as conn:
        return (await conn.execute(select(Group.lacks).where(Group.id == group))).scalar_one()


async def test_a_call_after_a_group_closed_unsettles_what_it_lacks(store) -> None:
    """What a closed group lacks is kept on its row (``Group.lacks``); a call that arrives after
    the close may change it (a member with no reward, a mark for evaluation with or without the
    group's key), and the queue never reads a stale answer: the group is worked out from its
    members until the trainer's next claim settles it again."""
    db, writer = store
    for name in ("late-member", "late-mark", "marked-by-trajectory", "late-turn"):
        await make_group(writer, name, [0.0, 1.0])
        assert await lacks_of(db, name) == Lack.NOTHING
    assert await db.read(count_ready, "agent") == 4
    await writer.write(record("late-member-2", group="late-member", policy="agent", policy_step=0))  # joins, can never be rewarded
    await writer.write(record("late-mark-0", group="late-mark", policy="agent", policy_step=0, eval=True))
    await writer.write(record("marked-by-trajectory-1", policy="agent", policy_step=0, eval=True))  # X-Trajectory-Id alone
    await writer.write(record("late-turn-1", group="late-turn", policy="agent", policy_step=0))  # a member's own next call
    assert await lacks_of(db, "late-member") is None and await lacks_of(db, "late-turn") is None
    assert await lacks_of(db, "marked-by-trajectory") == Lack.HELD_OUT
    assert await db.read(count_ready, "agent") == 1  # worked out from the members: only late-turn
    assert await db.transaction(claim_groups, "agent", "w1", 4, 900.0, 1) == ["late-turn"]
    assert [await lacks_of(db, g) for g in ("late-member", "late-mark", "late-turn")] == [Lack.REWARDS, Lack.HELD_OUT, Lack.NOTHING]


async def test_groups_closed_before_their_lack_was_kept_are_worked_out_then_settled(store) -> None:
    """A store migrated from before 0017 has every group unsettled: ready ones are counted from
    their members, and the trainer's first claim settles the policy's waiting groups."""
    db, writer = store
    await make_group(writer, "ready", [0.0, 1.0])
    await make_group(writer, "tie", [0.5, 0.5])
    await make_group(writer, "unrewarded", [0.5, None])
    await db.transaction(lambda conn: conn.execute(update(Group).values(lacks=None)))
    assert await db.read(count_ready, "agent") == 1
    assert await db.transaction(claim_groups, "agent", "w1", 1) == ["ready"]
    assert [await lacks_of(db, g) for g in ("ready", "tie", "unrewarded")] == [Lack.NOTHING, Lack.SPREAD, Lack.REWARDS]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_queue_and_the_recent_ties_read_what_waits_not_the_policys_history(store) -> None:
    """Readiness (the trainer's poll, the status's ready count) starts from the groups that wait
    (``ix_groups_waiting``), the ties from the policy's last closed groups, and both reach the
    members through indexes: no table is scanned, so their cost follows what waits, not how
    much the store has trained on. Read from SQLite's plan, with its statistics as the gateway
    keeps them."""
    db, writer = store
    for i in range(6):
        await make_group(writer, f"old{i}", [0.0, 1.0])
    await db.transaction(claim_groups, "agent", "w", 6)
    await db.transaction(complete_groups, [f"old{i}" for i in range(6)], "w", 1)
    await make_group(writer, "new", [0.0, 1.0])
    await make_group(writer, "tie", [0.5, 0.5])
    await db.optimize()
    plans: list[str] = []

    def explain(conn: Any, read: Any, *args: Any) -> None:
        caught: list[tuple[str, Any]] = []
        listen = lambda *a: caught.append(a[2:4])  # noqa: E731 (statement, parameters)
        event.listen(conn.engine, "before_cursor_execute", listen)
        try:
            read(conn, *args)
        finally:
            event.remove(conn.engine, "before_cursor_execute", listen)
        for statement, parameters in caught:
            plans.extend(row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters))

    await db.read(explain, count_ready, "agent")
    assert any("ix_groups_waiting (policy=? AND lacks=?" in line for line in plans), plans
    await db.read(explain, recent_groups, "agent")
    assert any("ix_groups_policy_closed" in line for line in plans), plans
    assert not [line for line in plans if line.startswith("SCAN") and "anon" not in line], plans
    assert await db.read(count_ready, "agent") == 1
    assert (await db.read(recent_groups, "agent")).tied == 1
