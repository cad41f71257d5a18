"""What the two benchmarks share: a fast upstream, process handling, and the load generator.

* ``upstream_app``: a raw ASGI app answering ``POST /v1/chat/completions`` with a fixed
  chat.completion, or, for ``"stream": true``, a fixed 8-event SSE stream ending with
  ``data: [DONE]``. Served by uvicorn (httptools, uvloop) in its own process.
* ``Proc``: a server subprocess in its own process group, killed with its group.
* ``Load``: wrk with a Lua script (one connection per concurrent client, a fresh
  ``X-Trajectory-Id`` per request, the whole body read, streams included), or, where wrk
  cannot be had, bench/pyload.py: asyncio + aiohttp (or httpx) in its own process.

Only 127.0.0.1 is used. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = str(VENV_BIN / "python") if (VENV_BIN / "python").exists() else sys.executable
HOST = "127.0.0.1"
PATH = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 16}
PLAIN_BODY = json.dumps(BODY, separators=(",", ":"))
STREAM_BODY = json.dumps({**BODY, "stream": True}, separators=(",", ":"))

# ---- the upstream ----------------------------------------------------------------------------
_BASE = {"id": "chatcmpl-bench", "created": 1700000000, "model": "tiny"}
_PLAIN = json.dumps(
    {
        **_BASE,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, how are you?"}, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21},
    }
).encode()
_DELTAS = [{"role": "assistant", "content": ""}] + [{"content": w} for w in ("Hello", " there,", " how", " are", " you?")]
_EVENTS = [
    b"data: " + json.dumps({**_BASE, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}).encode() + b"\n\n"
    for d in _DELTAS
]
_EVENTS.append(
    b"data: " + json.dumps({**_BASE, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode() + b"\n\n"
)
_EVENTS.append(b"data: [DONE]\n\n")  # 8 events in all
_JSON_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(_PLAIN)).encode())]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


async def upstream_app(scope, receive, send):  # noqa: ANN001 - raw ASGI
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if b'"stream":true' in body or b'"stream": true' in body:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        for event in _EVENTS:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        await send({"type": "http.response.start", "status": 200, "headers": _JSON_HEADERS})
        await send({"type": "http.response.body", "body": _PLAIN})


LANGFUSE_DELAY_S = float(os.environ.get("BENCH_LANGFUSE_DELAY_S", "0"))


async def langfuse_app(scope, receive, send):  # noqa: ANN001 - raw ASGI
    """Langfuse's ingestion: reads the batch, answers as Langfuse does (after BENCH_LANGFUSE_DELAY_S,
    a distant server's round trip), keeps nothing."""
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    if LANGFUSE_DELAY_S:
        await asyncio.sleep(LANGFUSE_DELAY_S)
    status = 202 if scope["path"] == "/api/public/scores" else 200
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


def git_state() -> str:
    """The commit measured, and whether the gateway's code had uncommitted changes."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "gateway"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return rev + (" + uncommitted changes in gateway/" if dirty else "")


def code_fingerprint() -> str:
    """A hash of the gateway's source as it is on disk: a run whose start and end differ measured two versions."""
    import hashlib

    digest = hashlib.sha1()
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def code_of(rev: str) -> dict[str, str]:
    """The environment that runs ``burnish`` from commit ``rev`` instead of this checkout, in the
    same venv: the commit's files (``git archive``) under a temporary folder, and a
    ``burnish_server`` there whose layers (the commit's top-level packages) link to them, first
    on ``PYTHONPATH`` (ahead of the editable install's finder). For measuring two commits side
    by side in one run."""
    tree = Path(tempfile.mkdtemp(prefix=f"bench-{rev[:12]}-"))
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True, timeout=60)
    shim = tree / ".import" / "burnish_server"
    shim.mkdir(parents=True)
    for layer in tree.iterdir():
        if (layer / "__init__.py").is_file():
            (shim / layer.name).symlink_to(layer)
    return {"PYTHONPATH": str(shim.parent)}


class OtherLoad:
    """CPU that processes other than this benchmark's used while it ran: a busy machine skews figures.

    Machine-wide busy time (/proc/stat) minus this process and its reaped children
    (servers, workers, wrk), so read it after every child has been stopped.
    """

    def __init__(self) -> None:
        self.busy0, self.own0, self.wall0 = self._busy(), self._own(), time.monotonic()

    @staticmethod
    def _busy() -> float:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def share(self) -> float:
        """Other processes' CPU as a share of the machine's capacity over the run."""
        other = (self._busy() - self.busy0) - (self._own() - self.own0)
        return max(0.0, other) / ((time.monotonic() - self.wall0) * (os.cpu_count() or 1))


