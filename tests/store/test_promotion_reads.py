"""The promotion's reads in the store, on SQLite and PostgreSQL: which trajectories a trial and the
rollback watch count, and (SQLite's plan) that they read the versions' calls, not the policy's
history. The trial's decisions through the gateway and the trainer are tests/trainer/test_promotion.py's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, select, true, update

from burnish_server.core.learning.promotion import Sample
from burnish_server.core.platform.clock import utcnow
from burnish_server.store import evals, promotion, versions
from burnish_server.store.evals import Score
from burnish_server.store.models import PolicyRow, Trajectory
from burnish_server.store.writes import PostReward
from tests.store.test_store import record

START = utcnow() - timedelta(hours=2)


async def trajectory(writer: Any, name: str, steps: list[int], minute: int, reward: float | None, *, eval: bool = False, status: str = "ok") -> None:
    """A trajectory of ``agent`` whose calls (one a minute from ``minute``) ``steps`` answered."""
    for i, step in enumerate(steps):
        at = START + timedelta(minutes=minute + i)
        await writer.write(record(name, policy="agent", policy_step=step, started_at=at, finished_at=at, eval=eval, status=status))
    if reward is not None:
        await writer.write(PostReward(name, reward))


async def test_a_canary_counts_what_each_version_alone_served_since_its_trial_began(store) -> None:
    db, writer = store
    since = START + timedelta(minutes=30)
    await trajectory(writer, "old", [1], 0, 0.9)  # before the trial
    await trajectory(writer, "straddles", [1, 1], 29, 0.9)  # began before: only its call since counts
    await trajectory(writer, "served-a", [1], 40, 0.2)
    await trajectory(writer, "served-b", [1, 1], 41, 0.4)
    await trajectory(writer, "candidate", [2], 42, 0.8)
    await trajectory(writer, "mixed", [1, 2], 43, 0.0)  # both versions: neither's
    await trajectory(writer, "pinned-base", [0, 2], 44, 0.0)  # a pinned call to the base: neither's
    await trajectory(writer, "failed-call", [2], 45, 0.1, status="upstream_error")  # no ok call
    await trajectory(writer, "unrewarded", [2], 46, None)
    await trajectory(writer, "other", [3], 47, 0.5)  # another version
    found = await db.read(lambda conn: promotion.samples(conn, "agent", [1, 2], since=since))
    assert found[1].n == 3 and found[1].mean == pytest.approx((0.9 + 0.2 + 0.4) / 3)
    assert found[2] == Sample(1, 0.8, 0.0)


async def test_the_status_shows_the_test_the_trainer_last_read_and_reads_it_itself_before(store) -> None:
    """A canary's trial costs what it served: the status shows the test as the trainer's review
    last kept it (``record_test``), and reads the trial itself only before the first review."""
    import msgspec

    from burnish_server.core.learning.policies import Policy, PromotionSettings
    from burnish_server.store.policies import create_policy, get_policy, policy_status, update_policy
    from burnish_server.trainer.promoter import Promoter

    db, writer = store
    rule = PromotionSettings(rule="canary", min_trajectories=2)
    await db.transaction(create_policy, Policy(name="agent", base_model="tiny", promotion=rule))
    await db.transaction(lambda c: c.execute(update(PolicyRow).values(head=2, step=1)))
    await db.transaction(versions.mark_candidate, "agent", 2, 0.1)
    await trajectory(writer, "candidate", [2], 200, 0.8)  # since the trial began (START + 200 min is after now)
    live = (await db.read(policy_status, "agent")).candidate
    assert live is not None and live.test is not None and live.test.candidate.n == 1
    policy = await db.read(get_policy, "agent")
    kept = await db.read(promotion.evidence, policy)
    await trajectory(writer, "after", [2], 201, 0.2)  # after the review: shown at the next one
    await db.transaction(versions.record_test, "agent", 2, kept)
    shown = (await db.read(policy_status, "agent")).candidate
    assert shown is not None and shown.test == kept and shown.tested_at is not None and shown.tested_at >= live.tested_at
    await db.transaction(versions.record_test, "agent", 1, await db.read(promotion.evidence, policy))  # not on trial: ignored
    assert (await db.read(policy_status, "agent")).candidate.test == kept  # type: ignore[union-attr]
    # Settings that change the test: read again under them, until the trainer's next review.
    await db.transaction(lambda c: update_policy(c, "agent", promotion=msgspec.structs.replace(rule, margin=0.1)))
    changed = (await db.read(policy_status, "agent")).candidate
    assert changed is not None and changed.test is not None and changed.test.candidate.n == 2 and changed.test.margin == 0.1
    # The trainer's review keeps an undecided test (and only then).
    promoter = Promoter(db, 0, lambda *_: None)
    await promoter.review(await db.read(get_policy, "agent"))
    kept_now = (await db.read(policy_status, "agent")).candidate
    assert kept_now is not None and kept_now.test == changed.test and kept_now.tested_at is not None
    # A new trial forgets the last one's test.
    await db.transaction(lambda c: c.execute(update(PolicyRow).values(head=3)))
    await db.transaction(versions.mark_candidate, "agent", 3, 0.1)
    fresh = (await db.read(policy_status, "agent")).candidate
    assert fresh is not None and fresh.step == 3 and fresh.test is not None and fresh.test.candidate.n == 0
    # Under manual nothing tests: no test, and no time it was read.
    await db.transaction(lambda c: update_policy(c, "agent", promotion=msgspec.structs.replace(rule, rule="manual")))
    manual = (await db.read(policy_status, "agent")).candidate
    assert manual is not None and manual.test is None and manual.tested_at is None


async def test_compare_reads_each_versions_newest_held_out_answers_of_its_project(store) -> None:
    """The dashboard's compare: a version's rewarded held-out trajectories of the caller's
    project, newest first, by the latest step each answered (a call after the reward counts)."""
    import json

    from burnish_server.store.dashboard import held_out_answers

    db, writer = store

    async def answered(name: str, steps: list[int], reward: float | None, *, project_prefix: str = "") -> None:
        for i, step in enumerate(steps):
            body = {"model": "agent", "messages": [{"role": "user", "content": f"task {name.split('-')[0]}"}]}
            reply = {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "agent",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": f"{name} at {step}"}}],
            }
            at = START + timedelta(minutes=len(name) + i)
            fields = dict(
                policy="agent",
                policy_step=step,
                started_at=at,
                finished_at=at,
                eval=True,
                request=json.dumps(body).encode(),
                response=json.dumps(reply).encode(),
            )
            await writer.write(record(project_prefix + name, **fields))
        if reward is not None:
            await writer.write(PostReward(project_prefix + name, reward))

    await answered("a-old", [1], 0.1)
    await answered("a-new", [1], 0.3)  # the newest answer to task a at version 1
    await answered("a-two", [2], 0.9)
    await answered("b-both", [1, 2], 0.5)  # its latest step is 2
    await answered("c-late", [1], 0.4)
    await answered("c-unrewarded", [2], None)
    await answered("d-other", [1], 0.7, project_prefix="other/")  # another project's
    await answered("c-late", [2], None)  # a call after its reward: version 2's now
    result = await db.read(held_out_answers, "agent", 1, 2, "default")
    assert [x.trajectory_id for x in result.a] == ["a-new", "a-old"]
    assert [x.trajectory_id for x in result.b] == ["c-late", "b-both", "a-two"]
    assert {task: (x and x.answer, y and y.answer) for task, x, y in result.pairs} == {
        "task a": ("a-new at 1", "a-two at 2"),
        "task b": (None, "b-both at 2"),
        "task c": (None, "c-late at 2"),
    }


async def test_an_eval_trial_counts_the_held_out_trajectories_of_each_version(store) -> None:
    db, writer = store
    await trajectory(writer, "h1", [1], 0, 0.2, eval=True)
    await trajectory(writer, "h2", [2, 2], 5, 0.6, eval=True)
    await trajectory(writer, "h3", [1, 2], 10, 0.9, eval=True)  # spans versions
    await trajectory(writer, "train", [2], 15, 0.1)  # not held out
    found = await db.read(lambda conn: promotion.samples(conn, "agent", [1, 2], held_out=True))
    assert found == {1: Sample(1, 0.2, 0.0), 2: Sample(1, 0.6, 0.0)}


async def test_held_out_scores_follow_a_call_after_the_reward_until_settled_again(store) -> None:
    """A held-out trajectory's versions are settled with its reward; a later call unsettles them
    (read from its calls meanwhile), and the trainer's poll or its next reward settles them again."""
    db, writer = store

    async def read() -> tuple[dict[int, Score], dict[int, Sample], dict[tuple[str, int], Score]]:
        scores = await db.read(evals.scores_by_step, "agent")
        trial = await db.read(lambda conn: promotion.samples(conn, "agent", [1, 2], held_out=True))
        return scores, trial, await db.read(evals.for_metrics)

    async def scored() -> dict[str, bool]:
        return dict((await db.read(lambda conn: conn.execute(select(Trajectory.id, Trajectory.scored).where(Trajectory.eval == true())))).all())

    await trajectory(writer, "h1", [1], 0, 0.2, eval=True)
    await trajectory(writer, "h2", [2], 5, 0.6, eval=True)
    await trajectory(writer, "h3", [2], 6, None, eval=True)  # not rewarded: not scored
    assert await scored() == {"h1": True, "h2": True, "h3": False}
    settled = await read()
    assert settled[0] == {1: Score(1, 0.2), 2: Score(1, 0.6)}
    assert settled[1] == {1: Sample(1, 0.2, 0.0), 2: Sample(1, 0.6, 0.0)}
    assert settled[2] == {("agent", 1): Score(1, 0.2), ("agent", 2): Score(1, 0.6)}
    # h1 goes on at step 2: it ended on 2 (its score's version), and spans two (no trial's).
    at = START + timedelta(minutes=30)
    await writer.write(record("h1", policy="agent", policy_step=2, started_at=at, finished_at=at))
    assert (await scored())["h1"] is False
    moved = await read()
    assert moved[0] == {2: Score(2, pytest.approx(0.4))}
    assert moved[1] == {1: Sample.of([]), 2: Sample(1, 0.6, 0.0)}
    assert moved[2] == {("agent", 2): Score(2, pytest.approx(0.4))}
    await db.transaction(evals.settle_unscored)  # the trainer's poll
    assert (await scored())["h1"] is True and await read() == moved
    # A trajectory rewarded, then marked held out by a later call, is scored from then on.
    await trajectory(writer, "late", [1], 40, 0.9)
    await writer.write(record("late", policy="agent", policy_step=1, started_at=at, finished_at=at, eval=True))
    assert (await read())[0] == {1: Score(1, 0.9), 2: Score(2, pytest.approx(0.4))}
    await writer.write(PostReward("late", 0.1))  # its next reward settles it, with that reward
    assert (await scored())["late"] is True
    assert (await read())[0] == {1: Score(1, 0.1), 2: Score(2, pytest.approx(0.4))}


