"""Settings: one frozen struct, read from ``BURNISH_*`` environment variables and CLI flags.

Every knob has its default here and nowhere else. ``Settings.load()`` takes the
environment, then explicit overrides (the CLI's flags) on top. A policy's own knobs (LoRA,
training, RULER) are per policy, in ``core/learning/policies.py``. The module constants elsewhere are
not knobs, and each says why where it is: a limit that is part of the API's contract
(documented with it), a figure the docs promise, or pacing measured once whose value a
deployment has no reason to change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from burnish_server.core.platform.replicas import parse_upstreams

ENV_PREFIX = "BURNISH_"
# Other tools' names for a setting, read before the BURNISH_ ones (which win). Later keys win.
_FOREIGN_NAMES = {
    "LANGFUSE_HOST": "langfuse_base_url",
    "LANGFUSE_BASE_URL": "langfuse_base_url",
    "LANGFUSE_PUBLIC_KEY": "langfuse_public_key",
    "LANGFUSE_SECRET_KEY": "langfuse_secret_key",
}


class Settings(msgspec.Struct, kw_only=True, frozen=True):
    # Where the embedded database and (later) adapters and logs live.
    data_dir: str = "~/.burnish"
    # SQLAlchemy async URL. Empty: SQLite file ``<data_dir>/burnish.db``.
    # PostgreSQL: ``postgresql+asyncpg://user@host:5432/db`` (``postgresql://`` is accepted too).
    database_url: str = ""
    # The OpenAI-compatible server the gateway forwards to (vLLM by default); several replicas
    # of one model separated by commas (docs/inference.md#several-replicas).
    upstream: str = "http://127.0.0.1:8000"
    # http://name:port of a headless Service (Kubernetes, or a scaled Compose service): every
    # address the name resolves to is a replica, re-resolved every upstream_discover_every
    # seconds. Set, it replaces ``upstream``.
    upstream_discover: str = ""
    upstream_discover_every: float = 5.0
    # With several replicas: how often each is asked for its health and models (/v1/models).
    upstream_health_every: float = 1.0
    # "sticky": a trajectory's calls go to one replica (its prefix cache), by rendezvous
    # hashing on the trajectory id; "round_robin": each call to the next (for comparison).
    upstream_balance: Literal["sticky", "round_robin"] = "sticky"
    # If set, replaces the client's Authorization header on forwarded calls.
    upstream_api_key: str = ""
    # The highest LoRA rank the upstream vLLM serves (its --max-lora-rank; burnish up sets it):
    # a policy with a higher rank is refused. 0: not known, not checked.
    max_lora_rank: int = 0
    # Bearer token for /admin (compared in constant time). Empty: the admin API is closed.
    admin_token: str = ""
    # A dashboard sign-in (core/platform/sessions.py) ends after this many seconds without a page view,
    # and this many after the sign-in however it is used; each session keeps the figures it
    # was made with, so gateways sharing a store agree on it.
    ui_session_idle: Annotated[float, Meta(gt=0)] = 8 * 3600.0
    ui_session_lifetime: Annotated[float, Meta(gt=0)] = 7 * 86400.0

    host: str = "127.0.0.1"  # the address the gateway listens on; beyond loopback it needs API keys or an admin token (docs/security.md)
    port: int = 8080  # the gateway's port
    # Gateway processes sharing the port (uvicorn's workers), each with its own event loop,
    # upstream pool and group-commit writer (docs/performance.md, "Several workers").
    workers: int = 1
    # Run open (no API key needed) on an address other than loopback, while no key exists.
    # Without it such a gateway refuses to start until a key is made (docs/security.md).
    insecure: bool = False
    # Seconds the gateway keeps a client's idle connection open. uvicorn's own 5 s equals the
    # idle expiry of httpx (so of the openai and anthropic SDKs): a client that reuses a
    # connection just as the gateway closes it gets a ReadError (a load balancer, a 502).
    # Longer than the clients' and a load balancer's own (60 s on AWS), as nginx's 75 s is.
    keep_alive_timeout: Annotated[int, Meta(ge=1)] = 75

    # Requests with a larger body get 413 before anything is forwarded.
    max_body_bytes: int = 32 * 1024 * 1024
    # How long the upstream may keep a call waiting before it fails with 504 (a stalled upstream
    # must not pin calls for long). Seconds to open a connection (502 when it cannot, retried):
    upstream_connect_timeout: float = 5.0
    # Seconds from sending the request until the answer's first data: the status line and
    # headers, and for a stream its first event (prompt processing happens here). A plain,
    # non-streamed answer begins only once it is complete, so this also bounds its generation.
    upstream_timeout: float = 300.0
    # Once the answer has begun: seconds the upstream may stay silent between two reads of
    # the body (stream events, or the parts of a plain body).
    upstream_read_timeout: float = 60.0
    # Attempts per call, the first included, for connection errors and 429/502/503/504,
    # made only while nothing has been sent to the client.
    upstream_attempts: int = 3
    retry_initial_wait: float = 0.2
    retry_max_wait: float = 5.0
    # Connections to the upstream at once, all replicas together; and to any one replica, so
    # that a replica that stalls holds at most that many while the others keep serving. 0:
    # all of max_connections for a single replica, half of it with several (or discovery).
    max_connections: int = 1024
    max_connections_per_replica: int = 0
    # An idle kept-alive connection is closed past this age: uvicorn (vLLM's server) closes
    # its own after 5 s, and one closed just as a request is written fails that request.
    upstream_idle_expiry: float = 4.0
    # Connections the replicas' health checks use (gateway/upstream/replicas.py), apart from the
    # proxy's: a pool full of long streams must not make a replica look down.
    health_check_connections: int = 16
    # TLS to an https upstream: a CA bundle (PEM) to trust instead of the system's, and a
    # client certificate (PEM, the key in it or in upstream_client_key) to present.
    upstream_ca_bundle: str = ""
    upstream_client_cert: str = ""
    upstream_client_key: str = ""

    # The trainer (burnish trainer). Seconds between two looks for ready groups when idle:
    trainer_poll_every: float = 0.25
    # A trainer's claim on the groups of a step lasts this long; past it (the trainer died
    # mid-step) another may claim them. Longer than any step takes.
    trainer_lease: float = 900.0
    # Adapters kept loaded in vLLM per policy (older ones are unloaded; their checkpoints stay).
    trainer_keep_loaded: int = 3
    # A version vLLM failed to load is tried again after this long (a new step or rollback: at once).
    trainer_publish_retry: float = 5.0
    # A version is served only where vLLM's log-probabilities of its checkpoint's probe are
    # within this mean gap of the trainer's (core/learning/fidelity.py); 0: the measured noise floor of
    # the trainer's dtype. Off: served unchecked (a stand-in for vLLM with no weights).
    trainer_fidelity: bool = True
    trainer_fidelity_tolerance: Annotated[float, Meta(ge=0)] = 0.0
    # How often every replica is checked for the versions it should hold (a replica that
    # joined, or restarted, is caught up).
    trainer_catch_up_every: float = 2.0
    # Where the trainer and vLLM share the CPU's cores: vLLM's scheduler paused for each step,
    # for at most this many seconds (POST /pause?mode=keep on every replica, then /resume;
    # vLLM started with VLLM_SERVER_DEV_MODE=1). Each takes the cores in turn instead of both
    # spinning on them: a SmolLM2 step beside 16 sampling streams took 6.6x its time alone,
    # paused 1.03x (bench/trainer_beside.py). Calls wait meanwhile, none is dropped; kept under
    # upstream_read_timeout, so a stream paused mid-answer is not cut. 0: never (the default;
    # `burnish up` on the CPU build sets 30).
    trainer_pause_sampling: Annotated[float, Meta(ge=0)] = 0.0
    # How often a candidate's trial and a promoted version's watch for a regression are
    # tested (core/learning/promotion.py): each test reads the policy's rewarded trajectories.
    trainer_review_every: float = 5.0
    # A policy that has not trained for this long leaves the trainer's memory (its adapter and
    # optimizer state; the base too, with its last policy). Its next step reloads its checkpoint.
    trainer_idle_unload: float = 1800.0
    # Ranks on this node (`burnish trainer --nproc N` runs N under torchrun; several nodes run
    # torchrun themselves: docs/deploy.md), and how they hold the base: ddp, each rank the
    # whole base; fsdp, each rank a shard of it (FSDP2). trainer/distributed.py says more.
    trainer_nproc: Annotated[int, Meta(ge=1)] = 1
    trainer_parallel: Literal["ddp", "fsdp"] = "ddp"
    # torchrun's restarts of every rank after one failed (burnish trainer --nproc only).
    trainer_max_restarts: Annotated[int, Meta(ge=0)] = 3
    # How a base is held (trainer/base_model.py: Holding): its dtype (auto: bf16 on a GPU,
    # fp32 on the CPU), activation checkpointing (auto: on on a GPU), and sequences packed
    # without padding (auto: where the attention kernel is variable-length, FlashAttention), and
    # a group's answers trained in one row, their shared prompt once (auto: where not packed).
    trainer_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    trainer_checkpointing: Literal["auto", "on", "selective", "off"] = "auto"
    trainer_packing: Literal["auto", "on", "off"] = "auto"
    trainer_prompt_sharing: Literal["auto", "off"] = "auto"

    # Recording. Off turns the gateway into a plain proxy (the benchmark's baseline).
    record: bool = True
    # Most records written in one commit by the group-commit writer.
    commit_batch_max: int = 1024
    # Tries of one commit (the first included) before its calls are answered 503 record_failed:
    # a store that is away for a moment (a PostgreSQL failover) costs a retry, not the calls.
    commit_attempts: int = 4
    # SQLite's synchronous pragma: NORMAL survives a process crash in WAL mode;
    # FULL also survives power loss, at the price of an fsync per commit.
    sqlite_synchronous: str = "NORMAL"
    # Retention (docs/operations.md#retention): days a project without its own setting keeps a
    # trajectory after its last call or reward, applied by `burnish db prune`. 0: keep everything.
    retention_days: Annotated[float, Meta(ge=0, le=36500)] = 0.0
    # Apply pending Alembic migrations at start. On PostgreSQL an advisory lock
    # makes concurrent starters take turns.
    auto_migrate: bool = True

    # RULER's judge. Its endpoint comes from here or from a policy's ruler.judge_base_url (the
    # admin API), never from a request body (docs/ruler.md). Empty base URL: the upstream;
    # empty model: the group's policy's base model. The key goes only to this base URL.
    judge_base_url: str = ""
    judge_model: str = ""
    judge_api_key: str = ""
    # Comma-separated base URLs a policy's ruler.judge_base_url may name (this judge and the
    # upstream always may). Empty: any http(s) URL an admin sets.
    judge_allowed_urls: str = ""
    # Seconds one call to the judge may take, whole; each of judge_attempts gets its own.
    judge_timeout: float = 120.0
    # Calls to the judge per verdict, the first included, before the group gets an error.
    judge_attempts: int = 3
    judge_max_tokens: int = 2048

    # Langfuse export (docs/operations.md#langfuse): on when both keys are set. The usual
    # LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_BASE_URL (or LANGFUSE_HOST) work too.
    langfuse_public_key: str = ""
    langfuse_secret_key: str = ""
    langfuse_base_url: str = "https://cloud.langfuse.com"
    # Seconds per request to Langfuse, and attempts per batch (the first included) on 408/429/5xx.
    langfuse_timeout: float = 10.0
    langfuse_attempts: int = 3
    # Items waiting to be sent; beyond it new ones are dropped (and counted) rather than held.
    langfuse_queue_size: int = 10_000

    # The trainer's trackers (telemetry/trackers.py, docs/operations.md), each on when its
    # setting is set: a W&B project (W&B's own WANDB_MODE, WANDB_DIR, WANDB_ENTITY and
    # WANDB_API_KEY apply), an MLflow tracking URI (a server, or sqlite:///path/mlflow.db) and
    # its experiment, a folder for TensorBoard's event files.
    wandb_project: str = ""
    mlflow_tracking_uri: str = ""
    mlflow_experiment: str = "burnish"
    tensorboard_dir: str = ""
    # Seconds between two reads of every policy's held-out scores for them (each read follows
    # the held-out set: store/evals.py); a version's score is logged when it changed.
    trackers_eval_every: float = 10.0

    log_level: str = "info"  # debug, info, warning or error
    # "text" or "json" (one object per line, with the request id).
    log_format: str = "text"
    # Log request and response bodies at DEBUG level. Off: prompts and completions never reach the logs.
    log_bodies: bool = False

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Environment first, then overrides whose value is not None."""
        environ = os.environ if environ is None else environ
        fields = set(cls.__struct_fields__)
        raw: dict[str, Any] = {name: environ[key] for key, name in _FOREIGN_NAMES.items() if environ.get(key)}
        for key, value in environ.items():
            if key.startswith(ENV_PREFIX) and (name := key[len(ENV_PREFIX) :].lower()) in fields:
                raw[name] = value
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            # strict=False lets "8080" become 8080 and "true" become True.
            return msgspec.convert(raw, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid setting: {exc}") from None

    def __post_init__(self) -> None:
        parse_upstreams(self.upstream)  # a ValueError: load() reports it as an invalid setting

    def environ(self, **changes: Any) -> dict[str, str]:
        """These settings (with ``changes``) as ``BURNISH_*`` variables: how a process that
        starts others (``burnish gateway --workers N``) hands them its settings."""
        values = msgspec.to_builtins(msgspec.structs.replace(self, **changes))
        return {ENV_PREFIX + name.upper(): str(value).lower() if isinstance(value, bool) else str(value) for name, value in values.items()}

    @property
    def connect_timeout(self) -> float:
        """The older name of ``upstream_connect_timeout`` (the judge's client connects with it too)."""
        return self.upstream_connect_timeout

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def resolved_database_url(self) -> str:
        url = self.database_url
        if not url:
            return f"sqlite+aiosqlite:///{self.data_path / 'burnish.db'}"
        for plain, driver in (("postgresql://", "postgresql+asyncpg://"), ("postgres://", "postgresql+asyncpg://"), ("sqlite://", "sqlite+aiosqlite://")):
            if url.startswith(plain):
                return driver + url[len(plain) :]
        return url
