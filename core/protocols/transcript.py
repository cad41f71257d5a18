"""Any recorded call as one conversation in chat form: what the model was shown, what it answered.

RULER shows the judge these messages, the trainer renders them with the chat template
when a call has no recorded token ids, and the Langfuse export shows them as a
generation's input and output. Each surface reads its own protocol into chat form (its
``read``, ``core/protocols/surfaces/``): chat messages as they are; a completion's prompt as one user
message; the Responses API's and Messages' items and blocks as messages, tool calls and tool
results as the protocols themselves line them up.

Non-text content (images, files, audio) becomes a placeholder such as ``[image_url]``:
a conversation says something was there, not what.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from burnish_server.core.protocols.conversation import Exchange, Message, UnreadableCall
from burnish_server.core.protocols.records import CallRecord
from burnish_server.core.protocols.surfaces import BY_NAME

__all__ = ["Exchange", "Message", "UnreadableCall", "conversation", "exchange", "read_bodies"]


def exchange(call: CallRecord) -> Exchange:
    """Read a recorded call's conversation; ``UnreadableCall`` if its bodies are not its endpoint's shape."""
    return read_bodies(call.endpoint, call.request, call.response)


def read_bodies(endpoint: str, request: bytes, response: bytes | None) -> Exchange:
    """``exchange`` from a call's endpoint and recorded bodies."""
    surface = BY_NAME.get(endpoint)
    if surface is None:
        raise UnreadableCall(f"no reader for endpoint {endpoint!r}")
    try:
        decoded_request, decoded_response = surface.decode_request(request), surface.decode_response(response)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise UnreadableCall(f"a {endpoint} call that is not one: {exc}") from None
    return surface.read(decoded_request, decoded_response)


def conversation(calls: Iterable[CallRecord]) -> list[Message]:
    """A trajectory's calls, in order, as one conversation: a call whose prompt repeats the
    conversation so far adds only what is new; one that does not (the agent rewrote its
    history) adds all of its messages. A call that cannot be read adds a note saying so."""
    out: list[Message] = []
    for call in calls:
        try:
            turn = exchange(call)
        except UnreadableCall:
            out.append(Message("system", f"[a {call.endpoint} call that could not be read]"))
            continue
        out += turn.prompt[len(out) :] if turn.prompt[: len(out)] == out else turn.prompt
        out += turn.answers[:1]
    return out
