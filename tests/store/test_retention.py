"""Retention: a project's setting over the admin API, `burnish db prune` and `burnish db restore`,
on SQLite and PostgreSQL, alone and beside live traffic through the real gateway."""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select, update

from burnish_server.cli.db import ArchiveWriter, prune_store, read_archive
from burnish_server.cli.main import main as burnish
from burnish_server.core.learning.policies import Policy
from burnish_server.core.platform.access import PROJECT_RULE
from burnish_server.core.platform.archive import FORMAT, ArchivedCall, ArchivedGroup, ArchivedReward, ArchivedTrajectory, ArchivedVerdict, decode, encode
from burnish_server.core.platform.errors import Conflict
from burnish_server.core.platform.retention import Retention
from burnish_server.core.protocols.packed import pack_floats, pack_ids
from burnish_server.store import retention
from burnish_server.store.database import Database
from burnish_server.store.models import Call, Group, PolicyRow, Reward, RulerVerdict, StepRow, Trajectory
from burnish_server.store.policies import create_policy
from burnish_server.store.writer import Writer
from burnish_server.store.writes import CloseGroup, PostCallReward, PostReward
from tests.conftest import Gateway
from tests.records import chat_call
from tests.upstream import Upstream

DAY = timedelta(days=1)


def _call(tid: str, i: int = 0, *, group: str | None = None, size: int | None = None, policy: str | None = None, step: int | None = None) -> Any:
    now = datetime.now(UTC)
    request = {"model": "agent", "messages": [{"role": "user", "content": f"{tid} turn {i}"}]}
    response = {"id": f"c-{i}", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
    return chat_call(
        request,
        response,
        trajectory_id=tid,
        group_id=group,
        group_size=size,
        policy=policy,
        policy_step=step,
        usage={"prompt_tokens": 3, "completion_tokens": 1},
        prompt_token_ids=pack_ids([1, 2, 3]),
        completion_token_ids=pack_ids([4]),
        completion_logprobs=pack_floats([-0.5]),
        completion_lengths=pack_ids([1]),
        started_at=now + timedelta(milliseconds=i),
        finished_at=now + timedelta(milliseconds=i + 1),
    )


def in_store(url: str, fn: Callable[[Database, Writer], Any]) -> Any:
    """``fn(db, writer)`` against a migrated store, in an event loop of its own."""

    async def run() -> Any:
        db = Database(url)
        await db.migrate()
        writer = Writer(db)
        writer.start()
        try:
            return await fn(db, writer)
        finally:
            await writer.close()
            await db.dispose()

    return asyncio.run(run())


def _backdate(conn: Any, days: float) -> None:
    """Every row there is now, ``days`` older."""
    at = datetime.now(UTC) - timedelta(days=days)
    conn.execute(update(Call).values(started_at=at, finished_at=at))
    conn.execute(update(Trajectory).values(created_at=at, updated_at=at))
    conn.execute(update(Trajectory).where(Trajectory.rewarded_at.is_not(None)).values(rewarded_at=at))
    conn.execute(update(Reward).values(created_at=at))
    conn.execute(update(Group).values(created_at=at))
    conn.execute(update(Group).where(Group.closed_at.is_not(None)).values(closed_at=at))
    conn.execute(update(Group).where(Group.trained_at.is_not(None)).values(trained_at=at))
    conn.execute(update(RulerVerdict).values(created_at=at))


def _policy_history(conn: Any) -> None:
    """agent: step 1 from the base, step 2 from 1 (served), step 3 from 1 (rolled back)."""
    create_policy(conn, Policy(name="agent", base_model="tiny"))
    for step, parent, decision in ((1, 0, None), (2, 1, "promoted"), (3, 1, "rolled_back")):
        conn.execute(
            insert(StepRow).values(policy="agent", step=step, parent=parent, groups=[], metrics={}, checkpoint=f"/c/{step}", trainer="t", decision=decision)
        )
    conn.execute(update(PolicyRow).where(PolicyRow.name == "agent").values(step=2, head=2))


async def _populate(db: Database, writer: Writer) -> None:
    """Old data of every kind, ten days old, then new data."""
    await db.transaction(_policy_history)
    # Ungrouped, in two projects; one with a reward, one with a call's reward.
    for k in range(6):
        await writer.write(_call(f"old-{k}", 0))
        await writer.write(_call(f"old-{k}", 1))
        await writer.write(_call(f"team-a/old-{k}", 0))
    await writer.write(PostReward("old-0", 0.5, {"x": 1.0}))
    await writer.write(PostCallReward("old-1", 0, 1.0))
    # Groups of two, closed by their rewards.
    for name, rewards in {"tied": (1, 1), "ready": (0, 1), "trained1": (0, 1), "trained2": (0, 1), "trained3": (0, 1), "claimed": (0, 1)}.items():
        for m in range(2):
            await writer.write(_call(f"{name}-{m}", 0, group=f"g-{name}", size=2, policy="agent", step=0))
        for m in range(2):
            await writer.write(PostReward(f"{name}-{m}", rewards[m]))
    # An open group; a group with a member active now (below); a group closed by hand with a verdict.
    await writer.write(_call("open-0", 0, group="g-open", size=3, policy="agent"))
    for m in range(2):
        await writer.write(_call(f"busy-{m}", 0, group="g-busy", size=2))
        await writer.write(_call(f"judged-{m}", 0, group="g-judged", size=2))
    await writer.write(CloseGroup("g-busy"))
    await writer.write(CloseGroup("g-judged"))

    def train(conn: Any) -> None:
        for name, step in (("trained1", 1), ("trained2", 2), ("trained3", 3)):
            conn.execute(update(Group).where(Group.id == f"g-{name}").values(trained_at=datetime.now(UTC), trained_step=step, claimed_by="t"))
        conn.execute(update(Group).where(Group.id == "g-claimed").values(claimed_by="t", claimed_at=datetime.now(UTC)))
        conn.execute(insert(RulerVerdict).values(key="v1", judge="j", scores={"judged-0": {"score": 1}}))
        conn.execute(update(Group).where(Group.id == "g-judged").values(ruler_key="v1", ruler_at=datetime.now(UTC)))
        _backdate(conn, 10)

    await db.transaction(train)
    # New: a trajectory of today, and a call today to a member of g-busy.
    await writer.write(_call("new-0", 0))
    await writer.write(_call("team-a/new-0", 0))
    await writer.write(_call("busy-0", 1, group="g-busy"))


OLD_GONE = {
    *(f"old-{k}" for k in range(6)),
    *(f"{g}-{m}" for g in ("tied", "trained3", "judged") for m in range(2)),
}
OLD_KEPT = {"ready-0", "ready-1", "trained1-0", "trained1-1", "trained2-0", "trained2-1", "claimed-0", "claimed-1", "open-0", "busy-0", "busy-1", "new-0"}


def dump(conn: Any, ids: set[str] | None = None) -> dict[str, Any]:
    """Every trajectory (of ``ids``) with its calls, rewards, group and verdict, keys left out
    (a restored call gets a new one; a reward names its call by its place), and what a group
    lacks to train (worked out again after a restore)."""
    out: dict[str, Any] = {}
    query = select(Trajectory) if ids is None else select(Trajectory).where(Trajectory.id.in_(ids))
    for t in conn.execute(query):
        row = {k: v for k, v in t._mapping.items() if k != "pk"}
        calls = conn.execute(select(Call).where(Call.trajectory_id == t.id).order_by(Call.started_at, Call.pk)).all()
        places = {c.pk: i for i, c in enumerate(calls)}
        row["calls"] = [{k: v for k, v in c._mapping.items() if k != "pk"} for c in calls]
        rewards = conn.execute(select(Reward).where(Reward.trajectory_id == t.id).order_by(Reward.pk)).all()
        row["rewards"] = [{k: (places[v] if k == "call_pk" and v is not None else v) for k, v in r._mapping.items() if k != "pk"} for r in rewards]
        if t.group_id:
            group = conn.execute(select(Group).where(Group.id == t.group_id)).one()
            row["group"] = {k: v for k, v in group._mapping.items() if k not in ("pk", "lacks")}
            if group.ruler_key:
                verdict = conn.execute(select(RulerVerdict).where(RulerVerdict.key == group.ruler_key)).one()
                row["verdict"] = {k: v for k, v in verdict._mapping.items() if k != "pk"}
        out[t.id] = row
    return out


def _prune(db: Database, path: Path | None, project: str = "default", days: float = 1, include_trained: bool = False, batch: int = 3) -> Any:
    writer = ArchiveWriter(path) if path is not None else None
    try:
        return asyncio.run(_prune_async(db, project, days, include_trained, writer, batch))
    finally:
        if writer is not None:
            writer.close()


async def _prune_async(db: Database, project: str, days: float, include_trained: bool, writer: ArchiveWriter | None, batch: int) -> Any:
    return await prune_store(db, project, days, include_trained, writer, batch=batch)


def _ids(url: str) -> set[str]:
    return set(in_store(url, lambda db, w: db.read(lambda c: set(c.execute(select(Trajectory.id)).scalars()))))


def _dump(url: str, ids: set[str] | None = None) -> dict[str, Any]:
    return in_store(url, lambda db, w: db.read(dump, ids))


def _cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(burnish, list(args), env=env, catch_exceptions=False)


# ---- the archive's format ---------------------------------------------------------------------


def test_the_archive_has_a_field_for_every_column() -> None:
    """A column the archive lacked would be lost by a prune and a restore."""
    for table, (columns, fields) in retention.archived_columns().items():
        assert set(columns) == set(fields), table


def test_an_archived_record_round_trips_and_refuses_what_no_store_holds() -> None:
    at = datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    group = ArchivedGroup(
        id="p/g1", project="p", expected_size=2, created_at=at, closed_at=at, close_reason="complete", policy="agent", claimed_by=None,
        claimed_at=None, trained_at=None, trained_step=None, ruler_at=at, ruler_key="k", ruler_error=None, eval=False,
    )  # fmt: skip
    call = ArchivedCall(
        pk=7, endpoint="chat.completions", model="m", policy=None, policy_step=None, upstream_model=None, stream=False, status="ok", http_status=200,
        error=None, request=b'{"a":"\\u00e9"}', response=b"\x00\xff", usage=None, prompt_token_ids=pack_ids([1]), completion_token_ids=None,
        completion_logprobs=None, completion_lengths=None, attempts=1, upstream_first_byte_ms=1.5, upstream_ms=2.0, started_at=at, finished_at=at,
        response_id=None,
    )  # fmt: skip
    record = ArchivedTrajectory(
        id="p/t1", project="p", group_id="p/g1", created_at=at, updated_at=at, reward=1.0, reward_components={"a": 1.0}, rewarded_at=at, eval=False,
        calls=[call], rewards=[ArchivedReward(call_pk=7, reward=1.0, components=None, source="user", explanation=None, created_at=at)],
        group=group, verdict=ArchivedVerdict(key="k", judge="j", scores={"p/t1": {"score": 1}}, created_at=at),
    )  # fmt: skip
    line = encode(record)
    assert b"\n" not in line and msgspec.json.decode(line)["format"] == FORMAT
    assert decode(line) == record
    hostile = {
        "id": "other/t1",  # not its project's
        "project": "no/slash",
        "group_id": "p/g2",  # not its group's
    }
    for key, value in hostile.items():
        with pytest.raises(ValueError):
            decode(msgspec.json.encode({**msgspec.to_builtins(record), key: value}))
    with pytest.raises(ValueError, match="names a call"):
        decode(encode(msgspec.structs.replace(record, rewards=[msgspec.structs.replace(record.rewards[0], call_pk=8)])))
    with pytest.raises(ValueError):
        decode(b'{"format": "burnish.archive/2"}')


# ---- prune and restore, in the store ----------------------------------------------------------


def test_prune_keeps_what_it_must_and_restore_puts_back_every_row(database_url: str, tmp_path: Path) -> None:
    in_store(database_url, _populate)
    before = _dump(database_url)
    archive = tmp_path / "a.jsonl"
    db = Database(database_url)
    counts = _prune(db, archive)
    asyncio.run(db.dispose())
    left = _ids(database_url)
    assert not left & OLD_GONE
    assert OLD_KEPT <= left and {f"team-a/old-{k}" for k in range(6)} <= left  # another project untouched
    assert (counts.trajectories, counts.groups, counts.calls, counts.rewards) == (12, 3, 12 + 6, 2 + 2 + 2)
    assert (counts.kept_trained, counts.kept_ready, counts.kept_open, counts.kept_changed) == (2, 2, 1, 0)
    # The verdict went with its group; the others' rows stayed as they were.
    assert in_store(database_url, lambda db, w: db.read(lambda c: c.execute(select(RulerVerdict.key)).all())) == []
    assert _dump(database_url, OLD_KEPT) == {k: before[k] for k in OLD_KEPT}

    records = list(read_archive(archive))
    assert {r.id for r in records} == OLD_GONE
    assert _cli("db", "restore", str(archive), "--database-url", database_url).output.endswith(
        "12 trajectories: 12 restored, 0 already in the store (skipped)\n"
    )
    assert _dump(database_url) == before
    # Again: nothing changes.
    assert "0 restored, 12 already in the store (skipped)" in _cli("db", "restore", str(archive), "--database-url", database_url).output
    assert _dump(database_url) == before


def test_what_a_kept_version_trained_on_goes_when_asked(database_url: str, tmp_path: Path) -> None:
    in_store(database_url, _populate)
    db = Database(database_url)
    counts = _prune(db, tmp_path / "a.jsonl.gz", include_trained=True, batch=100)
    asyncio.run(db.dispose())
    left = _ids(database_url)
    assert not left & {"trained1-0", "trained2-1", "trained3-0"}
    assert {"ready-0", "claimed-0", "open-0", "busy-0"} <= left
    assert counts.kept_trained == 0 and counts.groups == 5
    with gzip.open(tmp_path / "a.jsonl.gz") as f:
        assert len(f.read().splitlines()) == counts.trajectories == 16


def test_a_project_setting_and_the_default_decide_what_prune_removes(database_url: str, tmp_path: Path) -> None:
    in_store(database_url, _populate)
    in_store(database_url, lambda db, w: db.transaction(retention.set_retention, "team-a", Retention(days=5)))
    out = _cli("db", "prune", "--database-url", database_url, "--archive", str(tmp_path / "a.jsonl")).output
    assert "team-a: removed 6 trajectories" in out and "kept whole (no retention set): default" in out
    assert not _ids(database_url) & {f"team-a/old-{k}" for k in range(6)} and "old-0" in _ids(database_url)
    # The server's default reaches the projects without a setting of their own.
    out = _cli("db", "prune", "--database-url", database_url, "--archive", str(tmp_path / "b.jsonl"), env={"BURNISH_RETENTION_DAYS": "30"}).output
    assert "default: removed 0 trajectories" in out
    out = _cli("db", "prune", "--database-url", database_url, "--archive", str(tmp_path / "c.jsonl"), env={"BURNISH_RETENTION_DAYS": "2"}).output
    assert "default: removed 12 trajectories" in out
    assert "team-a: removed 0 trajectories" in out  # its own 5 days apply
    # A project set to the default again (days null) takes it.
    in_store(database_url, lambda db, w: db.transaction(retention.set_retention, "team-a", Retention(days=None)))
    out = _cli("db", "prune", "--database-url", database_url, "--dry-run").output
    assert out.startswith("nothing to prune")


def test_a_dry_run_changes_nothing_and_writes_nothing(database_url: str, tmp_path: Path) -> None:
    in_store(database_url, _populate)
    before = _dump(database_url)
    out = _cli("db", "prune", "--database-url", database_url, "--data-dir", str(tmp_path / "data"), "--older-than", "1", "--dry-run").output
    assert "default: would remove 12 trajectories (18 calls, 6 rewards, 3 groups) idle for more than 1 days" in out
    assert "2 groups a kept version trained on" in out and "1 group still open" in out
    assert "team-a: would remove 6 trajectories" in out
    assert _dump(database_url) == before and not (tmp_path / "data").exists()
    out = _cli("db", "prune", "--database-url", database_url, "--older-than", "1", "--project", "team-a", "--data-dir", str(tmp_path / "data")).output
    archives = list((tmp_path / "data" / "archives").iterdir())
    assert len(archives) == 1 and archives[0].name.endswith(".jsonl.gz") and f"archive: {archives[0]} (6 trajectories" in out


def test_a_trajectory_that_changes_between_read_and_delete_stays(database_url: str, tmp_path: Path) -> None:
    in_store(database_url, _populate)

    async def race(db: Database, writer: Writer) -> Any:
        cut = datetime.now(UTC) - DAY
        batch = await db.read(
            lambda c: retention.select_batch(c, "default", cut, include_trained=False, after_trajectory=0, after_group=0, limit=100, kept=None)
        )
        await db.read(retention.read_batch, batch.units)
        await writer.write(_call("old-3", 5))  # a call comes meanwhile
        with pytest.raises(Conflict):
            await writer.write(PostReward("judged-0", 1.0))  # refused (closed group): nothing changes
        archived: list[Any] = []
        return await db.transaction(retention.delete_batch, batch.units, archived.extend), archived

    (counts, going), archived = in_store(database_url, race)
    assert counts.kept_changed == 1 and "old-3" in _ids(database_url)
    assert {r.id for r in archived} == OLD_GONE - {"old-3"} and len(going) == 8


def test_a_failed_archive_deletes_nothing(database_url: str) -> None:
    in_store(database_url, _populate)
    before = _dump(database_url)

    def broken(records: list[Any]) -> None:
        raise OSError("disk full")

    async def run(db: Database, writer: Writer) -> None:
        cut = datetime.now(UTC) - DAY
        batch = await db.read(lambda c: retention.select_batch(c, "default", cut, include_trained=False, after_trajectory=0, after_group=0, limit=100))
        await db.read(retention.read_batch, batch.units)
        with pytest.raises(OSError, match="disk full"):
            await db.transaction(retention.delete_batch, batch.units, broken)

    in_store(database_url, run)
    assert _dump(database_url) == before


def test_parquet_archive_round_trips(sqlite_url: str, tmp_path: Path) -> None:
    # pyarrow is in the test extra: absent, this fails rather than skips (a skip proves nothing).
    in_store(sqlite_url, _populate)
    before = _dump(sqlite_url)
    out = _cli("db", "prune", "--database-url", sqlite_url, "--older-than", "1", "--archive", str(tmp_path / "a.parquet"))
    assert "archive:" in out.output and not (tmp_path / "a.parquet.partial.jsonl").exists()
    assert _cli("db", "restore", str(tmp_path / "a.parquet"), "--database-url", sqlite_url).output.endswith("18 restored, 0 already in the store (skipped)\n")
    assert _dump(sqlite_url) == before


# ---- hostile input ------------------------------------------------------------------------------


@pytest.mark.parametrize("days", ["-1", "0", "nan", "inf", "1e9", "abc", ""])
def test_bad_days_are_refused(sqlite_url: str, days: str) -> None:
    r = CliRunner().invoke(burnish, ["db", "prune", "--database-url", sqlite_url, "--older-than", days, "--dry-run"])
    assert r.exit_code == 2 and "--older-than" in r.output and "Traceback" not in r.output, r.output


def test_bad_archive_paths_and_projects_are_refused(sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "taken.jsonl").write_text("")
    (tmp_path / "ro").mkdir(mode=0o500)
    cases = {
        str(tmp_path / "nowhere" / "a.jsonl"): "is not a folder",
        str(tmp_path / "taken.jsonl"): "is never overwritten",
        str(tmp_path / "a.csv"): "name it *.jsonl, *.jsonl.gz or *.parquet",
        str(tmp_path): "",  # a folder: click refuses it
    }
    if os.geteuid() != 0:
        cases[str(tmp_path / "ro" / "a.jsonl")] = "is not writable"
    for path, why in cases.items():
        r = CliRunner().invoke(burnish, ["db", "prune", "--database-url", sqlite_url, "--older-than", "1", "--archive", path])
        assert r.exit_code == 2 and why in r.output and "Traceback" not in r.output, (path, r.output)
    r = CliRunner().invoke(burnish, ["db", "prune", "--database-url", sqlite_url, "--older-than", "1", "--project", "a/b"])
    assert r.exit_code == 2 and "is not a project name" in r.output


def test_a_corrupt_archive_restores_nothing_and_says_where(sqlite_url: str, tmp_path: Path) -> None:
    in_store(sqlite_url, _populate)
    archive = tmp_path / "a.jsonl"
    _cli("db", "prune", "--database-url", sqlite_url, "--older-than", "1", "--archive", str(archive))
    before = _dump(sqlite_url)
    lines = archive.read_bytes().splitlines()
    bad_cases = {
        "not json": b"{nope",
        "not an archived trajectory": b'{"format": "burnish.archive/1", "id": "x"}',
        "another version": lines[0].replace(b"burnish.archive/1", b"burnish.archive/9"),
        "an id out of its project": lines[0].replace(b'"project":"default"', b'"project":"team-b"'),
    }
    for what, bad in bad_cases.items():
        corrupt = tmp_path / f"corrupt-{len(bad)}.jsonl"
        corrupt.write_bytes(b"\n".join([lines[0], bad, *lines[1:]]) + b"\n")
        r = CliRunner().invoke(burnish, ["db", "restore", str(corrupt), "--database-url", sqlite_url])
        assert r.exit_code == 1 and f"{corrupt}, line 2: not an archived trajectory" in r.output and "Traceback" not in r.output, (what, r.output)
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"\x1f\x8b" + bytes(range(64)))  # gzip's magic, then no gzip header (random bytes could read as one)
    r = CliRunner().invoke(burnish, ["db", "restore", str(garbage), "--database-url", sqlite_url])
    assert r.exit_code == 1 and "not a readable archive" in r.output, r.output
    r = CliRunner().invoke(burnish, ["db", "restore", str(tmp_path / "missing.jsonl"), "--database-url", sqlite_url])
    assert r.exit_code == 2 and "does not exist" in r.output
    assert _dump(sqlite_url) == before  # nothing restored from any of them
    # A gzip archive cut short (a prune killed before it closed it) restores its whole lines.
    whole = gzip.compress(b"".join(line + b"\n" for line in lines))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[:-8])  # the trailer lost
    r = _cli("db", "restore", str(cut), "--database-url", sqlite_url)
    assert "ends early" in r.output and f"{len(lines)} restored" in r.output


