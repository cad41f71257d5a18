"""What the two benchmarks share: a fast upstream, process handling, and the load generator.

* ``upstream_app``: a raw ASGI app answering ``POST /v1/chat/completions`` with a fixed
  chat.completion, or, for ``"stream": true``, a fixed 8-event SSE stream ending with
  ``data: [DONE]``. Served by uvicorn (httptools, uvloop) in its own process.
* ``Proc``: a server subprocess in its own process group, killed with its group.
* ``load()``: wrk with a Lua script (one connection per concurrent client, a fresh
  ``X-Trajectory-Id`` per request, the whole body read, streams included), or, where wrk
  cannot be had, ``python bench/harness.py load ...``: asyncio + httpx in its own process.

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
_PLAIN = json.dumps({**_BASE, "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, how are you?"}, "finish_reason": "stop", "logprobs": None}], "usage": {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21}}).encode()
_DELTAS = [{"role": "assistant", "content": ""}] + [{"content": w} for w in ("Hello", " there,", " how", " are", " you?")]
_EVENTS = [b"data: " + json.dumps({**_BASE, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}).encode() + b"\n\n" for d in _DELTAS]
_EVENTS.append(b"data: " + json.dumps({**_BASE, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode() + b"\n\n")
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
        """User + system CPU time of the server process (all its threads) so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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


def start_upstream() -> Proc:
    port = free_port()
    cmd = [PYTHON, "-m", "uvicorn", "harness:upstream_app", "--app-dir", str(ROOT / "bench"), "--host", HOST, "--port", str(port),
           "--http", "httptools", "--loop", "uvloop", "--lifespan", "off", "--no-access-log", "--log-level", "warning"]
    return Proc("upstream", cmd, port).wait_ready()


# ---- load ------------------------------------------------------------------------------------
WRK_LUA = r"""
local counter, tag, body = 0, "b", ""
function init(args) tag = args[1]; body = args[2] end
function request()
  counter = counter + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json", ["X-Trajectory-Id"] = tag .. "-" .. counter}, body)
end
function done(s, lat, req)
  local e = s.errors
  io.write(string.format('WRKJSON {"requests":%d,"duration_s":%.6f,"errors":%d,"non2xx":%d,"p50_ms":%.3f,"p99_ms":%.3f,"mean_ms":%.3f,"max_ms":%.3f}\n',
    s.requests, s.duration / 1e6, e.connect + e.read + e.write + e.timeout, e.status,
    lat:percentile(50) / 1000, lat:percentile(99) / 1000, lat.mean / 1000, lat.max / 1000))
end
"""


def find_wrk() -> str | None:
    """wrk on PATH; if absent, try to install it (apt-get, as root) once."""
    if wrk := shutil.which("wrk"):
        return wrk
    if shutil.which("apt-get") and os.geteuid() == 0:
        print("wrk not found; trying apt-get install -y wrk ...", flush=True)
        for cmd in (["apt-get", "install", "-y", "-q", "wrk"], ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "wrk"]):
            try:
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180, check=False)
            except subprocess.TimeoutExpired:
                break
            if wrk := shutil.which("wrk"):
                return wrk
    print("wrk unavailable: using the Python (asyncio + httpx) load generator, which may be the bottleneck at c=64", flush=True)
    return None


class Load:
    def __init__(self) -> None:
        self.wrk = find_wrk()
        self.tool = "wrk" if self.wrk else "python-httpx"
        self.lua = Path(tempfile.mkdtemp(prefix="bench-wrk-")) / "bench.lua"
        self.lua.write_text(WRK_LUA)
        self.runs = 0

    def run(self, url: str, body: str, conns: int, duration: float, warmup: float = 0.0, server: Proc | None = None) -> dict:
        """Warm up, then load for ``duration`` s; returns rps, p50/p99 ms, errors (and ``server``'s CPU ms per request)."""
        if warmup > 0:
            self._once(url, body, conns, warmup)
        cpu0 = server.cpu_seconds() if server else 0.0
        result = self._once(url, body, conns, duration)
        if server and result["requests"]:
            result["server_cpu_ms_per_req"] = (server.cpu_seconds() - cpu0) * 1000 / result["requests"]
        return result

    def _once(self, url: str, body: str, conns: int, duration: float) -> dict:
        self.runs += 1
        tag = f"bench{os.getpid()}-{int(time.time())}-{self.runs}"
        if self.wrk:
            cmd = [self.wrk, "-t1", f"-c{conns}", f"-d{max(1, round(duration))}s", "--timeout", "10s", "-s", str(self.lua), url + PATH, "--", tag, body]
        else:
            cmd = [PYTHON, str(Path(__file__).resolve()), "load", url + PATH, str(conns), str(duration), tag, body]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
        line = next((l for l in out.stdout.splitlines() if l.startswith("WRKJSON ")), None)
        if line is None:
            raise RuntimeError(f"load generator failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
        r = json.loads(line[len("WRKJSON "):])
        r["rps"] = r["requests"] / r["duration_s"] if r["duration_s"] else 0.0
        return r


# ---- fallback generator: python bench/harness.py load URL CONNS DURATION TAG BODY ------------
async def _python_load(url: str, conns: int, duration: float, tag: str, body: str) -> None:
    import httpx

    lat: list[float] = []
    errors = non2xx = 0
    counter = 0
    data = body.encode()
    stream = '"stream":true' in body
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=conns, max_keepalive_connections=conns), timeout=10) as client:
        start = time.perf_counter()
        deadline = start + duration

        async def worker() -> None:
            nonlocal counter, errors, non2xx
            while time.perf_counter() < deadline:
                counter += 1
                headers = {"content-type": "application/json", "x-trajectory-id": f"{tag}-{counter}"}
                t0 = time.perf_counter()
                try:
                    async with client.stream("POST", url, content=data, headers=headers) as r:
                        await r.aread()
                    lat.append(time.perf_counter() - t0)
                    non2xx += r.status_code >= 400
                except httpx.HTTPError:
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(conns)))
        elapsed = time.perf_counter() - start
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0.0  # noqa: E731
    result = {"requests": len(lat), "duration_s": elapsed, "errors": errors, "non2xx": non2xx, "stream": stream,
              "p50_ms": pct(0.50), "p99_ms": pct(0.99), "mean_ms": sum(lat) / len(lat) * 1000 if lat else 0.0, "max_ms": lat[-1] * 1000 if lat else 0.0}
    print("WRKJSON " + json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["load"]:
    _url, _conns, _duration, _tag, _body = sys.argv[2:7]
    try:
        from uvloop import run as _run
    except ImportError:
        _run = asyncio.run
    _run(_python_load(_url, int(_conns), float(_duration), _tag, _body))
