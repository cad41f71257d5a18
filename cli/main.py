"""The ``burnish`` command: gateway, trainer, up, db upgrade / prune / restore, keys, tiny-model, convert-gguf.

The top layer. It imports the gateway and the trainer only inside the commands that run
them, so `burnish gateway` never loads torch and `burnish trainer` never loads Litestar."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TypeVar

import click

from burnish_server.cli.db import prune, restore
from burnish_server.core.platform import logs
from burnish_server.core.platform.access import SCOPES
from burnish_server.core.platform.errors import BurnishError, StoreUnavailable
from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.platform.settings import Settings

T = TypeVar("T")
SCOPE_NAMES: list[str] = list(SCOPES)
PORT = click.IntRange(1, 65535)


def _settings(**overrides: object) -> Settings:
    try:
        return Settings.load(None, **overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


class Commands(click.Group):
    """The commands, with burnish's own errors (core/platform/errors.py) said as one line with
    the fix and exit 1, as click says its usage errors: never a traceback. A command that knows
    a better fix for its own failure says it first (click.ClickException)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except StoreUnavailable as exc:
            raise click.ClickException(
                f"{exc.message.removesuffix('; retry shortly')}: is the database up and its URL right? (--database-url, BURNISH_DATABASE_URL)"
            ) from None
        except BurnishError as exc:
            raise click.ClickException(exc.message) from None


@click.group(cls=Commands)
@click.version_option(package_name="burnish")
def main() -> None:
    """burnish: train an agent from its own traffic."""


@main.command()
@click.option("--upstream", help="OpenAI-compatible server to forward to; replicas of one model separated by commas [BURNISH_UPSTREAM]")
@click.option("--upstream-discover", help="http://name:port whose every address is a replica (a headless Service) [BURNISH_UPSTREAM_DISCOVER]")
@click.option("--host", help="address to listen on [BURNISH_HOST]")
@click.option("--port", type=PORT, help="port to listen on [BURNISH_PORT]")
@click.option("--data-dir", help="where the SQLite store lives [BURNISH_DATA_DIR]")
@click.option("--database-url", help="SQLAlchemy URL; PostgreSQL to scale out [BURNISH_DATABASE_URL]")
@click.option("--record/--no-record", default=None, help="record calls (default on) [BURNISH_RECORD]")
@click.option("--insecure", is_flag=True, default=None, help="serve open (no API key needed) on a non-loopback address while no key exists [BURNISH_INSECURE]")
@click.option("--log-level", help="debug, info, warning, error [BURNISH_LOG_LEVEL]")
@click.option("--log-format", type=click.Choice(["text", "json"]), help="[BURNISH_LOG_FORMAT]")
@click.option("--workers", type=click.IntRange(1, 256), help="gateway processes sharing the port (default 1) [BURNISH_WORKERS]")
def gateway(**options: object) -> None:
    """Serve the gateway."""
    import uvicorn

    from burnish_server.gateway.app import create_app
    from burnish_server.gateway.wiring import check_startable

    settings = _settings(**options)
    logs.configure(settings.log_level, settings.log_format)
    # uvicorn with uvloop and httptools: measured against granian in bench/asgi_servers.py (docs/performance.md).
    server = dict(
        host=settings.host,
        port=settings.port,
        loop="uvloop" if sys.platform != "win32" else "asyncio",
        http="httptools",
        access_log=False,
        log_level=settings.log_level.lower(),
        timeout_keep_alive=settings.keep_alive_timeout,
        timeout_graceful_shutdown=30,
    )
    if settings.workers == 1:
        uvicorn.run(create_app(settings), **server)  # type: ignore[arg-type]
        return
    # Several workers: migrate once here, then each worker builds the app from these settings
    # (handed over as BURNISH_* variables), with no migration of its own to race the others.
    if settings.auto_migrate:
        asyncio.run(_migrate(settings, "head"))
    try:
        asyncio.run(check_startable(settings))
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    os.environ.update(settings.environ(auto_migrate=False, workers=1))
    uvicorn.run("burnish_server.gateway.app:worker_app", factory=True, workers=settings.workers, **server)  # type: ignore[arg-type]


async def _migrate(settings: Settings, revision: str) -> None:
    from burnish_server.store.database import Database

    database = Database(settings.resolved_database_url)
    try:
        await database.migrate(revision)
    finally:
        await database.dispose()


@main.group()
def db() -> None:
    """The store: its schema (upgrade), retention (prune, restore)."""


db.add_command(prune)
db.add_command(restore)