# ---- the admin route ----------------------------------------------------------------------------


def test_the_retention_route_sets_and_reads_a_projects_setting(make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream) -> None:
    gw = make_gateway(database_url, retention_days=30)
    with gw.admin() as c:
        r = c.get("/admin/projects/team-a/retention")
        assert r.status_code == 200, r.text
        assert r.json() == {"project": "team-a", "days": None, "prune_trained": False, "effective_days": 30.0, "source": "default", "updated_at": None}
        r = c.put("/admin/projects/team-a/retention", json={"days": 7.5, "prune_trained": True})
        assert r.status_code == 200 and r.json()["effective_days"] == 7.5 and r.json()["source"] == "project" and r.json()["updated_at"]
        assert c.get("/admin/projects/team-a/retention").json()["prune_trained"] is True
        for body in ({"days": 0}, {"days": -1}, {"days": "7"}, {"days": 1e9}, {"keep": 3}, [], {"prune_trained": "yes"}):
            r = c.put("/admin/projects/team-a/retention", json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_retention", (body, r.text)
        r = c.put("/admin/projects/team-a/retention", content=b"{")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        for project in ("a.b", "-a", "x" * 65):
            r = c.get(f"/admin/projects/{project}/retention")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_id", (project, r.text)
            assert r.json()["error"]["message"] == f"invalid project: use {PROJECT_RULE}"  # the project's rule, not an id's
        # Only the admin can: keys of other scopes, and no key, are refused.
        keys = {s: c.post("/admin/keys", json={"name": s, "project": "team-a", "scopes": [s]}).json()["secret"] for s in ("call", "read", "metrics")}
    for scope, key in keys.items():
        with gw.client(headers={"authorization": f"Bearer {key}"}) as c:
            for method in ("GET", "PUT"):
                r = c.request(method, "/admin/projects/team-a/retention", json={"days": 1})
                assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope", (scope, r.text)
    with gw.client() as c:
        assert c.put("/admin/projects/team-a/retention", json={"days": 1}).status_code == 401
    with gw.admin() as c:
        assert c.get("/admin/projects/team-a/retention").json()["days"] == 7.5  # unchanged
    out = _cli("db", "prune", "--database-url", gw.settings.resolved_database_url, "--dry-run").output
    assert "team-a: would remove 0 trajectories" in out


# ---- beside live traffic ------------------------------------------------------------------------


def test_prune_beside_live_traffic_loses_no_call_and_answers_no_error(
    make_gateway: Callable[..., Gateway], database_url: str, upstream: Upstream, tmp_path: Path
) -> None:
    """Calls and rewards through the gateway, to new trajectories and to old ones being pruned,
    while `burnish db prune` runs in its own process: every call answered 200 and recorded, the
    old trajectories archived and gone, and the archive restores them to equal rows."""

    async def old(db: Database, writer: Writer) -> None:
        for k in range(300):
            await writer.write(_call(f"old-{k}", 0))
            await writer.write(_call(f"old-{k}", 1))
        for g in range(40):
            for m in range(2):
                await writer.write(_call(f"gold-{g}-{m}", 0, group=f"gold-{g}", size=2))
                await writer.write(PostReward(f"gold-{g}-{m}", 1.0))
        await db.transaction(_backdate, 10)

    in_store(database_url, old)
    hit = {f"old-{k}" for k in range(0, 300, 25)}  # old trajectories that get a call during the prune
    untouched = {f"old-{k}" for k in range(300)} - hit | {f"gold-{g}-{m}" for g in range(40) for m in range(2)}
    before = _dump(database_url, untouched)
    gw = make_gateway(database_url)
    archive = tmp_path / "live.jsonl.gz"
    env = {**os.environ, "BURNISH_DATABASE_URL": database_url}
    prune = subprocess.Popen(
        [sys.executable, "-m", "burnish_server.cli", "db", "prune", "--older-than", "1", "--batch", "10", "--archive", str(archive)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    statuses: list[int] = []
    sent: dict[str, int] = {}
    lock = threading.Lock()

    def traffic(worker: int) -> None:
        with httpx.Client(base_url=gw.url, timeout=60) as c:
            i = 0
            while prune.poll() is None or i < 20:
                tid = sorted(hit)[i % len(hit)] if i % 4 == 0 else f"live-{worker}-{i % 7}"
                r = c.post(f"/t/{tid}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": f"{worker}-{i}"}]})
                rewarded = c.post(f"/v1/trajectories/{tid}/reward", json={"reward": 0.5})
                with lock:
                    statuses.extend([r.status_code, rewarded.status_code])
                    if r.status_code == 200:
                        sent[tid] = sent.get(tid, 0) + 1
                i += 1

    threads = [threading.Thread(target=traffic, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    out, _ = prune.communicate(timeout=300)
    for t in threads:
        t.join(timeout=120)
    assert prune.returncode == 0, out
    assert set(statuses) == {200}, sorted(set(statuses))
    assert len(statuses) > 100  # the traffic overlapped the prune

    def recorded(conn: Any) -> tuple[set[str], dict[str, int]]:
        ids = set(conn.execute(select(Trajectory.id)).scalars())
        per = dict(conn.execute(select(Call.trajectory_id, func.count()).group_by(Call.trajectory_id)).all())
        return ids, per

    ids, calls = in_store(database_url, lambda db, w: db.read(recorded))
    archived = {r.id: r for r in read_archive(archive)}
    assert not ids & untouched and untouched <= set(archived)
    for tid, n in sent.items():
        # Every call made is in the store, or (for an old one pruned in the same moment) in the archive.
        old_calls = 2 if tid in hit else 0
        in_archive = len(archived[tid].calls) if tid in archived else 0
        assert calls.get(tid, 0) + in_archive == n + old_calls, (tid, calls.get(tid), in_archive, n)
    assert "removed" in out and "archive:" in out
    r = _cli("db", "restore", str(archive), "--database-url", database_url)
    assert "Traceback" not in r.output
    assert _dump(database_url, untouched) == before
