"""The dashboard's pages (``/ui``) served by a real gateway on a store of a million calls: each page's time at p50 and p95.

Run from the repository root (about 15 minutes for both databases at a million calls: a minute and
a half to fill each, the rest mostly the slow pages; SQLite in /tmp/bench_dashboard.db, about 4 GB;
on PostgreSQL a database ``bench_dashboard`` is made on BURNISH_TEST_PG_URL's server; both are
removed at the end unless ``--keep``)::

    .venv/bin/python bench/dashboard_pages.py [--calls 1000000] [--database sqlite|postgresql|both]

The store is ``bench/promotion_queries.py``'s month of traffic (its ``Traffic``, ``fill`` and
``add_policies``: 4 calls per trajectory on average, five policies through steps 0 to 20, ``agent``
serving 18 with 20 on a canary trial, 5% held out), with what the dashboard reads besides:

* groups: 90% of the trained-on trajectories and all held-out ones, in groups of 4 to 8 of one
  policy's trajectories begun one after another (each group's row names its policy). Groups older
  than two hours are mostly trained (88%, at the step that followed the one serving when they
  closed), some closed and never trained (8%: their members tied) or left open (4%); the last two
  hours hold open, closed, training and trained ones. Held-out groups are closed (90%) or open.
  Members of a closed, training or trained group are all rewarded, of an open one some; a loose
  trajectory as ``Traffic`` says (60%);
* a ``rewards`` row per rewarded trajectory (RULER's for a fifth of the groups), and one on a
  call for 2% of them (credit per turn);
* steps with the metrics the trainer writes (``trainer/models.py``), and a sixth policy,
  ``longrun``, with ``--long-steps`` steps and no traffic: what a page that lists every step
  costs once a policy has trained for long;
* token ids and logprobs that read as such (int32 ids below 49,152, float32 logprobs below 0).

SQLite gets its statistics from the gateway itself (``Database.optimize`` at its start, sampled
rows); PostgreSQL is vacuumed and analyzed after the fill, as autovacuum would have done. *first*
is the first request to a page: for a policy's pages, the snapshot of its status being read
(``gateway/ui/status.py``); later requests read the snapshot, refreshed in the background.

A gateway is started in this process on the store (``create_app``, migrations at start, the
upstream unreachable: nothing on ``/ui`` but the token view asks it anything), signed in with the
admin token, and each page is asked ``--repeat`` times one after another over loopback with httpx
after ``--warmup`` requests (the page cache and the gateway warm). Two times per request:
*client*, the wall time from sending the request to having read the whole body (httpx over
loopback), and *app*, the time inside the ASGI app from the request's arrival to its last body
byte (a wrapper around the app; no Server-Timing header exists). The table has p50 and p95 of
both, the page's size, the requests timed (fewer for a page that takes seconds: ``--page-seconds``)
and whether the client's p95 is under the budget (the dashboard's budget, docs/dashboard.md: 100 ms). For every page
over the budget (all pages with ``--plans all``) the page is asked once more with the statements it ran caught on the reader engine; each is run again alone
(its time within the page also holds waits for the event loop), and the slowest are shown with
both times and their plans (SQLite: EXPLAIN QUERY PLAN; PostgreSQL: EXPLAIN ANALYZE, BUFFERS).

The token view (``/ui/trajectories/{id}/calls/{i}/tokens``) is timed with the upstream refusing
connections: the page falls back to the ids; with vLLM up it would also wait for /detokenize
on the pieces it has not seen.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
from sqlalchemy import create_engine, event, insert, make_url, text, update

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.servers: the gateway on a loopback socket, in a thread

from promotion_queries import BASE_MODEL, CANDIDATE, DAYS, NAMES, PG_SERVER, SERVED, STEPS, Traffic, add_policies, admin, fill  # noqa: E402

from burnish_server.core.learning.drift import REASONS  # noqa: E402
from burnish_server.core.learning.policies import LoraSettings, PromotionSettings, TrainSettings  # noqa: E402
from burnish_server.core.platform.settings import Settings  # noqa: E402
from burnish_server.gateway.app import create_app  # noqa: E402
from burnish_server.store.database import Database  # noqa: E402
from burnish_server.store.evals import any_unscored, settle_unscored  # noqa: E402
from burnish_server.store.models import Group, PolicyRow, Reward, StepRow  # noqa: E402
from burnish_server.store.training import lacks  # noqa: E402
from tests.servers import ServerThread  # noqa: E402

SQLITE_PATH = Path("/tmp/bench_dashboard.db")
PG_DATABASE = "bench_dashboard"
ADMIN_TOKEN = "bench-dashboard-admin"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused
BUDGET_MS = 100.0
MIN_REPEAT = 5
VOCAB = 49_152
LOOSE = 0.10  # trained-on trajectories in no group
RECENT_S = 2 * 3600  # groups younger than this are still open, closed or training


class DashboardTraffic(Traffic):
    """``Traffic`` with groups, rewards as groups have them, and token arrays that read as tokens."""

    def __init__(self, n: int, seed: int, start: Any, body_bytes: int) -> None:
        super().__init__(n, seed, start, body_bytes)
        rng = np.random.default_rng(seed + 1000)
        for entry in self.pool:  # the same lengths as Traffic drew, as int32 ids and float32 logprobs
            prompt, sampled = len(entry["prompt_token_ids"]) // 4, len(entry["completion_token_ids"]) // 4
            entry["prompt_token_ids"] = rng.integers(0, VOCAB, prompt).astype("<i4").tobytes()
            entry["completion_token_ids"] = rng.integers(0, VOCAB, sampled).astype("<i4").tobytes()
            entry["completion_logprobs"] = (-rng.exponential(0.6, sampled)).astype("<f4").tobytes()
            entry["completion_lengths"] = np.array([sampled], "<i4").tobytes()
        end = float(self.started.max())
        self.end = end
        # Each trajectory's first call's pk: calls are inserted in the order they began, pks from 1.
        self.first_call_pk = np.full(self.t, -1)
        firsts = np.unique(self.traj, return_index=True)
        self.first_call_pk[firsts[0]] = firsts[1] + 1
        self.group_of = np.full(self.t, -1)
        rewarded, reward = self.rewarded.copy(), self.reward.copy()
        made: list[tuple[float, dict[str, Any], np.ndarray]] = []
        for p, name in enumerate(NAMES):
            for held_out in (False, True):
                members = np.flatnonzero((self.policy == p) & (self.eval == held_out))
                if not held_out:
                    members = members[rng.random(len(members)) >= LOOSE]
                sizes = rng.integers(4, 9, len(members) // 4 + 1)
                bounds = np.concatenate(([0], np.cumsum(sizes)))
                bounds = bounds[bounds < len(members)].tolist() + [len(members)]
                for lo, hi in zip(bounds[:-1], bounds[1:]):
                    group = members[lo:hi]
                    made.append((float(self.begun[group[0]]), self._group(rng, name, held_out, group, rewarded, reward), group))
        made.sort(key=lambda m: m[0])  # pks in the order the groups began, as a gateway makes them
        self.groups = []
        for k, (_, row, group) in enumerate(made):
            row["id"] = f"group-{seed}{k:012x}"
            self.group_of[group] = k
            self.groups.append(row)
        self.rewarded, self.reward = rewarded, reward

    def _group(self, rng: np.random.Generator, name: str, held_out: bool, group: np.ndarray, rewarded: np.ndarray, reward: np.ndarray) -> dict[str, Any]:
        created = float(self.begun[group[0]])
        recent = self.end - created < RECENT_S
        if held_out:
            state = "closed" if rng.random() < 0.9 else "open"
        elif recent:
            state = rng.choice(["open", "closed", "training", "trained"], p=[0.4, 0.3, 0.1, 0.2])
        else:
            state = rng.choice(["trained", "closed", "open"], p=[0.88, 0.08, 0.04])
        if state == "open":
            rewarded[group] = rng.random(len(group)) < 0.5
            rewarded[group[-1]] = False
        else:
            rewarded[group] = True
            if state == "closed" and not held_out and not recent:  # tied: never ready
                reward[group] = 1.0
        closed = float(self.rewarded_at[group].max())
        row: dict[str, Any] = dict(project="default", expected_size=len(group), created_at=self.at(created), policy=name, eval=held_out)
        row.update(closed_at=None, close_reason=None, claimed_by=None, claimed_at=None, trained_at=None, trained_step=None)
        row.update(ruler_at=None, ruler_key=None, ruler_error=None)
        if state != "open":
            row.update(closed_at=self.at(closed), close_reason="complete")
        if state in ("training", "trained"):
            row.update(claimed_by="trainer-1", claimed_at=self.at(closed + rng.uniform(5, 120)))
        if state == "trained":
            if name == "agent":
                serving = int(np.clip(np.floor(closed / self.since * (SERVED + 1)), 0, SERVED))
            else:
                serving = int(np.clip(np.floor(closed / (DAYS * 86400) * (STEPS + 1)), 0, STEPS))
            row.update(trained_at=self.at(closed + rng.uniform(130, 300)), trained_step=min(serving + 1, STEPS))
        if state != "open" and rng.random() < 0.2:
            row.update(ruler_at=self.at(closed - 1), ruler_key=f"{rng.integers(0, 2**63):016x}")
        return row

    def trajectories(self, lo: int, hi: int) -> list[dict[str, Any]]:
        rows = super().trajectories(lo, hi)
        for i, row in zip(range(lo, hi), rows):
            k = self.group_of[i]
            row["group_id"] = self.groups[k]["id"] if k >= 0 else None
        return rows

    def rewards(self, rng: np.random.Generator) -> list[dict[str, Any]]:
        rows = []
        for i in np.flatnonzero(self.rewarded):
            k = self.group_of[i]
            ruler = k >= 0 and self.groups[k]["ruler_at"] is not None
            row = dict(trajectory_id=self.ids[i], call_pk=None, reward=float(self.reward[i]), components=None, created_at=self.at(self.rewarded_at[i]))
            rows.append(row | ({"source": "ruler", "explanation": "the answer used the tool's result"} if ruler else {"source": "user", "explanation": None}))
            if k >= 0 and rng.random() < 0.02:  # credit per turn: a reward for the first call alone
                rows.append(row | {"call_pk": int(self.first_call_pk[i]), "reward": 0.5, "source": "user", "explanation": None})
        return rows


def step_metrics(rng: np.random.Generator, step: int) -> dict[str, Any]:
    """What ``trainer/models.py`` writes for a step."""
    tokens = int(rng.integers(20_000, 60_000))
    metrics = dict(reward_mean=0.4 + 0.2 * np.tanh(step / 50) + rng.normal(0, 0.03), reward_std=0.2 + rng.normal(0, 0.02), loss=rng.normal(0, 0.05))
    metrics.update(kl=abs(rng.normal(0.01, 0.005)), entropy=1.2 + rng.normal(0, 0.1), distance_from_base=1e-3 * step, clip_fraction=abs(rng.normal(0.02, 0.01)))
    metrics.update(grad_norm=abs(rng.normal(0.5, 0.2)), tokens=tokens, sequences=int(rng.integers(8, 24)), sequence_splits=int(rng.integers(0, 6)))
    metrics.update(untokenized_calls=0, stale_calls=0, call_rewards=int(rng.integers(0, 2)), ranks=1, logprob_diff_mean=abs(rng.normal(2e-3, 5e-4)))
    metrics.update(outside_clip_fraction=abs(rng.normal(0.01, 0.005)), staleness_mean=abs(rng.normal(0.6, 0.3)), staleness_max=int(rng.integers(0, 3)))
    metrics.update({f"split_{reason}": float(rng.integers(0, 3)) if reason == "history_rewritten" else 0.0 for reason in REASONS})
    metrics.update(seconds_read=0.05, seconds_load=0.2, seconds_batch=0.1, seconds_step=tokens / 4000, seconds_save=0.3, seconds=tokens / 4000 + 0.65, groups=8)
    return {k: float(v) if isinstance(v, np.floating) else v for k, v in metrics.items()}


def add_steps(conn: Any, traffic: DashboardTraffic, long_steps: int) -> None:
    """The five policies' steps get the trainer's metrics and eight of the groups each trained;
    ``longrun`` is made with ``long_steps`` steps (served: the last) and no traffic."""
    rng = np.random.default_rng(7)
    trained: dict[tuple[str, int], list[str]] = {}
    for row in traffic.groups:
        if row["trained_step"] is not None and len(trained.setdefault((row["policy"], row["trained_step"]), [])) < 8:
            trained[(row["policy"], row["trained_step"])].append(row["id"])
    for name in NAMES:
        for step in range(1, STEPS + 1):
            values = {"metrics": step_metrics(rng, step), "groups": trained.get((name, step), [])}
            conn.execute(update(StepRow).where(StepRow.policy == name, StepRow.step == step).values(values))
    if not long_steps:
        return
    settings = {"lora": msgspec.to_builtins(LoraSettings()), "train": msgspec.to_builtins(TrainSettings())}
    row = dict(name="longrun", base_model=BASE_MODEL, promotion=msgspec.to_builtins(PromotionSettings()), paused=False, step=long_steps, head=long_steps)
    conn.execute(insert(PolicyRow).values(row | settings))
    began = traffic.at(0)
    rows = []
    for step in range(1, long_steps + 1):
        at = began + timedelta(seconds=DAYS * 86400 * step / (long_steps + 1))
        row = dict(policy="longrun", step=step, parent=step - 1, groups=[f"longrun-{step}-{i}" for i in range(8)], metrics=step_metrics(rng, step))
        row.update(checkpoint=f"/data/checkpoints/longrun/{step}", trainer="trainer-1", created_at=at, published_at=at, publish_seconds=3.0)
        rows.append(row | dict(decision=None, decided_at=None, decisions=None))
    conn.execute(insert(StepRow), rows)


def bulk(url: str, tables: list[tuple[Any, list[dict[str, Any]]]], chunk: int = 20_000) -> None:
    """Rows into tables as ``promotion_queries.fill`` puts them: executemany on SQLite, COPY on PostgreSQL."""
    if url.startswith("sqlite"):
        engine = create_engine(make_url(url).set(drivername="sqlite"))
        with engine.connect() as conn:
            for table, rows in tables:
                for lo in range(0, len(rows), chunk):
                    conn.execute(insert(table), rows[lo : lo + chunk])
                    conn.commit()
        engine.dispose()
        return

    async def copy() -> None:
        import asyncpg

        conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
        await conn.execute("SET session_replication_role = replica")
        for table, rows in tables:
            for lo in range(0, len(rows), chunk):
                batch = rows[lo : lo + chunk]
                await conn.copy_records_to_table(table.__tablename__, records=[tuple(r.values()) for r in batch], columns=list(batch[0]))
        await conn.close()

    asyncio.run(copy())


class Timed:
    """The app inside an ASGI wrapper that keeps each request's time, arrival to last body byte."""

    def __init__(self, app: Any) -> None:
        self.app, self.last = app, 0.0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        begun = time.perf_counter()

        async def timed(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.last = time.perf_counter() - begun

        await self.app(scope, receive, timed)


class Caught:
    """The statements the gateway's reader engine runs, each with its time."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.on = engine, False
        self.runs: list[tuple[float, str, Any]] = []
        event.listen(engine, "before_cursor_execute", self.before)
        event.listen(engine, "after_cursor_execute", self.after)

    def before(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        conn.info.setdefault("bench_begun", []).append(time.perf_counter())

    def after(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        begun = conn.info["bench_begun"].pop()
        if self.on:
            self.runs.append(((time.perf_counter() - begun) * 1000, statement, parameters))


def explain(conn: Any, statement: str, parameters: Any) -> list[str]:
    if conn.dialect.name == "sqlite":  # a comment of its own: the driver's cached EXPLAIN would show an older plan
        depth, out = {0: 0}, []
        for node, parent, _, detail in conn.exec_driver_sql(f"/* {time.monotonic_ns()} */ EXPLAIN QUERY PLAN {statement}", parameters):
            depth[node] = depth.get(parent, 0) + 1
            out.append("  " * depth[node] + detail)
        return out
    return [line for (line,) in conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {statement}", parameters)]


def targets(conn: Any) -> dict[str, Any]:
    """What the pages name: a typical trajectory (4 calls, a trained group of agent's, from the
    middle of the month), its group, and the middle row of each list for an older page."""
    mid_t = conn.execute(text("SELECT max(pk) / 2 FROM trajectories")).scalar_one()
    # An older page starts after a row's id (the list's `after`, its keyset): the middle one's.
    middle = "SELECT id FROM {0} WHERE pk <= (SELECT max(pk) / 2 FROM {0}) ORDER BY pk DESC LIMIT 1"
    after_t, after_g = (conn.execute(text(middle.format(table))).scalar_one() for table in ("trajectories", "groups"))
    found = conn.execute(
        text(
            "SELECT t.id, t.group_id FROM trajectories t JOIN groups g ON g.id = t.group_id WHERE t.pk < :mid AND g.trained_at IS NOT NULL"
            " AND g.policy = 'agent' AND (SELECT count(*) FROM calls c WHERE c.trajectory_id = t.id AND c.status = 'ok') = 4"
            " AND (SELECT count(*) FROM calls c WHERE c.trajectory_id = t.id) = 4 ORDER BY t.pk DESC LIMIT 1"
        ),
        {"mid": mid_t},
    ).one()
    first = conn.execute(text("SELECT min(created_at) FROM trajectories")).scalar_one()
    return {"trajectory": found[0], "group": found[1], "mid_t": after_t, "mid_g": after_g, "first": first}


def pages(t: dict[str, Any]) -> list[tuple[str, str]]:
    first = datetime.fromisoformat(t["first"]) if isinstance(t["first"], str) else t["first"]
    day = f"created_after={(first + timedelta(days=20)):%Y-%m-%dT%H:%M}&created_before={(first + timedelta(days=21)):%Y-%m-%dT%H:%M}"
    lists = [
        ("", ""),
        (" policy=agent", "policy=agent"),
        (" state=trained", "state=trained"),
        (" eval=true", "eval=true"),
        (" reward_min=0.8", "reward_min=0.8"),
        (" older page (after=middle)", "after={mid}"),
        (" one day (created_after, created_before)", day),
        (" policy=agent version=18", "policy=agent&version=18"),
        (" policy=agent version=1 (old)", "policy=agent&version=1"),
    ]
    out = [("overview (/ui)", "/ui"), (f"policy agent ({STEPS} steps)", "/ui/policies/agent")]
    out.append(("policy longrun (--long-steps)", "/ui/policies/longrun"))
    for kind, mid in (("groups", t["mid_g"]), ("trajectories", t["mid_t"])):
        out += [(f"{kind}{label}", f"/ui/{kind}" + (f"?{query.format(mid=mid)}" if query else "")) for label, query in lists]
    out.append(("one group", f"/ui/groups/{t['group']}"))
    out.append(("one trajectory (4 calls)", f"/ui/trajectories/{t['trajectory']}"))
    out.append((f"compare agent@{SERVED} vs @{CANDIDATE}", f"/ui/policies/agent/compare?a={SERVED}&b={CANDIDATE}"))
    out.append(("compare agent@0 vs @1", "/ui/policies/agent/compare?a=0&b=1"))
    out.append(("tokens of call 0 (upstream down)", f"/ui/trajectories/{t['trajectory']}/calls/0/tokens"))
    return out


def quantiles(seconds: list[float]) -> tuple[float, float]:
    return statistics.median(seconds) * 1000, statistics.quantiles(seconds, n=20, method="inclusive")[18] * 1000


def serve_and_time(url: str, kind: str, args: argparse.Namespace) -> None:
    found = asyncio.run(read_once(url, targets))
    data = tempfile.mkdtemp(prefix="bench-dashboard-")
    settings = Settings.load({}, upstream=UNREACHABLE, data_dir=data, database_url=url, admin_token=ADMIN_TOKEN)
    app = create_app(settings)
    timed = Timed(app)
    server = ServerThread(timed).start()
    caught = Caught(app.state.services.db.reader.sync_engine)
    only = re.compile(args.only) if args.only else None
    results: list[tuple[str, tuple[float, float, float, float, int, int, float] | None]] = []
    over: list[tuple[str, str]] = []
    try:
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as client:
            for name, path in pages(found):
                if only and not only.search(name):
                    continue
                begun = time.perf_counter()
                r = client.get(path)
                first = time.perf_counter() - begun
                if r.status_code != 200:
                    print(f"  {name}: {path} answered {r.status_code}: {r.text[:300]}")
                    results.append((name, None))
                    continue
                # A page that takes seconds is asked fewer times: --page-seconds each, at least MIN_REPEAT.
                for _ in range(args.warmup if first < 1 else 1):
                    client.get(path)
                wall, inside = [], []
                for _ in range(min(args.repeat, max(MIN_REPEAT, int(args.page_seconds / max(first, 1e-3))))):
                    begun = time.perf_counter()
                    r = client.get(path)
                    wall.append(time.perf_counter() - begun)
                    inside.append(timed.last)
                figures = (*quantiles(wall), *quantiles(inside), len(r.content), len(wall), first * 1000)
                results.append((name, figures))
                if figures[1] >= BUDGET_MS or args.plans == "all":
                    over.append((name, path))
            print(f"\n{kind}: n requests a page (up to {args.repeat}, about {args.page_seconds:.0f} s at most) after {args.warmup} to warm up;"
                  " client = httpx over loopback, app = inside the ASGI app (ms)")  # fmt: skip
            print(f"{'page':<44}{'first':>9}{'client p50':>11}{'p95':>8}{'app p50':>9}{'p95':>8}{'bytes':>9}{'n':>4}  under {BUDGET_MS:.0f} ms at p95")
            for name, found in results:
                if found is None:
                    print(f"{name:<44}{'failed':>11}")
                    continue
                c50, c95, a50, a95, size, n, cold = found
                print(f"{name:<44}{cold:>9.1f}{c50:>11.1f}{c95:>8.1f}{a50:>9.1f}{a95:>8.1f}{size:>9,}{n:>4}  {'yes' if c95 < BUDGET_MS else 'NO'}")
            for name, path in over if args.plans != "none" else ():
                caught.runs, caught.on = [], True
                client.get(path)
                caught.on = False
                total = sum(ms for ms, _, _ in caught.runs)
                print(f"\n-- {name}: {path}: {len(caught.runs)} statements, {total:.1f} ms in the database; the slowest, run again alone:")
                print(asyncio.run(slowest(url, caught.runs, args.slowest)))
    finally:
        server.stop()


async def read_once(url: str, fn: Any) -> Any:
    db = Database(url)
    try:
        return await db.read(fn)
    finally:
        await db.dispose()


async def slowest(url: str, runs: list[tuple[float, str, Any]], count: int) -> str:
    """The page's statements, each run again alone (its time then, as the page's time for it also
    holds waits for the event loop), the slowest ``count`` with their plans."""
    db, alone, out = Database(url), [], []
    try:
        for during, statement, parameters in runs:
            if not statement.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            begun = time.perf_counter()
            await db.read(lambda conn, s=statement, p=parameters: conn.exec_driver_sql(s, p).all())
            alone.append(((time.perf_counter() - begun) * 1000, during, statement, parameters))
        for ms, during, statement, parameters in sorted(alone, key=lambda a: -a[0])[:count]:
            shown = repr(parameters) if len(repr(parameters)) < 300 else repr(parameters)[:300] + "..."
            out.append(f"  {ms:.1f} ms alone ({during:.1f} ms in the page): {' '.join(statement.split())}\n  parameters: {shown}")
            out += ["    " + line for line in await db.read(explain, statement, parameters)]
    finally:
        await db.dispose()
    return "\n".join(out)


async def vacuum(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    await conn.execute("VACUUM ANALYZE")
    await conn.close()


async def make(kind: str, args: argparse.Namespace) -> str:
    """A fresh store filled with the month, or the one a run with --keep left (--reuse)."""
    url = f"sqlite+aiosqlite:///{SQLITE_PATH}"
    if kind == "postgresql":
        url = make_url(PG_SERVER).set(database=PG_DATABASE).render_as_string(hide_password=False)
    if args.reuse:
        return url
    if kind == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)
    else:
        await admin(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)", f"CREATE DATABASE {PG_DATABASE}")
    db = Database(url)
    await db.migrate()
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=DAYS)
    begun = time.perf_counter()
    traffic = DashboardTraffic(args.calls, 1, start, args.body_bytes)
    # Groups and rewards first: ``fill`` ends with VACUUM ANALYZE on PostgreSQL (the bulk loads skip the foreign keys).
    await asyncio.to_thread(bulk, url, [(Group, traffic.groups), (Reward, traffic.rewards(np.random.default_rng(3)))])
    await asyncio.to_thread(fill, url, traffic)
    await db.transaction(add_policies, traffic)
    await db.transaction(add_steps, traffic, args.long_steps)
    # What each closed group lacks to train, as the store settles it when a group closes.
    await db.transaction(lambda c: c.execute(update(Group).where(Group.closed_at.is_not(None)).values(lacks=lacks(Group.id))))
    # Each rewarded held-out trajectory's versions, as the store settles them with its reward.
    while await db.read(any_unscored):
        await db.transaction(settle_unscored, 10_000)
    if kind == "postgresql":  # the settling rewrote rows and filled held_out: vacuumed, as autovacuum would have by now
        await vacuum(url)
    # The pk arithmetic behind the per-call rewards holds: the first call of the last trajectory.
    last = traffic.t - 1
    pk = await db.read(lambda c: c.execute(text("SELECT min(pk) FROM calls WHERE trajectory_id = :t"), {"t": traffic.ids[last]}).scalar_one())
    assert pk == traffic.first_call_pk[last], (pk, traffic.first_call_pk[last])
    states = await db.read(lambda c: c.execute(text(
        "SELECT CASE WHEN trained_at IS NOT NULL THEN 'trained' WHEN claimed_by IS NOT NULL THEN 'training' WHEN closed_at IS NOT NULL THEN 'closed' ELSE 'open' END s,"
        " count(*) FROM groups GROUP BY s ORDER BY s")).all())  # fmt: skip
    grouped = int((traffic.group_of >= 0).sum())
    print(f"\n{kind}: {args.calls:,} calls of {traffic.t:,} trajectories ({grouped:,} in {len(traffic.groups):,} groups: {', '.join(f'{s} {n:,}' for s, n in states)})"
          f" filled in {time.perf_counter() - begun:.0f} s")  # fmt: skip
    await db.dispose()
    return url


async def drop(kind: str) -> None:
    if kind == "postgresql":
        await admin(f"DROP DATABASE {PG_DATABASE} WITH (FORCE)")
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--database", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5, help="requests before the timed ones (1 for a page that took a second)")
    parser.add_argument("--page-seconds", type=float, default=30, help="about this long on a slow page: fewer requests, at least 5")
    parser.add_argument("--body-bytes", type=int, default=1000)
    parser.add_argument("--long-steps", type=int, default=1000, help="steps of the policy longrun (0: no such policy)")
    parser.add_argument("--plans", choices=("over", "all", "none"), default="over", help="plans of the slowest statements of pages over the budget, or of all")
    parser.add_argument("--slowest", type=int, default=3, help="statements shown per page")
    parser.add_argument("--only", help="time only the pages whose name matches this regular expression")
    parser.add_argument("--keep", action="store_true", help="leave the filled databases for a later --reuse")
    parser.add_argument("--reuse", action="store_true", help="time the databases a run with --keep left, without filling")
    args = parser.parse_args()
    for kind in ("sqlite", "postgresql") if args.database == "both" else (args.database,):
        begun = time.perf_counter()
        url = asyncio.run(make(kind, args))
        serve_and_time(url, kind, args)
        if not args.keep:
            asyncio.run(drop(kind))
        print(f"{kind}: {time.perf_counter() - begun:.0f} s in all")


if __name__ == "__main__":
    main()