# ---- processes -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Proc:
    """A server in its own process group; ``stop()`` ends the whole group."""

    live: list[Proc] = []

    def __init__(self, name: str, cmd: list[str], port: int, *, env: dict[str, str] | None = None, health: str | None = None) -> None:
        self.name, self.cmd, self.port, self.health = name, cmd, port, health
        self.url = f"http://{HOST}:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        Proc.live.append(self)

    def wait_ready(self, timeout: float = 30.0) -> Proc:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.log_tail()}")
            if self._ready():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")

    def _ready(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1) as s:
                if self.health is None:
                    return True
                s.sendall(f"GET {self.health} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
                return s.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of every live process in the server's group (workers included)."""
        ticks = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # the process group id
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def log_tail(self, n: int = 3000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(timeout=wait)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self in Proc.live:
            Proc.live.remove(self)
        self.log.close()

    @classmethod
    def stop_all(cls) -> None:
        for p in list(cls.live):
            p.stop()


def _on_signal(signum, frame):  # noqa: ANN001
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    """Make SIGTERM/SIGHUP unwind through the callers' ``finally`` blocks like Ctrl-C does."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)


def start_upstream(app: str = "upstream_app", env: dict[str, str] | None = None) -> Proc:
    port = free_port()
    cmd = [
        PYTHON,
        "-m",
        "uvicorn",
        f"harness:{app}",
        "--app-dir",
        str(ROOT / "bench"),
        "--host",
        HOST,
        "--port",
        str(port),
        "--http",
        "httptools",
        "--loop",
        "uvloop",
        "--lifespan",
        "off",
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    return Proc(app.removesuffix("_app"), cmd, port, env=env).wait_ready()


# ---- load ------------------------------------------------------------------------------------
WRK_LUA = r"""
local counter, tag, body, key = 0, "b", "", nil
function init(args) tag = args[1]; body = args[2]; key = args[3] end
function request()
  counter = counter + 1
  local headers = {["Content-Type"] = "application/json", ["X-Trajectory-Id"] = tag .. "-" .. counter}
  if key then headers["Authorization"] = "Bearer " .. key end
  return wrk.format("POST", nil, headers, body)
end
function done(s, lat, req)
  local e = s.errors
  io.write(string.format('WRKJSON {"requests":%d,"duration_s":%.6f,"errors":%d,"non2xx":%d,"p50_ms":%.3f,"p99_ms":%.3f,"mean_ms":%.3f,"max_ms":%.3f}\n',
    s.requests, s.duration / 1e6, e.connect + e.read + e.write + e.timeout, e.status,
    lat:percentile(50) / 1000, lat:percentile(99) / 1000, lat.mean / 1000, lat.max / 1000))
end
"""


def find_tool(command: str, package: str, path: str | None = None) -> str | None:
    """``command`` on PATH (or in ``path``); if absent, installed once with apt-get (as root) from
    Debian's ``package``. None if it cannot be had."""

    def found() -> str | None:
        return shutil.which(command) or (shutil.which(command, path=path) if path else None)

    if (tool := found()) or not (shutil.which("apt-get") and os.geteuid() == 0):
        return tool
    print(f"{command} not found; trying apt-get install -y {package} ...", flush=True)
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    for cmd in (install, ["apt-get", "update", "-q"], install):
        try:
            subprocess.run(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=False, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            )
        except subprocess.TimeoutExpired:
            break
        if tool := found():
            return tool
    return None


def find_wrk() -> str | None:
    """wrk on PATH; if absent, try to install it (apt-get, as root) once."""
    if wrk := find_tool("wrk", "wrk"):
        return wrk
    print("wrk unavailable: using the Python (asyncio) load generator, which may be the bottleneck at c=64", flush=True)
    return None


class Load:
    def __init__(self, api_key: str | None = None) -> None:
        # Sent as ``Authorization: Bearer`` on every request, when given.
        self.api_key = api_key
        self.wrk = find_wrk()
        self.tool = "wrk" if self.wrk else "python-asyncio"
        self.lua = Path(tempfile.mkdtemp(prefix="bench-wrk-")) / "bench.lua"
        self.lua.write_text(WRK_LUA)
        self.runs = 0

    def run(
        self, url: str, body: str, conns: int, duration: float, warmup: float = 0.0, server: Proc | None = None, path: str = PATH, upstream: Proc | None = None
    ) -> dict:
        """Warm up, then load for ``duration`` s; returns rps, p50/p99 ms, errors (and ``server``'s
        CPU ms per request, and ``upstream``'s: the server behind a proxy)."""
        if warmup > 0:
            self._once(url + path, body, conns, warmup)
        watched = {name: (proc, proc.cpu_seconds()) for name, proc in (("server", server), ("upstream", upstream)) if proc}
        result = self._once(url + path, body, conns, duration)
        if result["requests"]:
            for name, (proc, before) in watched.items():
                result[f"{name}_cpu_ms_per_req"] = (proc.cpu_seconds() - before) * 1000 / result["requests"]
        return result

    def _once(self, target: str, body: str, conns: int, duration: float) -> dict:
        self.runs += 1
        tag = f"bench{os.getpid()}-{int(time.time())}-{self.runs}"
        if self.wrk:
            cmd = [self.wrk, "-t1", f"-c{conns}", f"-d{max(1, round(duration))}s", "--timeout", "10s", "-s", str(self.lua), target, "--", tag, body]
        else:
            cmd = [PYTHON, str(Path(__file__).resolve().parent / "pyload.py"), target, str(conns), str(duration), tag, body]
        if self.api_key:
            cmd.append(self.api_key)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
        line = next((text for text in out.stdout.splitlines() if text.startswith("WRKJSON ")), None)
        if line is None:
            raise RuntimeError(f"load generator failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
        r = json.loads(line[len("WRKJSON ") :])
        r["rps"] = r["requests"] / r["duration_s"] if r["duration_s"] else 0.0
        return r
