"""The domain's errors: what went wrong, in terms any caller can act on.

The store and the services raise these; the gateway maps them to HTTP statuses and the
OpenAI-style error body at its edge (``gateway/errors.py``), the trainer logs them. Each
carries a human message, a short machine ``code`` (stable: clients match on it) and the
``param`` it is about, if any.
"""

from __future__ import annotations


class BurnishError(Exception):
    """Base of the domain's errors."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class NotFound(BurnishError):
    """The thing named does not exist (a trajectory, a group, a policy, a checkpoint)."""


class Conflict(BurnishError):
    """The thing exists but its state refuses the change (a closed group, a trained policy)."""


class Invalid(BurnishError):
    """The input itself is wrong (an id, a setting out of range)."""


class Unavailable(BurnishError):
    """A service the operation needs did not answer (a judge, the store)."""
