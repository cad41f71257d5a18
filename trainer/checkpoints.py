"""Checkpoint directories: where a policy's steps live, written so that each is whole or absent.

    <data_dir>/policies/<policy>/checkpoints/<step>/
        adapter/              what vLLM loads (peft's adapter_config.json + adapter_model.safetensors)
        optimizer.pt          AdamW's state, so a restarted trainer resumes exactly
        trainer_state.json    the step and the settings it trained with
        metrics.json          the step's metrics
        probe.json            what vLLM must answer with the adapter (core/learning/fidelity.py)

A step is written to ``.<step>.partial`` and renamed into place. A trainer that died
before its step was recorded in the store leaves a whole directory with no row: at start it
is set aside as ``.unrecorded-<step>-<time>`` (not deleted: a store that lost its rows does
not cost the weights), and the step's groups are trained again.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from burnish_server.core.learning.fidelity import Probe

log = logging.getLogger("burnish.trainer")

PROBE_FILE = "probe.json"


class Checkpoints:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def root(self, policy: str) -> Path:
        return self.data_dir / "policies" / policy / "checkpoints"

    def step(self, policy: str, step: int) -> Path:
        return self.root(policy) / str(step)

    def adapter(self, policy: str, step: int) -> Path:
        return self.step(policy, step) / "adapter"

    def probe(self, policy: str, step: int) -> Probe | None:
        """The step's probe; None for step 0 (the base), and a checkpoint written before probes were."""
        try:
            return msgspec.json.decode((self.step(policy, step) / PROBE_FILE).read_bytes(), type=Probe)
        except FileNotFoundError:
            return None

    def write(self, policy: str, step: int, fill: Callable[[Path], None]) -> Path:
        """Have ``fill`` write the step's files into a fresh directory aside, then move it into place."""
        final = self.step(policy, step)
        partial = final.with_name(f".{step}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        fill(partial)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        return final

    def tidy(self, policy: str, recorded: int) -> None:
        """After a crash: drop half-written steps, set aside whole ones newer than ``recorded``."""
        for path in self.root(policy).glob("*"):
            if path.name.endswith(".partial"):
                shutil.rmtree(path)  # half written: never a checkpoint
            elif path.name.isdigit() and int(path.name) > recorded:
                aside = path.with_name(f".unrecorded-{path.name}-{int(time.time())}")
                log.info("moving %s to %s: its step was never recorded", path, aside.name)
                path.rename(aside)
