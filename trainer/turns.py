"""Taking turns with vLLM for the cores: sampling paused while the trainer computes a step.

Where the trainer and vLLM share the CPU's cores (``burnish up`` on the CPU build), both run
OpenMP teams whose threads spin at every barrier; side by side each team waits on threads the
other holds off the cores, and a SmolLM2 step beside 16 sampling streams took 6.6x its time
alone (bench/trainer_beside.py, docs/performance.md). So for each step's forward and backward
the trainer pauses every replica's scheduler (vLLM keeps each request, running or new, and
runs none), computes at its speed alone, and resumes sampling. What the step asks of vLLM
itself (a served teacher's scores) comes before the pause. A step longer than
``trainer_pause_sampling`` seconds resumes sampling then and finishes beside it: a stream
silent for longer than the gateway's ``upstream_read_timeout`` would be cut.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from burnish_server.serving.adapters import VLLMAdapters
from burnish_server.serving.fleet import Fleet

log = logging.getLogger("burnish.trainer")


class Turns:
    def __init__(self, fleet: Fleet | None = None, pause_s: float = 0.0) -> None:
        self.fleet, self.pause_s = fleet, pause_s
        self._refused: set[str] = set()  # replicas that would not pause, said once each

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Sampling paused for what runs inside, ``pause_s`` at most."""
        if self.fleet is None or self.pause_s <= 0:
            yield
            return
        self._each(VLLMAdapters.pause)
        timer = threading.Timer(self.pause_s, self._each, (VLLMAdapters.resume,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:  # a failed step too: vLLM must never stay paused
            timer.cancel()
            self._each(VLLMAdapters.resume)  # a second resume, after the timer's, changes nothing

    def release(self) -> None:
        """Resume every replica: a trainer killed mid-step left them paused."""
        if self.fleet is not None and self.pause_s > 0:
            self._each(VLLMAdapters.resume)

    def _each(self, action: Callable[[VLLMAdapters], None]) -> None:
        assert self.fleet is not None
        for url, result in self.fleet.each(action).items():
            if isinstance(result, Exception) and url not in self._refused:
                self._refused.add(url)
                log.warning("could not %s sampling on %s (%s): steps share its cores", action.__name__, url, result)
