"""Policies: trainable models, and how a request's ``model`` maps to what vLLM serves.

A policy has a name, a base model and a current step. vLLM serves step N > 0 as the
LoRA adapter ``<policy>@<N>``; step 0 is the base model itself. So:

    model: "<policy>"       -> the current step: "<policy>@<step>", or the base model at 0
    model: "<policy>@<N>"   -> that step, pinned
    anything else           -> passed through untouched (and still recorded)

The registry is a JSON file (``BURNISH_POLICIES_FILE``, by default
``<data_dir>/policies.json``)::

    {"policies": [{"name": "agent", "base_model": "tiny", "step": 0}]}

It is read again when it changes (checked at most once a second), so whoever advances
a policy's step, a person or the trainer, only rewrites the file.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

log = logging.getLogger("burnish.gateway")
RELOAD_EVERY_S = 1.0


class Policy(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    # The name vLLM serves the base model under.
    base_model: str
    step: int = 0
    # Where the trainer loads the base weights from (a path or hub id); default: base_model.
    model_path: str | None = None


class PolicyFile(msgspec.Struct):
    policies: list[Policy] = []


@dataclass(frozen=True, slots=True)
class Route:
    """Where a call to a policy goes."""

    policy: str
    step: int
    upstream_model: str

    @property
    def version(self) -> str:
        return f"{self.policy}@{self.step}"


def route(policy: Policy, step: int | None = None) -> Route:
    step = policy.step if step is None else step
    return Route(policy.name, step, policy.base_model if step == 0 else f"{policy.name}@{step}")


class Registry:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.policies: dict[str, Policy] = {}
        self._mtime: float | None = None
        self._checked = 0.0
        self.reload()

    def reload(self) -> None:
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self.policies, self._mtime = {}, None
            return
        if mtime == self._mtime:
            return
        try:
            data = msgspec.json.decode(self.path.read_bytes(), type=PolicyFile)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            # A half-written or broken file keeps the last good registry.
            log.error("policies file %s not loaded: %s", self.path, exc)
            return
        self.policies = {p.name: p for p in data.policies}
        self._mtime = mtime

    def refresh(self) -> None:
        """Re-read the file if it changed, looking at most once every RELOAD_EVERY_S."""
        now = time.monotonic()
        if now - self._checked > RELOAD_EVERY_S:
            self._checked = now
            self.reload()

    def resolve(self, model: str | None) -> Route | None:
        if model is None:
            return None
        self.refresh()
        if (policy := self.policies.get(model)) is not None:
            return route(policy)
        name, at, step = model.rpartition("@")
        if at and step.isdigit() and (policy := self.policies.get(name)) is not None:
            return route(policy, int(step))
        return None


def write_policies(path: Path, policies: list[Policy]) -> None:
    """Replace the file atomically, so the gateway never reads half of it."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(PolicyFile(policies)), indent=2))
    tmp.replace(path)
