"""``burnish up``'s plan: everything decided before a process starts (each vLLM replica's port,
log, cores and LoRA rank, the policy served, the gateway's and the trainer's command lines, and
the environment they run in), as pure functions of the command's options and the facts read
beforehand: the machine (free ports, cores, the vLLM build, the environment), the model
(cli/up.py's ``prepare_model``) and the policy as stored.

Nothing here reads or writes anything, so the plan is checked without starting a process
(tests/cli/test_up_plan.py); cli/up.py reads the facts, then starts and supervises what the
plan says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from burnish_server.core.learning.defaults import Defaults
from burnish_server.core.learning.policies import Policy, vllm_max_lora_rank
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.process import VLLMServer, lora_modules, split_cores
from burnish_server.serving.tool_calling import ToolCalling

# The most of a step that sampling waits for on the CPU build (trainer/turns.py): half the
# gateway's upstream_read_timeout, so a stream paused mid-answer is never cut.
PAUSE_SAMPLING_S = 30.0
# Set, it overrides the pause (Settings has read and checked it); unset, Settings' default (0) is not ours.
PAUSE_SAMPLING_VARIABLE = "BURNISH_TRAINER_PAUSE_SAMPLING"


@dataclass(frozen=True)
class UpOptions:
    """``burnish up``'s own options; the gateway's (host, port, store) are in ``Settings``."""

    policy: str = "agent"
    model: str | None = None  # None: the embedded SmolLM2
    vllm_port: int | None = None  # None: the first free from 8000
    replicas: int = 1
    vllm_args: tuple[str, ...] = ()
    switch_base: bool = False


@dataclass(frozen=True)
class Served:
    """What `burnish up` serves: vLLM's process, how it serves tool calls, and the policy's LoRA
    and training defaults."""

    vllm: VLLMServer
    tools: ToolCalling
    defaults: Defaults


@dataclass(frozen=True)
class Machine:
    """What ``burnish up`` read of this machine before planning."""

    vllm_ports: tuple[int, ...]  # free now, one a replica, the first one's first
    cores: tuple[int, ...]  # the cores this process may run on
    cpu_build: bool  # vLLM's CPU build is installed
    hostname: str
    environ: Mapping[str, str] = dataclasses.field(repr=False)


@dataclass(frozen=True)
class UpPlan:
    """What ``burnish up`` starts, and with what; none of it started yet."""

    fleet: tuple[VLLMServer, ...]  # the replicas, each on its port and cores, logging to a file of its own
    upstream: str  # the replicas' URLs, comma-separated, as the gateway and the trainer take them
    gateway_url: str
    gateway_args: tuple[str, ...]  # ``burnish gateway ...``
    trainer_args: tuple[str, ...]  # ``burnish trainer ...``
    policy: Policy  # as stored
    max_lora_rank: int
    pause_sampling_s: float  # 0: the trainer never pauses vLLM
    logs: Path
    admin_token_file: Path | None  # None: the token came from BURNISH_ADMIN_TOKEN
    env: Mapping[str, str] = dataclasses.field(repr=False)  # the gateway's and the trainer's; holds the admin token


def wanted_policy(name: str, served: Served) -> Policy:
    """The policy ``burnish up`` makes if none of that name exists: on the model served, with its defaults."""
    vllm = served.vllm
    defaults = served.defaults
    return Policy(
        name=name, base_model=vllm.served_model_name or vllm.model, model_path=vllm.model, lora=defaults.lora, train=defaults.train, serving=defaults.serving
    )


def training_note(wanted: Policy, stored: Policy, defaults: Defaults) -> str:
    """The line saying which training settings the policy trains with, and why."""
    if (stored.lora, stored.train, stored.serving) == (wanted.lora, wanted.train, wanted.serving):
        return defaults.explanation
    return f"training settings: the policy's own ({stored.name} was made with other settings; PATCH /admin/policies/{stored.name} changes them)"


def pause_sampling_s(settings: Settings, environ: Mapping[str, str], cpu_build: bool) -> float:
    """How long the trainer may pause sampling for a step: on the CPU build the trainer and vLLM
    share the cores (trainer/turns.py), unless BURNISH_TRAINER_PAUSE_SAMPLING says otherwise."""
    if PAUSE_SAMPLING_VARIABLE in environ:
        return settings.trainer_pause_sampling
    return PAUSE_SAMPLING_S if cpu_build else 0.0


def served_max_lora_rank(vllm: VLLMServer, policy: Policy) -> int:
    """vLLM serves the policy's rank (a policy of the data directory may have a higher one than
    the default), and the gateway refuses a policy with a rank above it."""
    return vllm_max_lora_rank(max(vllm.max_lora_rank, policy.lora.rank))


def fleet(vllm: VLLMServer, ports: Sequence[int], cores: Sequence[str | None], *, pausable: bool, max_lora_rank: int, policy: Policy) -> tuple[VLLMServer, ...]:
    """Replicas of the one model, each on its port and logging to a file of its own (the first
    to ``vllm``'s)."""
    modules = lora_modules(*policy.lora.target_modules)
    return tuple(
        dataclasses.replace(
            vllm,
            port=port,
            log_path=vllm.log_path if i == 0 else vllm.log_path.with_name(f"vllm-{i}.log"),
            cpu_cores=own_cores,
            pausable=pausable,
            max_lora_rank=max_lora_rank,
            lora_modules=modules,
            process=None,
        )
        for i, (port, own_cores) in enumerate(zip(ports, cores))
    )


def store_args(settings: Settings) -> tuple[str, ...]:
    """The gateway's and the trainer's store: ``burnish up``'s own."""
    return ("--data-dir", str(settings.data_path)) + (("--database-url", settings.database_url) if settings.database_url else ())


def children_env(settings: Settings, environ: Mapping[str, str], *, admin_token: str, max_lora_rank: int, pause_s: float) -> dict[str, str]:
    """The gateway's and the trainer's environment: ``burnish up``'s, and what it decided."""
    return {
        **environ,
        "BURNISH_ADMIN_TOKEN": admin_token,
        "BURNISH_MAX_LORA_RANK": str(max_lora_rank),
        PAUSE_SAMPLING_VARIABLE: str(pause_s),
        **({"BURNISH_INSECURE": "true"} if settings.insecure else {}),
    }


def plan_up(
    settings: Settings, options: UpOptions, *, machine: Machine, served: Served, policy: Policy, admin_token: str, admin_token_file: Path | None
) -> UpPlan:
    """What ``burnish up`` starts: ``served``'s vLLM on each of ``machine``'s ports, the gateway
    in front of them and the trainer beside them, for ``policy`` (as stored)."""
    pause_s = pause_sampling_s(settings, machine.environ, machine.cpu_build)
    max_lora_rank = served_max_lora_rank(served.vllm, policy)
    cores = split_cores(machine.cores, options.replicas, machine.cpu_build)
    replicas = fleet(served.vllm, machine.vllm_ports, cores, pausable=pause_s > 0, max_lora_rank=max_lora_rank, policy=policy)
    upstream = ",".join(v.url for v in replicas)
    store = store_args(settings)
    # A name stable across its restarts: a trainer killed mid-step holds its groups' claims, and
    # only a trainer of the same name releases them at once (else they wait out the lease,
    # trainer_lease: 15 minutes without a step).
    worker_id = f"{machine.hostname}-up"
    return UpPlan(
        fleet=replicas,
        upstream=upstream,
        gateway_url=f"http://{settings.host}:{settings.port}",
        gateway_args=("gateway", "--upstream", upstream, "--host", settings.host, "--port", str(settings.port), *store),
        trainer_args=("trainer", "--upstream", upstream, "--worker-id", worker_id, *store),
        policy=policy,
        max_lora_rank=max_lora_rank,
        pause_sampling_s=pause_s,
        logs=settings.data_path / "logs",
        admin_token_file=admin_token_file,
        env=children_env(settings, machine.environ, admin_token=admin_token, max_lora_rank=max_lora_rank, pause_s=pause_s),
    )
