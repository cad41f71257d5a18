"""Lone attempts in the store, on SQLite and PostgreSQL: a group of its own made by its reward,
ready and weighing a share of a group in a claim; expired when the reward does not come, and a
late reward kept untrained; counted once each."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from burnish_server.core.learning.groups import EXPIRED, Lack
from burnish_server.core.learning.lone import Baseline
from burnish_server.core.learning.policies import Objective, Policy, Teacher, TeacherTurn, TrainSettings
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import Conflict
from burnish_server.store.baselines import keep_baselines, read_baselines
from burnish_server.store.followups import claim_answer, close_followed
from burnish_server.store.lone import lone_counts, sweep
from burnish_server.store.models import Group, Trajectory
from burnish_server.store.policies import create_policy, policy_status
from burnish_server.store.reads import get_group, get_trajectory
from burnish_server.store.training import claim_groups, count_ready, settle
from burnish_server.store.writer import Writer
from burnish_server.store.writes import PostReward
from tests.store.test_store import record


async def lone(writer: Writer, name: str, reward: float | None = None) -> None:
    """A lone attempt as the gateway records it: a policy's call in no group."""
    await writer.write(record(name, policy="agent", policy_step=0))
    if reward is not None:
        await writer.write(PostReward(name, reward))


async def test_a_rewarded_lone_attempt_is_ready_and_weighs_a_share_of_a_group(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny"))
    await asyncio.gather(*(lone(writer, f"t{i}") for i in range(8)))
    status = await db.read(policy_status, "agent")
    assert (status.lone.waiting, status.lone.ready, status.groups_open) == (8, 0, 0)  # no group until something happens
    for i in range(6):
        answer = await writer.write(PostReward(f"t{i}", float(i % 2)))
        assert answer["group_closed"] is True and answer["expired"] is False
    assert await db.transaction(count_ready, "agent") == 6  # each a group of its own, closed by its reward
    # One group's worth is lone_per_group (8) lone attempts: 6 are not a step.
    assert await db.transaction(claim_groups, "agent", "w1", 1) == []
    for i in (6, 7):
        await writer.write(PostReward(f"t{i}", 1.0))
    claimed = await db.transaction(claim_groups, "agent", "w1", 1)
    assert sorted(claimed) == [f"t{i}" for i in range(8)]
    await lone(writer, "late", 0.5)
    assert await db.transaction(claim_groups, "agent", "w2", 1, 3600, 0) == []  # w1 is mid-step
    status = await db.read(policy_status, "agent")
    assert (status.lone.waiting, status.lone.ready, status.lone.expired) == (0, 1, 0)
    # A user's verdict puts a lone attempt's reward right until a trainer takes it.
    assert (await writer.write(PostReward("late", 0.75)))["expired"] is False
    assert (await db.read(get_group, "late")).members[0].reward == 0.75
    with pytest.raises(Conflict):
        await writer.write(PostReward("t0", 0.5))  # taken by w1's step


async def test_a_lone_attempt_trains_only_where_the_policy_says(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny", train=TrainSettings(lone_baseline=None)))
    await lone(writer, "alone", 1.0)
    assert await db.transaction(count_ready, "agent") == 0
    got = await db.read(get_trajectory, "alone")
    assert got is not None and got.group_id is None and got.reward == 1.0  # rewarded as before lone attempts trained


async def test_an_unrewarded_lone_attempt_expires_and_a_late_reward_is_kept_untrained(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny"))
    start = utcnow()
    # A first look, two hours back (so that an attempt aged below is after it): nothing yet.
    assert await db.transaction(sweep, {"agent": 600.0}, start - timedelta(seconds=7200)) == {}
    for name in ("never", "unswept"):
        await lone(writer, name)
    await lone(writer, "rewarded", 1.0)
    assert await db.read(lone_counts, "agent", 600.0, utcnow()) == (2, 1)

    def age(conn) -> None:  # its last call an hour ago: expired, and no look has counted it yet
        conn.execute(update(Trajectory).where(Trajectory.id == "unswept").values(updated_at=utcnow() - timedelta(seconds=3600)))

    await db.transaction(age)
    # Its verdict comes after all: kept, and said to be too late; never trained on; counted once.
    answer = await writer.write(PostReward("unswept", 1.0))
    assert answer["expired"] is True and answer["group_closed"] is False
    later = start + timedelta(seconds=3600)
    assert await db.transaction(sweep, {"agent": 600.0}, later) == {"agent": 1}  # "never"
    assert await db.transaction(sweep, {"agent": 600.0}, later) == {}  # counted once
    assert await db.read(lone_counts, "agent", 600.0, later) == (0, 1)
    # Too late, and counted by the look already: not counted again.
    aged = start - timedelta(seconds=3600)
    await db.transaction(lambda conn: conn.execute(update(Trajectory).where(Trajectory.id == "never").values(updated_at=aged)))
    assert (await writer.write(PostReward("never", 0.0)))["expired"] is True
    for name in ("never", "unswept"):
        group = await db.read(get_group, name)
        assert group is not None and group.close_reason == EXPIRED and group.members[0].reward is not None
    assert await db.read(lambda conn: conn.execute(select(Group.lacks).where(Group.id == "never")).scalar_one()) == Lack.REWARDS
    await db.transaction(settle, ["never"])  # worked out again (a later call does so): still lacks its reward
    assert await db.transaction(count_ready, "agent") == 1  # "rewarded" alone
    assert (await db.read(policy_status, "agent")).lone.expired == 2


async def test_baselines_are_kept_per_policy_and_kind(store) -> None:
    db, _ = store
    await db.transaction(keep_baselines, "agent", {"a": Baseline().moved([0.0, 1.0]), "b": Baseline().moved([0.5])})
    await db.transaction(keep_baselines, "agent", {"a": Baseline(count=3, mean=0.2, variance=0.1)})
    await db.transaction(keep_baselines, "other", {"a": Baseline(count=1, mean=9.0)})
    kept = await db.read(read_baselines, "agent")
    assert kept == {"a": Baseline(count=3, mean=0.2, variance=0.1), "b": Baseline(count=1, mean=0.5, variance=0.0)}


async def test_hindsight_alone_trains_followed_attempts_and_leaves_ties_to_grpo(store) -> None:
    """A teacher with hindsight alone (burnish up's default) has something to show only a followed
    attempt: a tied group of grouped traffic waits as under GRPO, a followed attempt is ready; a
    teacher with a context teaches every call, so a tie is ready for it."""
    db, writer = store
    hindsight = TrainSettings(objective=Objective(grpo=1, distill=1), teacher=Teacher(hindsight=True))
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny", train=hindsight))
    for name in ("a", "b"):  # a group of two, tied
        await writer.write(record(name, group="tie", size=2, policy="agent", policy_step=0))
        await writer.write(PostReward(name, 1.0))
    await lone(writer, "followed")
    assert await db.transaction(claim_answer, "followed", "agent")
    assert await db.transaction(close_followed, "followed")
    assert (await db.read(get_group, "tie")).cannot_train is not None  # a tie: nothing GRPO learns
    assert (await db.read(get_group, "followed")).cannot_train is None
    assert await db.transaction(count_ready, "agent") == 1  # the followed attempt alone
    assert await db.transaction(claim_groups, "agent", "w1", 1, 3600, 0) == ["followed"]
    context = TrainSettings(objective=Objective(grpo=1, distill=1), teacher=Teacher(context=(TeacherTurn("system", "Be brief."),)))
    await db.transaction(create_policy, Policy(name="taught", base_model="tiny", train=context))
    for name in ("c", "d"):
        await writer.write(record(name, group="tie2", size=2, policy="taught", policy_step=0))
        await writer.write(PostReward(name, 1.0))
    assert await db.transaction(count_ready, "taught") == 1  # the context teaches every call
    # Health counts the followed attempt as trainable (no "nothing to train" for it).
    assert (await db.read(policy_status, "agent")).health.recent_unrewarded == 0
    # The runner reads which from the status: a tie counts toward its step or it does not.
    assert (await db.read(policy_status, "agent")).ties_train is False and (await db.read(policy_status, "taught")).ties_train is True