async def test_a_trial_reads_verdicts_never_the_next_message_judges_rewards(store) -> None:
    """The judge taught the candidate: its rewards are no evidence for it (a bad judge is caught
    by the verdicts people post), in a canary's trial as in the rollback watch."""
    db, writer = store
    since = START + timedelta(minutes=30)
    await trajectory(writer, "verdict", [2], 40, 0.1)
    await trajectory(writer, "judged", [2], 41, None)
    await writer.write(PostReward("judged", 1.0, source="next_message"))
    await trajectory(writer, "judged-then-verdict", [2], 42, None)
    await writer.write(PostReward("judged-then-verdict", 1.0, source="next_message"))
    await writer.write(PostReward("judged-then-verdict", 0.3))  # the user's verdict puts it right
    found = await db.read(lambda conn: promotion.samples(conn, "agent", [2], since=since))
    assert found[2] == Sample.of([0.1, 0.3])
    assert await db.read(promotion.latest_sample, "agent", 2, 10) == Sample.of([0.3, 0.1])


async def test_the_rollback_watch_reads_a_versions_newest_rewarded_trajectories(store) -> None:
    db, writer = store
    for i in range(12):  # newest last; every third unrewarded
        await trajectory(writer, f"t{i}", [5], i * 3, None if i % 3 == 0 else float(i))
    await trajectory(writer, "mixed", [4, 5], 100, 50.0)  # the newest calls, but also another version's
    assert await db.read(promotion.latest_sample, "agent", 5, 3) == Sample.of([11.0, 10.0, 8.0])
    # A window larger than what the first read ahead holds reads further back, then stops at the oldest.
    assert (await db.read(promotion.latest_sample, "agent", 5, 20)).n == 8


