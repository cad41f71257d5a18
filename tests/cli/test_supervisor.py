"""burnish up's supervisor (cli/supervisor.py) on real child processes: a child that dies is
started again after a pause that doubles, is announced when back, and one that keeps dying
stops everything. Time is given to ``tick``, so no test waits out a backoff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from burnish_server.cli.supervisor import CRASH_LOOP_DEATHS, Child, CrashLoop, Supervisor


def child(tmp_path: Path, code: str) -> tuple[Child, list[subprocess.Popen]]:
    log = tmp_path / "child.log"
    log.write_text("loading the model\nthe last words\n")
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", code]))
        return started[-1]

    made = Child("the child", log, start=start, ready=lambda: True, start_timeout_s=60)
    made.process = start()
    return made, started


def test_a_dead_child_is_restarted_after_a_doubling_pause_and_announced_back(tmp_path: Path) -> None:
    made, started = child(tmp_path, "raise SystemExit(3)")
    said: list[str] = []
    supervisor = Supervisor([made], echo=said.append)
    now = 1000.0
    for death, pause in enumerate((1, 2, 4), start=1):
        started[-1].wait()
        supervisor.tick(now)
        assert said[-1].startswith(f"the child exited (3); restarting it in {pause} s") and "the last words" in said[-1]
        supervisor.tick(now + pause - 0.1)
        assert len(started) == death  # not yet
        now += pause
        supervisor.tick(now)
        assert len(started) == death + 1

    # One that stays up is announced back once ready.
    def stays_up() -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return started[-1]

    made.start = stays_up
    started[-1].wait()
    supervisor.tick(now)
    now += 8
    supervisor.tick(now)
    supervisor.tick(now + 0.2)
    assert said[-1] == "the child is back (4 restarts so far)"
    started[-1].kill()
    started[-1].wait()


def test_a_crash_loop_stops_with_the_childs_last_words(tmp_path: Path) -> None:
    made, started = child(tmp_path, "raise SystemExit(1)")
    supervisor = Supervisor([made], echo=lambda _line: None)
    now = 0.0
    with pytest.raises(CrashLoop, match=f"the child exited \\(1\\), its {CRASH_LOOP_DEATHS}th death within 10 minutes") as stopped:
        for _ in range(CRASH_LOOP_DEATHS):
            started[-1].wait()
            supervisor.tick(now)
            now += 31  # past any pause
            supervisor.tick(now)
    assert "the last words" in str(stopped.value)
    assert len(started) == CRASH_LOOP_DEATHS  # never a sixth start
