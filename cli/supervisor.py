"""Keeping ``burnish up``'s children running: vLLM (each replica), the gateway and the trainer.

A child that exits while ``burnish up`` runs is started again, after a pause that doubles with
each death in a row (1 s, 2 s, ... at most ``MAX_BACKOFF_S``), and the console says so with
the last lines of its log. A vLLM that comes back holds no adapters: the trainer's catch-up
(trainer/catch_up.py) loads the served versions and candidates into it within seconds, as it
does for any replica that restarts. A child that dies ``CRASH_LOOP_DEATHS`` times within
``CRASH_LOOP_S`` is in a crash loop (a bad flag, a full disk, a model that does not load): a
restart would not help, so ``burnish up`` stops everything and shows why.

The supervisor polls; it never blocks on a child, so a vLLM that takes a minute to come back
does not keep it from seeing the gateway or the trainer die meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from burnish_server.core.platform.errors import Unavailable
from burnish_server.serving.process import last_lines

# The pause before the first restart; it doubles with each death in a row, to at most MAX_BACKOFF_S.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# So many deaths within so long: a crash loop, and burnish up stops.
CRASH_LOOP_DEATHS = 5
CRASH_LOOP_S = 600.0
# A child that ran this long without dying starts again from FIRST_BACKOFF_S.
STEADY_S = 120.0


@dataclass
class Child:
    """One supervised process: how to start it, how to tell it is ready, where it logs.

    ``start`` returns the new process; ``ready`` says whether it serves yet (a quick check,
    called each tick while it starts); ``start_timeout_s`` bounds that wait, past which the
    start counts as a death."""

    name: str
    log_path: Path
    start: Callable[[], subprocess.Popen]
    ready: Callable[[], bool]
    start_timeout_s: float
    # Kills what the process left behind (vLLM's engine, in its own process group) before a restart.
    cleanup: Callable[[subprocess.Popen], None] = lambda _proc: None
    process: subprocess.Popen | None = None
    deaths: deque[float] = field(default_factory=lambda: deque(maxlen=CRASH_LOOP_DEATHS))
    in_a_row: int = 0
    restart_at: float | None = None  # a death is waiting out its backoff
    starting_since: float | None = None  # started again, not ready yet
    up_since: float = field(default_factory=time.monotonic)
    restarts: int = 0


class CrashLoop(Unavailable, RuntimeError):
    """A child died ``CRASH_LOOP_DEATHS`` times within ``CRASH_LOOP_S``: the message says which and why."""

    default_code = "crash_loop"


class Supervisor:
    def __init__(self, children: list[Child], echo: Callable[[str], None] = lambda line: click.echo(line, err=True)) -> None:
        self.children = children
        self.echo = echo

    def tick(self, now: float | None = None) -> None:
        """Look at each child once: note a death, restart one whose backoff is over, announce
        one that is ready again. Raises ``CrashLoop``."""
        now = time.monotonic() if now is None else now
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._start(child, now)
                continue
            proc = child.process
            if proc is None:
                continue
            if proc.poll() is not None:
                self._died(child, f"exited ({proc.returncode})", now)
            elif child.starting_since is not None:
                if child.ready():
                    child.starting_since, child.up_since = None, now
                    self.echo(f"{child.name} is back ({child.restarts} restart{'s' * (child.restarts != 1)} so far)")
                elif now - child.starting_since > child.start_timeout_s:
                    proc.kill()
                    proc.wait()
                    self._died(child, f"was not ready {child.start_timeout_s:.0f} s after its restart", now)
            elif now - child.up_since > STEADY_S:
                child.in_a_row = 0

    def _died(self, child: Child, how: str, now: float) -> None:
        assert child.process is not None
        child.cleanup(child.process)
        child.deaths.append(now)
        child.in_a_row += 1
        tail = last_lines(child.log_path)
        if len(child.deaths) == CRASH_LOOP_DEATHS and now - child.deaths[0] <= CRASH_LOOP_S:
            raise CrashLoop(
                f"{child.name} {how}, its {CRASH_LOOP_DEATHS}th death within {CRASH_LOOP_S / 60:.0f} minutes: "
                f"stopping, as a restart would not help. Last lines of {child.log_path}:\n{tail}"
            )
        wait = min(FIRST_BACKOFF_S * 2 ** (child.in_a_row - 1), MAX_BACKOFF_S)
        child.restart_at, child.starting_since = now + wait, None
        self.echo(f"{child.name} {how}; restarting it in {wait:.0f} s. Last lines of {child.log_path}:\n{tail}")

    def _start(self, child: Child, now: float) -> None:
        child.restart_at = None
        child.restarts += 1
        child.process = child.start()
        child.starting_since = now


def kill_group(proc: subprocess.Popen) -> None:
    """Kill what is left of a process started in a session of its own (vLLM's engine core
    outlives an API server killed with -9, holding its memory and cores)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
