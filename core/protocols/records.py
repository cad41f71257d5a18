"""A recorded call: what the gateway writes for each call, and what every reader gets back.

``CallRecord`` is the one definition of a call as stored. The gateway builds one per call;
the store writes it (``store/writes.py``) and reads it back (``store/reads.py``); RULER,
the trainer and the Langfuse export all take it from there. Bodies stay the bytes that
crossed the wire; ``tokens()`` unpacks the sampled tokens, and ``exchange()``
(``core/protocols/transcript.py``) reads the conversation out of the bodies, so no consumer parses
a stored call its own way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.protocols import packed

# Statuses of a call.
OK = "ok"
UPSTREAM_ERROR = "upstream_error"
CLIENT_DISCONNECTED = "client_disconnected"
UPSTREAM_CUT = "upstream_cut"
DEMONSTRATION = "demonstration"  # posted for the policy to imitate, never served (core/learning/demonstrations.py)


class CallTokens(msgspec.Struct, frozen=True):
    """A call's tokens as vLLM returned them: the prompt, and per choice the sampled ids and
    their logprobs under the policy that served it; None where they were not returned."""

    prompt: list[int] | None
    completions: list[list[int]] | None
    logprobs: list[list[float]] | None

    @property
    def trainable(self) -> bool:
        """Prompt and sampled ids both there: the call trains on exactly what was sampled."""
        return self.prompt is not None and self.completions is not None


class Adjustments(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the gateway changed of a policy's call to serve it, recorded with the call (and named
    in the answer's ``X-Burnish-Omitted-Tools`` header where tools were left out)."""

    # Hosted tools the client offered that the policy cannot run, left out of what the model
    # saw (the policy's serving.hosted_tools): their types, as the client named them.
    omitted_tools: tuple[str, ...] = ()
    # The client's max_tokens where it was above the served window, and what was sent (the
    # window; vLLM then gives what the prompt leaves of it). Sent with none asked: the
    # policy's serving.max_tokens, for a call that asked for no budget.
    max_tokens_asked: int | None = None
    max_tokens_sent: int | None = None

    def __bool__(self) -> bool:
        return bool(self.omitted_tools) or self.max_tokens_sent is not None


# A call the gateway served as it was asked: shared, so the proxy path makes none per call.
UNADJUSTED = Adjustments()


class CallRecord(msgspec.Struct, kw_only=True):
    """One call, as the proxy saw it. Field names follow the ``calls`` table."""

    trajectory_id: str
    group_id: str | None
    group_size: int | None
    endpoint: str  # the surface spoken: its name (core/protocols/surfaces/: chat.completions, completions, responses, messages)
    model: str | None
    stream: bool
    status: str
    http_status: int | None
    # The request as the client sent it; the response as the client received it (a stream
    # folded into the plain response's shape).
    request: bytes
    started_at: datetime
    finished_at: datetime
    response: bytes | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    # Packed little-endian arrays (core/protocols/packed.py); all choices end to end, cut by the lengths.
    prompt_token_ids: bytes | None = None
    completion_token_ids: bytes | None = None
    completion_logprobs: bytes | None = None
    completion_lengths: bytes | None = None
    attempts: int = 1
    # Milliseconds from sending to the upstream until its first byte, and until its last.
    upstream_first_byte_ms: float | None = None
    upstream_ms: float | None = None
    # For a call to a policy: its name and the step that served it; `upstream_model` is
    # the name vLLM was asked for (`<policy>@<step>`, or the base model).
    policy: str | None = None
    policy_step: int | None = None
    upstream_model: str | None = None
    # A Responses API answer the gateway served (and may continue, `previous_response_id`).
    response_id: str | None = None
    # Held out for evaluation (X-Eval, /eval/...): marks the trajectory and its group, which
    # are then never trained on. Like group_id and group_size, it is the call's key, kept on
    # the trajectory and group rows, not on the call's own (a call read back has False).
    eval: bool = False
    # What the gateway changed to serve the call (None: nothing).
    adjustments: Adjustments | None = None

    @property
    def version(self) -> str | None:
        return adapter_name(self.policy, self.policy_step or 0) if self.policy else None

    def tokens(self) -> CallTokens | None:
        return unpack_tokens(self.prompt_token_ids, self.completion_token_ids, self.completion_logprobs, self.completion_lengths)

    def request_json(self) -> Any:
        """The request as JSON, or None where it is not JSON."""
        try:
            return msgspec.json.decode(self.request)
        except msgspec.DecodeError:
            return None


def unpack_tokens(prompt: bytes | None, completions: bytes | None, logprobs: bytes | None, lengths: bytes | None) -> CallTokens | None:
    """A call's packed token columns, split per choice; None if the upstream returned none."""
    sizes = packed.unpack_ids(lengths)
    if prompt is None and sizes is None:
        return None
    return CallTokens(
        packed.unpack_ids(prompt),
        packed.split(packed.unpack_ids(completions), sizes),
        packed.split(packed.unpack_floats(logprobs), sizes),
    )
