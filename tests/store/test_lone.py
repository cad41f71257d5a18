"""Lone attempts in the store, on SQLite and PostgreSQL: a group of one is ready once rewarded,
weighs a share of a group in a claim, expires unrewarded, and keeps a late reward untrained."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec
from sqlalchemy import select

from burnish_server.core.learning.groups import EXPIRED, Lack
from burnish_server.core.learning.lone import Baseline
from burnish_server.core.learning.policies import Policy, TrainSettings
from burnish_server.core.platform.clock import utcnow
from burnish_server.store.baselines import keep_baselines, read_baselines
from burnish_server.store.models import Group
from burnish_server.store.policies import create_policy, policy_status, update_policy
from burnish_server.store.reads import get_group
from burnish_server.store.training import claim_groups, count_ready, settle
from burnish_server.store.writer import Writer
from burnish_server.store.writes import PostReward, close_idle_groups
from tests.store.test_store import record


async def lone(writer: Writer, name: str, reward: float | None = None) -> None:
    """A lone attempt as the gateway files it: a group of its own, of size 1."""
    await writer.write(record(name, group=name, size=1, policy="agent", policy_step=0))
    if reward is not None:
        await writer.write(PostReward(name, reward))


async def test_a_rewarded_lone_attempt_is_ready_and_weighs_a_share_of_a_group(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny"))
    await asyncio.gather(*(lone(writer, f"t{i}", float(i % 2) if i < 6 else None) for i in range(8)))
    assert await db.transaction(count_ready, "agent") == 6  # each closed by its reward (size 1)
    # One group's worth is lone_per_group (8) lone attempts: 6 are not a step.
    assert await db.transaction(claim_groups, "agent", "w1", 1) == []
    for i in (6, 7):
        await writer.write(PostReward(f"t{i}", 1.0))
    claimed = await db.transaction(claim_groups, "agent", "w1", 1)
    assert sorted(claimed) == [f"t{i}" for i in range(8)]
    # Asked to train now (minimum 0), whatever is ready: one lone attempt is enough.
    await lone(writer, "late", 0.5)
    assert await db.transaction(claim_groups, "agent", "w2", 1, 3600, 0) == []  # w1 is mid-step
    status = await db.read(policy_status, "agent")
    assert (status.lone.waiting, status.lone.ready, status.lone.expired) == (0, 1, 0)


async def test_a_lone_attempt_trains_only_where_the_policy_says(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny", train=TrainSettings(lone_baseline=None)))
    await lone(writer, "alone", 1.0)
    assert await db.transaction(count_ready, "agent") == 0
    group = await db.read(get_group, "alone")
    assert group is not None and group.cannot_train is not None and "lone_baseline" in group.cannot_train
    await db.transaction(lambda conn: update_policy(conn, "agent", train=msgspec.to_builtins(TrainSettings())))
    assert await db.transaction(count_ready, "agent") == 1
    assert (await db.read(get_group, "alone")).cannot_train is None


async def test_an_unrewarded_lone_attempt_expires_and_a_late_reward_is_kept_untrained(store) -> None:
    db, writer = store
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny"))
    await lone(writer, "never")
    await lone(writer, "rewarded", 1.0)
    status = await db.read(policy_status, "agent")
    assert (status.lone.waiting, status.lone.ready) == (1, 1)
    later = utcnow() + timedelta(seconds=3600)
    assert await db.transaction(close_idle_groups, {"agent": 600.0}, later) == ["never"]
    row = await db.read(lambda conn: conn.execute(select(Group.close_reason, Group.lacks).where(Group.id == "never")).one())
    assert (row.close_reason, row.lacks) == (EXPIRED, Lack.REWARDS)
    status = await db.read(policy_status, "agent")
    assert (status.lone.waiting, status.lone.ready, status.lone.expired) == (0, 1, 1)
    # The verdict comes after all: kept, and said to be too late; never trained on.
    answer = await writer.write(PostReward("never", 1.0))
    assert answer["expired"] is True and answer["group_closed"] is False
    group = await db.read(get_group, "never")
    assert group is not None and group.members[0].reward == 1.0 and "expired" in (group.cannot_train or "")
    await db.transaction(settle, ["never"])  # worked out again (a later call does so): still lacks its reward
    assert await db.transaction(count_ready, "agent") == 1  # "rewarded" alone


async def test_baselines_are_kept_per_policy_and_kind(store) -> None:
    db, _ = store
    await db.transaction(keep_baselines, "agent", {"a": Baseline().moved([0.0, 1.0]), "b": Baseline().moved([0.5])})
    await db.transaction(keep_baselines, "agent", {"a": Baseline(count=3, mean=0.2, variance=0.1)})
    await db.transaction(keep_baselines, "other", {"a": Baseline(count=1, mean=9.0)})
    kept = await db.read(read_baselines, "agent")
    assert kept == {"a": Baseline(count=3, mean=0.2, variance=0.1), "b": Baseline(count=1, mean=0.5, variance=0.0)}