@db.command()
@click.option("--database-url", help="SQLAlchemy URL [BURNISH_DATABASE_URL]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
@click.argument("revision", default="head")
def upgrade(revision: str, **options: object) -> None:
    """Apply migrations up to REVISION (default: head)."""
    settings = _settings(**options)
    asyncio.run(_migrate(settings, revision))
    click.echo(f"database at {revision}: {_display_url(settings)}")


def _gateway(settings: Settings, url: str | None, token: str | None) -> tuple[str, str]:
    """The running gateway a command talks to (``--url``, else this machine's on its port) and
    the token it sends (``--token``, else the admin token: set, or as ``burnish up`` wrote it)."""
    if token is None:
        token_file = settings.data_path / "admin-token"
        token = settings.admin_token or (token_file.read_text().strip() if token_file.exists() else "")
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    return url or f"http://{host}:{settings.port}", token


def _display_url(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    return make_url(settings.resolved_database_url).render_as_string(hide_password=True)


@main.group()
def keys() -> None:
    """API keys, straight in the store (for the first key of a gateway that is not on loopback)."""


def _in_store(settings: Settings, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    from burnish_server.store.database import Database

    async def run() -> T:
        database = Database(settings.resolved_database_url)
        try:
            if settings.auto_migrate:
                await database.migrate()
            return await database.transaction(functools.partial(fn, **kwargs), *args)
        finally:
            await database.dispose()

    return asyncio.run(run())


@keys.command("create")
@click.option("--name", required=True, help="what the key is for, e.g. the agent's name")
@click.option("--project", default="default", show_default=True, help="the project whose trajectories the key sees and scores")
@click.option("--scope", "scopes", multiple=True, type=click.Choice(SCOPE_NAMES), help="repeat for more [default: call]")
@click.option("--expires-in", type=float, help="seconds until the key stops working (default: never)")
@click.option("--rpm-limit", type=int, help="requests a minute")
@click.option("--max-parallel-requests", type=int, help="requests in flight at once")
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
def create_key(
    name: str, project: str, scopes: tuple[str, ...], expires_in: float | None, rpm_limit: int | None, max_parallel_requests: int | None, **options: object
) -> None:
    """Make a key and print its secret: the only time it is shown."""
    import msgspec

    from burnish_server.core.platform.access import Limits, is_project
    from burnish_server.store.keys import create_key as create

    if not is_project(project):
        raise click.UsageError(f"invalid --project {project!r}")
    try:
        limits = msgspec.convert({"rpm_limit": rpm_limit, "max_parallel_requests": max_parallel_requests}, Limits)
    except msgspec.ValidationError as exc:
        raise click.UsageError(str(exc)) from None
    made = _in_store(_settings(**options), create, name=name[:128], project=project, scopes=list(scopes or ["call"]), limits=limits, expires_in_s=expires_in)
    click.echo(f"{made.id} ({made.project}: {', '.join(made.scopes)})", err=True)
    click.echo(made.secret)


@keys.command("list")
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
def list_keys(**options: object) -> None:
    """Every key: id, status, project, scopes, name (never a secret)."""
    from burnish_server.store.keys import key_view, load_keys

    for key in _in_store(_settings(**options), load_keys):
        view = key_view(key)
        click.echo(f"{view.id}\t{view.status}\t{view.project}\t{','.join(view.scopes)}\t{view.prefix}...\t{view.name}")


@keys.command("revoke")
@click.argument("key_id")
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
def revoke_key(key_id: str, **options: object) -> None:
    """Revoke a key: every gateway refuses it within a second."""
    from burnish_server.core.platform.errors import NotFound
    from burnish_server.store.keys import revoke_key as revoke

    try:
        _in_store(_settings(**options), revoke, key_id)
    except NotFound as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"{key_id} revoked")


@main.command()
@click.option("--upstream", help="the vLLM server adapters are loaded into; replicas separated by commas [BURNISH_UPSTREAM]")
@click.option("--upstream-discover", help="http://name:port whose every address is a vLLM replica (a headless Service) [BURNISH_UPSTREAM_DISCOVER]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
@click.option("--worker-id", help="a name stable across restarts lets a restarted trainer release its own claims at once (default: host-pid)")
@click.option(
    "--keep-loaded",
    "trainer_keep_loaded",
    type=click.IntRange(1, None),
    help="adapters per policy kept loaded in vLLM (default 3) [BURNISH_TRAINER_KEEP_LOADED]",
)
@click.option(
    "--nproc", "trainer_nproc", type=click.IntRange(1, None), help="ranks on this machine, one per GPU, run under torchrun (default 1) [BURNISH_TRAINER_NPROC]"
)
@click.option(
    "--parallel",
    "trainer_parallel",
    type=click.Choice(["ddp", "fsdp"]),
    help="each rank holds the whole base (ddp) or a shard of it (fsdp) [BURNISH_TRAINER_PARALLEL]",
)
@click.option("--log-level", help="[BURNISH_LOG_LEVEL]")
@click.option("--log-format", type=click.Choice(["text", "json"]), help="[BURNISH_LOG_FORMAT]")
def trainer(worker_id: str | None, **options: object) -> None:
    """Run the trainer: GRPO steps on ready groups, adapters published to vLLM.

    Each policy trains with its own settings (create and change them over /admin/policies).
    With --nproc N it starts itself N times under torchrun; on several machines, run
    `torchrun ... -m burnish_server.cli trainer` on each (docs/deploy.md)."""
    try:
        from burnish_server.trainer.distributed import Ranks
        from burnish_server.trainer.models import Models
        from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the trainer's dependencies (from the checkout: pip install '.[train]')") from None

    settings = _settings(**options)
    logs.configure(settings.log_level, settings.log_format)
    if settings.trainer_nproc > 1 and "LOCAL_RANK" not in os.environ:
        # The shortcut: this same command, N times on this machine, under torchrun. A worker
        # id stable across torchrun's restarts lets a restarted rank 0 release its claims at once.
        # The settings travel as BURNISH_* variables (torchrun would read the options as its own).
        worker_id = worker_id or f"{socket.gethostname()}-torchrun-{os.getpid()}"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={settings.trainer_nproc}"]
        command = [*torchrun, f"--max-restarts={settings.trainer_max_restarts}", "-m", "burnish_server.cli", "trainer", "--worker-id", worker_id]
        os.execve(sys.executable, command, {**os.environ, **settings.environ()})
    ranks = Ranks.from_env(settings.trainer_parallel)
    if not ranks.main:  # the other ranks do what rank 0 says (trainer/models.py)
        from burnish_server.trainer.checkpoints import Checkpoints

        # Ctrl-C and torchrun's SIGTERM stop rank 0, which then tells the others to stop:
        # a rank that left on its own would fail rank 0's last word.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        try:
            Models(settings, Checkpoints(settings.data_path), ranks).follow()
        finally:
            ranks.close()
        return
    try:
        worker = TrainerWorker(settings, WorkerSettings(worker_id=worker_id) if worker_id else WorkerSettings(), ranks)
    except ImportError as exc:  # a tracker configured without its package: the message names the extra
        raise click.ClickException(str(exc)) from None

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await worker.run(stop)
        finally:
            await worker.close()
            ranks.close()

    asyncio.run(run())


@main.command("tiny-model")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--seed", type=int, default=0, show_default=True)
def tiny_model(path: str, seed: int) -> None:
    """Write a tiny random Qwen2 model with its tokenizer to PATH (needs the train extra)."""
    try:
        from burnish_server.trainer.tiny_model import make_tiny_model
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the trainer's dependencies (from the checkout: pip install '.[train]')") from None
    click.echo(f"tiny model written to {make_tiny_model(path, seed=seed)}")


@main.command("convert-gguf")
@click.argument("gguf_file", type=click.Path(exists=True, dir_okay=False))
@click.argument("path", type=click.Path(file_okay=False))
def convert_gguf(gguf_file: str, path: str) -> None:
    """Convert a GGUF model file into a safetensors folder at PATH that vLLM and the trainer load (needs the train extra and gguf)."""
    try:
        from burnish_server.trainer.gguf_model import convert_gguf as convert
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the trainer's dependencies (from the checkout: pip install '.[train]')") from None
    try:
        click.echo(f"{gguf_file} converted into {convert(gguf_file, path)}")
    except (ImportError, ValueError, OSError) as exc:
        raise click.ClickException(f"{gguf_file}: {exc}") from None


@main.command()
@click.option(
    "--model",
    help="what vLLM serves: smollm2 (default: the embedded SmolLM2-135M-Instruct), tiny (a tiny random model for tests), "
    "a .gguf file (converted once into <data_dir>/models/), a local folder or a hub id",
)
@click.option("--policy", default="agent", show_default=True, help="policy created over the model if it does not exist")
@click.option("--host", help="gateway address [BURNISH_HOST]")
@click.option("--port", type=PORT, help="gateway port [BURNISH_PORT]")
@click.option("--insecure", is_flag=True, default=None, help="let the gateway serve open on a non-loopback --host while no API key exists [BURNISH_INSECURE]")
@click.option("--vllm-port", type=PORT, help="the first replica's port, the others taking the next ones (default: the first free from 8000)")
@click.option("--replicas", type=click.IntRange(1, 64), default=1, show_default=True, help="vLLM replicas of the model, behind the one gateway")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
@click.option("--vllm-arg", "vllm_args", multiple=True, help="an argument passed to vLLM as is (repeat for more), e.g. --vllm-arg=--tool-call-parser=hermes")
@click.option("--switch-base", is_flag=True, help="move --policy onto this model if it was made for another and has never trained")
def up(model: str | None, policy: str, vllm_port: int | None, replicas: int, vllm_args: tuple[str, ...], switch_base: bool, **options: object) -> None:
    """Start vLLM with runtime LoRA (one or more replicas), then the gateway in front of it and the trainer. Ctrl-C stops them all."""
    from burnish_server.cli.up import run_up

    settings = _settings(**options)
    code = run_up(settings, model=model, policy=policy, vllm_port=vllm_port, replicas=replicas, vllm_args=list(vllm_args), switch_base=switch_base)
    raise SystemExit(code)


@main.command()
@click.argument("policy", required=False)
@click.option("--url", help="the gateway [default: http://127.0.0.1:<BURNISH_PORT>]")
@click.option("--token", help="the admin token [BURNISH_ADMIN_TOKEN, else <data_dir>/admin-token as burnish up makes it]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
@click.option("--port", type=PORT, help="[BURNISH_PORT]")
@click.option("--json", "as_json", is_flag=True, help="print the admin API's JSON")
def status(policy: str | None, url: str | None, token: str | None, as_json: bool, **options: object) -> None:
    """Where each policy (or POLICY) stands: served and candidate versions, groups open, closed,
    ready and trained, the last step, held-out scores, and the health warning; first, the store's
    trouble if it has any (full, short of room, away)."""
    import msgspec

    from burnish_server.cli.status import StatusFailed, fetch, render, store_warning

    url, token = _gateway(_settings(**options), url, token)
    if not as_json and (warning := store_warning(url)) is not None:
        click.echo(f"store: {warning}")
    try:
        policies = fetch(url, token, policy)
    except StatusFailed as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(msgspec.json.encode(policies[0] if policy else policies).decode())
        return
    click.echo("\n".join(render(p) for p in policies) if policies else "no policy yet: burnish up makes one, or POST /admin/policies")


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--policy", default="agent", show_default=True, help="the policy that imitates them")
@click.option("--url", help="the gateway [default: http://127.0.0.1:<BURNISH_PORT>]")
@click.option("--token", help="an API key or the admin token [BURNISH_ADMIN_TOKEN, else <data_dir>/admin-token as burnish up makes it]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
@click.option("--port", type=PORT, help="[BURNISH_PORT]")
def sft(file: str, policy: str, url: str | None, token: str | None, **options: object) -> None:
    """Post FILE (JSON Lines, one conversation a line, in chat format) as demonstrations for
    POLICY to imitate; they train where its train.objective gives sft a weight."""
    from pathlib import Path

    from burnish_server.cli.sft import SftFailed, post, read

    url, token = _gateway(_settings(**options), url, token)
    try:
        ids = post(url, token, policy, read(Path(file)))
    except SftFailed as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"posted {len(ids)} demonstrations for {policy} (trajectories {ids[0]} .. {ids[-1]})")


@main.command("export")
@click.argument("version")
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["adapter", "merged", "gguf"]),
    default="adapter",
    show_default=True,
    help="a PEFT adapter folder, merged weights (a plain HF folder), or one GGUF file (a base that came from a GGUF file)",
)
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
@click.option("--database-url", help="[BURNISH_DATABASE_URL]")
def export_version(version: str, out: str, fmt: str, **options: object) -> None:
    """Write VERSION (POLICY for the version it serves, or POLICY@STEP) into the folder OUT (needs the train extra)."""
    from pathlib import Path

    from burnish_server.core.platform.errors import NotFound
    from burnish_server.store.policies import get_policy, list_steps

    try:
        from burnish_server.trainer.export import ExportError, export
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the trainer's dependencies (pip install '.[train]')") from None
    settings = _settings(**options)
    name, _, step_text = version.partition("@")
    if step_text and not step_text.isdigit():
        raise click.UsageError(f"{version!r}: a version is POLICY or POLICY@STEP")
    try:
        policy = _in_store(settings, get_policy, name)
        steps = _in_store(settings, list_steps, name)
    except NotFound as exc:
        raise click.ClickException(exc.message) from None
    step = int(step_text) if step_text else policy.step
    base = policy.model_path or policy.base_model
    if step == 0:
        raise click.ClickException(f"{name}@0 is the base model itself, untrained: {base}")
    found = next((s for s in steps if s.step == step), None)
    if found is None:
        raise click.ClickException(f"{name} has no step {step}; its steps: {', '.join(str(s.step) for s in steps) or 'none yet'}")
    try:
        path = export(Path(found.checkpoint) / "adapter", base, Path(out), fmt, name=f"{name}-{step}")  # type: ignore[arg-type]
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{adapter_name(name, step)} written as {fmt}: {path}")
