"""Several vLLM replicas of one model: which replica a call goes to.

The rule is rendezvous hashing ("highest random weight"): every replica gets a score for a
call's sticky id, a hash of the two, and the call goes to the replica with the highest score
among those that are healthy and serve the model asked for. The sticky id is the trajectory's, so

- a trajectory's calls go to one replica while it stays, whose prefix cache holds the
  conversation so far;
- when that replica leaves, only its trajectories move, each to its next choice, and they
  come back when it returns;
- every gateway picks the same replica for an id without talking to the others (the hash is
  stable across processes, unlike Python's ``hash``).

A call's next choices are where it is retried when its replica cannot be reached.

Which replica serves what comes from the replicas themselves (their ``/v1/models``, asked by
the gateway every ``upstream_health_every`` seconds). A version of a policy is switched to
only once every healthy replica serves it (the trainer's side, ``serving/fleet.py``), so
the rule below only has to keep a replica that has not caught up yet (one that just
joined, or could not load a version) out of that version's traffic.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Balance = Literal["sticky", "round_robin"]
_MASK = (1 << 64) - 1


def base_url(upstream: str) -> str:
    """Accept both ``http://host:8000`` and the ``.../v1`` people paste from client configs."""
    url = upstream.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse_upstreams(value: str) -> tuple[str, ...]:
    """``BURNISH_UPSTREAM``: one base URL, or several separated by commas. ``ValueError`` for
    anything that is not an http(s) URL with a host."""
    urls: list[str] = []
    for part in value.split(","):
        if not part.strip():
            continue
        url = base_url(part)
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname or split.query or split.fragment:
            raise ValueError(f"an upstream must be an http(s) base URL such as http://127.0.0.1:8000, not {part.strip()!r}")
        if url not in urls:
            urls.append(url)
    if not urls:
        raise ValueError("no upstream given")
    return tuple(urls)


def _mix(x: int) -> int:
    """splitmix64's finaliser: every bit of the input moves every bit of the output."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(slots=True, eq=False)
class Replica:
    """One replica as a gateway sees it: up or not, and the models it serves."""

    url: str
    healthy: bool = True
    # What its /v1/models lists (the base model and each loaded adapter); None: not known yet,
    # or the upstream does not list models (it is taken to serve whatever it is asked for).
    models: frozenset[str] | None = None
    seed: int = 0  # the url's hash, the replica's part of every score

    def __post_init__(self) -> None:
        self.seed = stable_hash(self.url)

    def serves(self, model: str | None) -> bool:
        return self.models is None or model is None or model in self.models

    def score(self, hashed: int) -> int:
        return _mix(hashed ^ self.seed)


class ReplicaSet:
    """The replicas of one model and the rule that orders them for a call."""

    def __init__(self, urls: Iterable[str], balance: Balance = "sticky") -> None:
        self.replicas: list[Replica] = [Replica(url) for url in urls]
        self.balance = balance
        self._turn = itertools.count()

    def update(self, urls: Iterable[str]) -> None:
        """The replicas are now ``urls`` (discovery): the known ones keep their state."""
        known = {r.url: r for r in self.replicas}
        # A new one gets no calls until its first health check says what it serves.
        self.replicas = [known.get(url) or Replica(url, healthy=False) for url in urls]

    def order(self, sticky: str | None, model: str | None = None) -> list[Replica]:
        """Where a call goes, first choice first: the healthy replicas serving ``model``, else
        the healthy ones, else all of them (an attempt is better than no attempt). Calls with one
        ``sticky`` id (a trajectory's, a group's) go to one replica while it is healthy."""
        replicas = self.replicas
        if len(replicas) <= 1:
            return replicas
        candidates = [r for r in replicas if r.healthy and r.serves(model)] or [r for r in replicas if r.healthy] or replicas
        if len(candidates) == 1:
            return candidates
        if self.balance == "round_robin" or sticky is None:
            start = next(self._turn) % len(candidates)
            return candidates[start:] + candidates[:start]
        h = stable_hash(sticky)
        return sorted(candidates, key=lambda r: r.score(h), reverse=True)