# What `ANALYZE` (as Database.optimize runs it) found in bench/store_reads.py's store of a
# million calls: twenty rows here would rightly be scanned, and the plans at scale are the point.
MILLION_CALLS = {
    "ix_calls_version": ("calls", "1014420 1001 1001 1 1 1"),
    "ix_calls_trajectory": ("calls", "926016 5 1 1 1 1"),
    "ix_calls_response_id": ("calls", "1043072 1001"),
    "ix_trajectories_eval": ("trajectories", "13440 1001"),
    "sqlite_autoindex_trajectories_1": ("trajectories", "266002 1"),
    "ix_trajectories_group_members": ("trajectories", "1334762 13 13 3"),
    "ix_trajectories_project_pk": ("trajectories", "279056 1001 1"),
    "ix_trajectories_unscored": ("trajectories", "3 3"),
    "ix_held_out_version": ("held_out", "8064 1613 81 81 1 1"),
    "sqlite_autoindex_held_out_1": ("held_out", "8064 1 1"),
}


def at_a_million_calls(conn: Any) -> None:
    """SQLite's planner statistics as a million calls leave them (the documented way to test plans)."""
    conn.exec_driver_sql("DELETE FROM sqlite_stat1 WHERE tbl IN ('calls', 'trajectories', 'held_out')")
    for index, (table, stat) in MILLION_CALLS.items():
        conn.exec_driver_sql("INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES (?, ?, ?)", (table, index, stat))
    conn.exec_driver_sql("ANALYZE sqlite_schema")  # the planner reads them again


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_promotion_reads_start_from_the_versions_calls(store) -> None:
    """No table scanned, and the calls read by version or by trajectory (SQLite's plan)."""
    db, writer = store
    for i in range(20):
        await trajectory(writer, f"t{i}", [i % 3], i, 0.1 * i, eval=i % 4 == 0)
    await db.optimize()
    await db.transaction(at_a_million_calls)
    plans: list[str] = []

    def explain(conn: Any, read: Any, *args: Any, **kwargs: Any) -> None:
        caught: list[tuple[str, Any]] = []
        listen = lambda *a: caught.append(a[2:4])  # noqa: E731 (statement, parameters)
        event.listen(conn.engine, "before_cursor_execute", listen)
        try:
            read(conn, *args, **kwargs)
        finally:
            event.remove(conn.engine, "before_cursor_execute", listen)
        for statement, parameters in caught:
            plans.extend(row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters))

    await db.read(lambda conn: explain(conn, promotion.samples, "agent", [1, 2], since=START + timedelta(minutes=10)))
    await db.read(lambda conn: explain(conn, promotion.latest_sample, "agent", 1, 3))
    assert any("ix_calls_version" in line for line in plans), plans
    await db.read(lambda conn: explain(conn, promotion.samples, "agent", [1, 2], held_out=True))
    await db.read(lambda conn: explain(conn, evals.scores_by_step, "agent"))
    assert not [line for line in plans if line.startswith("SCAN") and "anon" not in line], plans
    # The held-out reads: the versions' settled entries alone, and the unsettled trajectories.
    assert any("COVERING INDEX ix_held_out_version" in line for line in plans), plans
    assert any("ix_trajectories_unscored" in line for line in plans), "\n".join(plans)
    assert not any("ix_trajectories_eval" in line for line in plans), plans
