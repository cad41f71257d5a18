"""vLLM's runtime LoRA API, as the trainer uses it: load an adapter, check that it answers,
list what is loaded, unload the old ones.

vLLM must run with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
(``serving/process.py`` starts it so). Calls are synchronous: the trainer publishes from a
worker thread, between steps.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx

from burnish_server.core.learning.fidelity import Fidelity, Probe, compare
from burnish_server.core.platform.errors import Unavailable
from burnish_server.serving.scoring import ScoringError, prompt_logprobs

log = logging.getLogger("burnish.serving")


class AdapterError(Unavailable, RuntimeError):
    """vLLM refused to load an adapter, or loaded it and does not answer with it."""

    default_code = "adapter_failed"


class Unfaithful(AdapterError):
    """vLLM answers with the adapter, but not as the trainer made it (core/learning/fidelity.py)."""

    default_code = "adapter_unfaithful"


class VLLMAdapters:
    def __init__(self, base_url: str, *, api_key: str = "", timeout_s: float = 120.0) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # Accept both http://host:8000 and the .../v1 people paste from client configs.
        self.url = base_url.rstrip("/").removesuffix("/v1")
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self.http.close()

    def load(self, name: str, path: Path) -> None:
        """Have vLLM serve ``name`` from ``path``.

        vLLM may hold the name already. From this path (a rollback re-publishing a step) that
        is fine. From another (a policy deleted and made again under its name, or another
        deployment sharing this vLLM) it is unloaded first: vLLM refuses a second load of a
        name, and would go on serving the other weights under it.
        """
        body = {"lora_name": name, "lora_path": str(path)}
        r = self.http.post("/v1/load_lora_adapter", json=body)
        if r.status_code != 200 and "already been loaded" in r.text:
            if self.loaded_from(name) == str(path):
                return
            log.warning("vLLM held %s from another path; reloading it from %s", name, path)
            self.unload(name)
            r = self.http.post("/v1/load_lora_adapter", json=body)
        if r.status_code != 200:
            raise AdapterError(f"vLLM did not load {name}: {r.status_code} {r.text[:300]}")

    def check(self, model: str) -> None:
        """One token from ``model``: proof that vLLM serves it."""
        r = self.http.post("/v1/completions", json={"model": model, "prompt": "ok", "max_tokens": 1})
        if r.status_code != 200:
            raise AdapterError(f"vLLM does not answer as {model}: {r.status_code} {r.text[:300]}")

    def fidelity(self, model: str, probe: Probe) -> Fidelity:
        """How far vLLM's log-probabilities of the probe's tokens under ``model`` are from the trainer's."""
        try:
            served = prompt_logprobs(self.http, model, [(ids, 1) for ids in probe.sequences])
        except ScoringError as exc:
            raise AdapterError(str(exc)) from None
        return compare(probe, served)

    def pause(self) -> None:
        """Freeze vLLM's scheduler: running and new requests wait, none is dropped (``mode=keep``).
        Needs vLLM started with ``VLLM_SERVER_DEV_MODE=1`` (404 otherwise)."""
        self.http.post("/pause", params={"mode": "keep"}).raise_for_status()

    def resume(self) -> None:
        """Let a paused scheduler go on (a no-op where it was not paused)."""
        self.http.post("/resume").raise_for_status()

    def unload(self, name: str) -> None:
        self.http.post("/v1/unload_lora_adapter", json={"lora_name": name})

    def models(self) -> list[dict[str, Any]]:
        """vLLM's /v1/models entries (the base model and each loaded adapter); none if it fails."""
        listed = self.http.get("/v1/models")
        return listed.json().get("data", []) if listed.status_code == 200 else []

    def loaded_from(self, name: str) -> str | None:
        """The path vLLM loaded adapter ``name`` from (its /v1/models ``root``)."""
        return next((m.get("root") for m in self.models() if m.get("id") == name), None)

    def loaded_steps(self, policy: str) -> list[int]:
        """The steps of ``policy`` vLLM holds as ``<policy>@<step>`` adapters, newest first."""
        return steps_of(policy, self.model_ids())

    def model_ids(self) -> list[str]:
        return [m["id"] for m in self.models() if isinstance(m.get("id"), str)]


def steps_of(policy: str, model_ids: list[str]) -> list[int]:
    """The steps of ``policy`` among vLLM's model ids (its ``<policy>@<step>`` adapters), newest first."""
    names = (model.rpartition("@") for model in model_ids)
    return sorted((int(step) for name, at, step in names if at and name == policy and step.isascii() and step.isdigit()), reverse=True)
