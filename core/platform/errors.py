"""The errors of burnish, one tree: what went wrong, in terms any caller can act on.

Each carries a human message, a short machine ``code`` (stable: clients match on it), the
``param`` it is about if any, and the HTTP ``status`` it is answered with; headers where the
answer needs some (``Retry-After``, ``WWW-Authenticate``). The store, the services, the
gateway and its upstream client raise them; the gateway turns any of them into the surface's
error body in one place (``gateway/edge/errors.py``), the trainer logs them, the CLI prints them.

Every error class of the product is in this tree, wherever it is defined: a layer's own (RULER's
judge, vLLM, an adapter, the CLI's supervisor) subclasses the branch it belongs to here. Those
that were once a builtin's (``ValueError``, ``RuntimeError``) keep it as a second base, so an
``except`` written for the builtin still catches them.

    BurnishError
    ├── Invalid 400            the input itself is wrong (an id, a body, a setting)
    │   └── ClientGone             the client left while its call waited on the upstream (gateway/proxy/departure.py)
    ├── Unauthorized 401       no key, or one that is unknown, revoked or expired
    ├── Forbidden 403          the key lacks the route's scope
    ├── NotFound 404           the thing named does not exist
    ├── Conflict 409           its state refuses the change
    ├── TooLarge 413           a body over the limit
    ├── TooManyRequests 429    a key's rate or concurrency limit
    │   ├── CorruptArchive         an archive line that is no archived trajectory (core/platform/archive.py)
    │   ├── UnreadableCall         a recorded call that cannot be read as a conversation (core/protocols/conversation.py)
    │   └── ExportError            an adapter or base that cannot be exported (trainer/export.py)
    ├── StoreUnavailable 503   the store is away or full: nothing was changed; Retry-After
    │   ├── NotRecorded 503        a call it could not take, so the call was not completed
    │   └── CommitUnknown 503      the connection lost as it committed: changed or not (store/database.py)
    ├── StatusFailed, SftFailed  a CLI command's gateway call (cli/status.py, cli/sft.py)
    └── Unavailable 502        a service the operation needs did not answer (a judge)
        ├── RulerFailed        no verdict from RULER's judge (gateway/groups/ruler.py)
        ├── JudgeOutputError   an answer of the judge that is no verdict (asked again)
        ├── VLLMFailed         vLLM did not start or stay up (serving/process.py)
        ├── CrashLoop          a child of `burnish up` died too often (cli/supervisor.py)
        ├── ScoringError       vLLM did not score a prompt (serving/scoring.py)
        ├── AdapterError       vLLM did not load or answer with an adapter (serving/adapters.py)
        │   └── Unfaithful     it answered, but not as the trainer made it
        └── UpstreamError 502  the upstream (vLLM): no usable answer
            ├── UpstreamDown 503        nothing answered (vLLM down or restarting); Retry-After
            │   ├── UpstreamConnectError    could not connect: nothing of the request was sent
            │   ├── UpstreamClosed          the connection closed before any byte of the answer
            │   └── VersionLoading          no replica holds the policy's version yet (one restarted)
            ├── UpstreamProtocolError   what came back is not HTTP (a malformed answer)
            ├── UpstreamReadError       the answer broke off midway
            └── UpstreamTimeout 504     connected, then silent past its time
                └── UpstreamPoolTimeout 504   every connection to the replica stayed busy
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar


class BurnishError(Exception):
    """Base of burnish's errors."""

    status: ClassVar[int] = 400
    # The code of an error raised without one (the layers' own errors below the tree).
    default_code: ClassVar[str] = "error"

    def __init__(self, message: str, code: str | None = None, param: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.headers = dict(headers) if headers else {}


class Invalid(BurnishError):
    """The input itself is wrong (an id, a body, a setting out of range)."""


class Unauthorized(BurnishError):
    """No credential, or one the gateway does not know: an API key, the admin token, a dashboard session."""

    status = 401

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code, headers={"www-authenticate": "Bearer"})


class Forbidden(BurnishError):
    """A known credential without the right: a key's scope or project, a cross-site request."""

    status = 403


class NotFound(BurnishError):
    """The thing named does not exist (a trajectory, a group, a policy, a checkpoint)."""

    status = 404


class Conflict(BurnishError):
    """The thing exists but its state refuses the change (a closed group, a trained policy)."""

    status = 409


class TooLarge(BurnishError):
    """A body over BURNISH_MAX_BODY_BYTES, refused before anything is forwarded."""

    status = 413


class TooManyRequests(BurnishError):
    """A limit reached (a key's rate); ``Retry-After`` says when to send again."""

    status = 429

    def __init__(self, message: str, code: str, retry_after_s: int) -> None:
        super().__init__(message, code, headers={"retry-after": str(retry_after_s)})


class StoreUnavailable(BurnishError):
    """The store did not take or give what the operation needs: the database away (restarting,
    stopped, unreachable) or its disk full. Nothing was changed, so the operation can simply be
    sent again: the answer says when (``Retry-After``), as a database restarting or a disk freed
    is back in seconds. Raised by the store (``store/database.py``) for every write and read."""

    status = 503
    default_code = "store_unavailable"
    RETRY_AFTER_S = 2

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message, code, headers={"retry-after": str(self.RETRY_AFTER_S)})


class NotRecorded(StoreUnavailable):
    """The call could not be recorded; it was not completed (nothing was lost: the client was
    told before it had an answer). Retryable, as every ``StoreUnavailable``."""

    default_code = "record_failed"


class Unavailable(BurnishError):
    """A service the operation needs did not answer (a judge, vLLM)."""

    status = 502


class UpstreamError(Unavailable):
    """No usable answer from the upstream. ``attempts``: how many times the call was sent."""

    default_code: ClassVar[str] = "upstream_unavailable"

    def __init__(self, message: str, code: str | None = None, attempts: int = 1) -> None:
        super().__init__(message, code or self.default_code)
        self.attempts = attempts


class UpstreamDown(UpstreamError):
    """Nothing answered: vLLM is down or restarting (a supervisor brings it back within a
    minute), so the call is refused retryably, with ``Retry-After``, as every client's retry
    logic understands. The request did nothing upstream."""

    status = 503
    RETRY_AFTER_S = 2

    def __init__(self, message: str, code: str | None = None, attempts: int = 1) -> None:
        super().__init__(message, code, attempts)
        self.headers = {"retry-after": str(self.RETRY_AFTER_S)}


class UpstreamConnectError(UpstreamDown):
    """Could not connect (refused, unreachable, connecting timed out): nothing was sent."""


class UpstreamClosed(UpstreamDown):
    """The connection closed (or was reset) before any byte of the answer came."""


class UpstreamProtocolError(UpstreamError):
    """The answer is not HTTP (garbage for a status line, broken framing): something answered,
    wrongly, and asking again at once would be no better."""


class UpstreamReadError(UpstreamError):
    """The answer broke off midway (the connection died)."""


class VersionLoading(UpstreamDown):
    """The replicas answered that they do not hold the policy's served version: one restarted
    and the trainer is loading it again (within seconds). Retryable: ``Retry-After``."""

    default_code = "version_loading"


class UpstreamTimeout(UpstreamError):
    """Connected, then nothing within the time-out."""

    status = 504
    default_code = "upstream_timeout"


class UpstreamPoolTimeout(UpstreamTimeout):
    """Every connection to the replica stayed busy for the time-out."""
