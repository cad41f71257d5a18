"""Who may do what: API keys, their scopes, and the projects that namespace the data.

An API key belongs to one project and carries scopes:

- ``call``: send calls through the proxy, and reward, close and judge (RULER) its own
  project's trajectories and groups, and read them back one at a time;
- ``read``: list and export its project's trajectories and read any of them;
- ``metrics``: scrape ``/metrics``;
- ``admin``: the admin API (policies, training, keys).

Trajectories, groups and rewards live in a project: two projects may use the same
trajectory ids without colliding, and a key sees and scores only its own project's. The
store keeps one id column per table and namespaces it: a trajectory ``t1`` of project
``team-a`` is stored as ``team-a/t1`` (``/`` never occurs in an id, so no two projects'
ids can meet), and the default project's ids are stored as they are, which is what every
gateway without keys has always written. Answers show the id the client used (``local``).

The secret is shown once, when the key is made; the store keeps its SHA-256 (a key is 32
random bytes, so a fast hash is as safe as a slow one and costs a microsecond per call).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime
from typing import Annotated, Literal

import msgspec

Scope = Literal["call", "read", "metrics", "admin"]
SCOPES: tuple[Scope, ...] = ("call", "read", "metrics", "admin")
# What an anonymous caller may do on a gateway that is open (no keys, bound to loopback or --insecure).
OPEN_SCOPES: frozenset[str] = frozenset({"call", "read", "metrics"})

DEFAULT_PROJECT = "default"
PROJECT_REGEX = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$(?!\n)"
PROJECT_RULE = "1 to 64 characters from A-Z a-z 0-9 _ -, starting with a letter or digit"
_PROJECT = re.compile(PROJECT_REGEX)
# Stored ids are at most this long: a project, "/", and a 128-character id.
STORED_ID_MAX = 200

# Secrets look like OpenAI's keys, with a prefix of their own so that a leaked one is recognised.
SECRET_PREFIX = "bsk-"
# How much of a secret the key listing shows, to tell keys apart.
SHOWN_PREFIX = len(SECRET_PREFIX) + 6


def is_project(name: str) -> bool:
    return bool(_PROJECT.fullmatch(name))


def qualify(project: str, id: str) -> str:
    """The stored form of a project's id."""
    return id if project == DEFAULT_PROJECT else f"{project}/{id}"


def qualify_optional(project: str, id: str | None) -> str | None:
    return None if id is None else qualify(project, id)


def local(stored: str) -> str:
    """The id as its project's clients know it."""
    return stored.rpartition("/")[2]


def local_optional(stored: str | None) -> str | None:
    return None if stored is None else stored.rpartition("/")[2]


def project_of(stored: str) -> str:
    project, slash, _ = stored.rpartition("/")
    return project if slash else DEFAULT_PROJECT


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


# No control characters (PostgreSQL refuses NUL in text; a newline would forge log lines).
PRINTABLE = r"^[^\x00-\x1f\x7f]*$(?!\n)"
# Text the store keeps: PostgreSQL's text cannot hold a NUL character.
NO_NUL = r"^[^\x00]*$"
KeyName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=PRINTABLE)]
ProjectName = Annotated[str, msgspec.Meta(pattern=PROJECT_REGEX, description=PROJECT_RULE)]


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-key limits; None is unlimited. Shared among the gateways that are up (docs/security.md)."""

    # Requests a minute through the proxy and the JSON APIs.
    rpm_limit: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    # Requests in flight at once.
    max_parallel_requests: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    """A key as the store keeps it (never the secret)."""

    id: str
    name: str
    project: str
    scopes: frozenset[str]
    secret_hash: str
    prefix: str
    limits: Limits
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def usable(self, now: datetime) -> str | None:
        """None if the key works now, else why not ("revoked", "expired")."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return None


class Principal(msgspec.Struct, frozen=True):
    """Whoever is calling: a key, the admin token, or anyone at all on an open gateway."""

    project: str
    scopes: frozenset[str]
    # The key's id; None for the admin token and for anonymous callers of an open gateway.
    key_id: str | None = None
    limits: Limits | None = None

    def can(self, scope: str) -> bool:
        return scope in self.scopes

    def stored(self, id: str) -> str:
        return qualify(self.project, id)

    def owns(self, stored_id: str) -> bool:
        return project_of(stored_id) == self.project


ANONYMOUS = Principal(DEFAULT_PROJECT, OPEN_SCOPES)
# The admin token: every scope, and the default project's data.
ROOT = Principal(DEFAULT_PROJECT, frozenset(SCOPES))


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the gateway reachable only from this machine."""
    host = host.strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")
