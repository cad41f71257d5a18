"""A policy as the admin API and the dashboard change and read it, each in one transaction or
one read: the gateway runs these with ``Database.transaction`` and ``Database.read`` and opens
none of its own (``gateway/policies/actions.py``, ``gateway/routes/admin.py``, ``gateway/ui/status.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from burnish_server.core.api.views import EvalList, PolicyView, StepView
from burnish_server.core.learning.policies import Policy
from burnish_server.core.learning.promotion import Outcome
from burnish_server.store import evals, versions
from burnish_server.store import policies as store


def change_policy(conn: Connection, name: str, change: Callable[[Policy], dict[str, Any]]) -> Policy:
    """Change a policy by what ``change`` makes of it as it stands, on the locked row: two
    changes of different keys both stand. ``change`` may refuse (raise) and nothing is written."""
    store.lock_policy(conn, name)
    return store.update_policy(conn, name, **change(store.get_policy(conn, name)))


def decide(conn: Connection, name: str, decision: Outcome) -> None:
    """An admin promotes or rejects the candidate on trial, on the locked row."""
    store.lock_policy(conn, name)
    versions.admin_decide(conn, store.get_policy(conn, name), decision)


def history(conn: Connection, name: str) -> tuple[list[StepView], dict[int, evals.Score]]:
    """Every step, oldest first, and the held-out score of each version."""
    return store.list_steps(conn, name), evals.scores_by_step(conn, name)


def eval_list(conn: Connection, name: str) -> EvalList:
    """Every version's held-out score, oldest first (the base, step 0, included)."""
    served = store.get_policy(conn, name).step
    return EvalList(data=evals.eval_scores(conn, name, served, every_version=True))


class Timeline(NamedTuple):
    """What a policy's dashboard pages show of it, read at once."""

    status: PolicyView
    steps: list[StepView]  # oldest first
    scores: dict[int, evals.Score]  # held-out score by version
    at: float  # time.time() when it was read


def timeline(conn: Connection, name: str) -> Timeline:
    return Timeline(store.policy_status(conn, name), store.list_steps(conn, name), evals.scores_by_step(conn, name), time.time())
