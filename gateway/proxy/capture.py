"""What the gateway learns from a response: the final message, usage, token ids.

A plain response is decoded once. A stream is cut into server-sent events as it
passes; each event is forwarded at once, except the stream's terminal event
(``data: [DONE]``, ``message_stop``, ``response.completed``), which the relay
holds until the call's record is committed. Events are also folded into the
shape of the surface's plain response (its assembler, ``core/protocols/surfaces/``), so a streamed call is stored like a
plain one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from burnish_server.core.platform.secrets import Redactor
from burnish_server.core.protocols import answers, packed
from burnish_server.core.protocols.records import OK, UPSTREAM_CUT, UPSTREAM_ERROR
from burnish_server.core.protocols.surfaces import CHAT, Surface

_decode = msgspec.json.Decoder().decode
_convert = msgspec.convert
# What msgspec raises for bytes that are no JSON: malformed, not UTF-8, nested too deeply.
UNDECODABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
_encode = msgspec.json.Encoder().encode
log = logging.getLogger("burnish.gateway")


@dataclass(frozen=True, slots=True)
class Injected:
    """What the gateway asked vLLM for on a policy call that the client did not."""

    token_ids: bool
    logprobs: bool

    def scrub(self, obj: Any) -> Any:
        """Put the answer back the way vLLM writes it when not asked (the fields, null)."""
        if not isinstance(obj, dict):
            return obj
        if self.token_ids and obj.get("prompt_token_ids") is not None:
            obj["prompt_token_ids"] = None
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            if self.token_ids:
                for key in ("token_ids", "prompt_token_ids"):
                    if choice.get(key) is not None:
                        choice[key] = None
            if self.logprobs and choice.get("logprobs") is not None:
                choice["logprobs"] = None
        return obj


def inject(surface: Surface, request: dict[str, Any]) -> Injected | None:
    """Ask for the sampled tokens' ids and logprobs (vLLM's fields); say what was added."""
    if not surface.has_choices:
        return None
    added_ids = not request.get("return_token_ids")
    request["return_token_ids"] = True
    if surface is CHAT:
        added_logprobs = not request.get("logprobs")
        if added_logprobs:
            request["logprobs"] = True
    else:  # completions: logprobs=0 returns the sampled token's logprob only
        added_logprobs = request.get("logprobs") is None
        if added_logprobs:
            request["logprobs"] = 0
    return Injected(added_ids, added_logprobs)


def _next_boundary(buf: bytes, start: int) -> tuple[int, int]:
    """Where the next event ends: (index, separator length), or (-1, 0)."""
    lf = buf.find(b"\n\n", start)
    crlf = buf.find(b"\r\n\r\n", start)
    if crlf != -1 and (lf == -1 or crlf < lf):
        return crlf, 4
    return lf, 2 if lf != -1 else 0


def _parse_event(raw: bytes) -> tuple[str | None, bytes | None]:
    name, data = None, []
    for line in raw.splitlines():
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" ") if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
    return name, (b"\n".join(data) if data else None)


class StreamCapture:
    """Cuts a byte stream into events, folds them, and holds back the terminal one."""

    def __init__(
        self,
        surface: Surface,
        injected: Injected | None = None,
        listener: Callable[[Any], None] | None = None,
        redact: Redactor | None = None,
    ) -> None:
        self.surface = surface
        self.injected = injected
        self.listener = listener  # sees each event, typed (a translated surface turns it into its own)
        self.redact = redact  # masks the gateway's secrets in an upstream's error event (core/platform/secrets.py)
        self.assembler = surface.assembler()
        # The bytes of an event not yet ended, as they came, and the last 3 of them (a
        # separator may straddle two reads): joined only by the read that can end it. Joined
        # with every read, an event that spans many (a Responses API answer's last event
        # carries the whole answer) was copied again with each one.
        self.pending: list[bytes] = []
        self.tail = b""
        self.held = b""
        self.terminal = False
        self.error: str | None = None
        self.events = 0

    def feed(self, chunk: bytes) -> bytes:
        """Take an upstream chunk; return the bytes to forward now."""
        if self.pending:
            if _next_boundary(self.tail + chunk, 0)[0] == -1:  # the event goes on
                self.pending.append(chunk)
                self.tail = (self.tail + chunk)[-3:]
                return b""
            buf = b"".join([*self.pending, chunk])
            self.pending = []
        else:
            buf = chunk
        out: list[bytes] = []
        start = 0
        while True:
            end, sep = _next_boundary(buf, start)
            if end == -1:
                break
            event = buf[start : end + sep]
            start = end + sep
            if self.terminal:
                self.held += event
                continue
            terminal, rewritten = self._consume(event)
            if terminal:
                self.terminal = True
                self.held += event
            else:
                out.append(event if rewritten is None else rewritten)
        if rest := buf[start:]:
            self.pending, self.tail = [rest], rest[-3:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _consume(self, event: bytes) -> tuple[bool, bytes | None]:
        """Fold one event in; return whether it ends the stream, and its rewrite if any."""
        name, data = _parse_event(event)
        if data is None:
            return False, None
        typed = None  # the event as the surface reads it (core/protocols/answers.py), if it is one
        rewritten = None
        if data != b"[DONE]":
            try:
                obj = _decode(data)
            except UNDECODABLE:  # passed on as it came, not folded in
                return False, None
            if isinstance(obj, dict):
                self.events += 1
                if obj.get("error") is not None and (self.surface.has_choices or obj.get("type") == "error"):
                    err = obj["error"]
                    return self._failed(event, str(err.get("message") if isinstance(err, dict) else err))
                if name == "error" or obj.get("type") == "error":
                    return self._failed(event, str(obj.get("message") or obj))
                # Read as the surface's event (core/protocols/answers.py) before any of it is read: an event
                # of the wrong shape is relayed as it came, and the call recorded as the
                # upstream's error. Only that is caught: an error in the gateway's own code is its bug.
                try:
                    typed = _convert(obj, self.surface.event)
                    self.assembler.add(typed)  # sees the token ids before they are scrubbed
                    if self.listener is not None:
                        self.listener(typed)
                except msgspec.ValidationError as exc:
                    log.warning("a %s stream event of the wrong shape from the upstream: %s", self.surface.name, exc)
                    self.error = self.error or f"the upstream sent a stream event of the wrong shape: {exc}"
                if self.injected is not None:
                    rewritten = b"data: " + _encode(self.injected.scrub(obj)) + b"\n\n"
        return self.surface.terminal(name, data, typed), rewritten

    def _failed(self, event: bytes, message: str) -> tuple[bool, bytes | None]:
        """An upstream's error event: its message kept as the call's error, the event relayed
        with the gateway's secrets masked."""
        if self.redact is None:
            self.error = message
            return False, None
        self.error = self.redact.text(message)
        return False, self.redact(event)

    def outcome(self) -> tuple[str, str | None]:
        """Status of the stream after the upstream closed it."""
        if self.error is not None:
            return UPSTREAM_ERROR, self.error
        if self.terminal:
            return OK, None
        return UPSTREAM_CUT, "the upstream closed the stream before its end"

    def result(self) -> dict[str, Any]:
        return self.assembler.result()


@dataclass(slots=True)
class PackedTokens:
    """A call's token ids and logprobs packed as the store keeps them (``core/protocols/packed.py``);
    ``core/protocols/records.py: CallTokens`` is the same read back as lists."""

    prompt_token_ids: bytes | None = None
    completion_token_ids: bytes | None = None
    completion_logprobs: bytes | None = None
    completion_lengths: bytes | None = None


def _sampled_logprobs(logprobs: answers.TokenLogprobs | None) -> list[float] | None:
    """A choice's sampled tokens' logprobs; None where it has none, or lacks one of them."""
    if logprobs is None:
        return None
    if logprobs.content is not None:  # chat
        values = [entry.logprob for entry in logprobs.content]
    elif logprobs.token_logprobs is not None:  # completions
        values = logprobs.token_logprobs
    else:
        return None
    floats = [v for v in values if v is not None]
    return floats if len(floats) == len(values) else None


def extract_tokens(surface: Surface, body: Any) -> PackedTokens | None:
    """Token ids and sampled-token logprobs, where the upstream returned them (vLLM's fields);
    None where it did not, or returned them in the wrong shape (the call is then not trained on)."""
    if not surface.has_choices or not isinstance(body, dict):
        return None
    try:
        answer = _convert(body, answers.TokenAnswer)
    except msgspec.ValidationError as exc:
        log.warning("token ids of the wrong shape from the upstream (%s): %s", surface.name, exc)
        return None
    choices = sorted(answer.choices, key=lambda c: c.index)
    if not choices:
        return None
    prompt = answer.prompt_token_ids or choices[0].prompt_token_ids
    every_ids = [c.token_ids for c in choices if c.token_ids is not None]
    every_lps = [x for c in choices if (x := _sampled_logprobs(c.logprobs)) is not None]
    ids = every_ids if len(every_ids) == len(choices) else None
    lps = every_lps if len(every_lps) == len(choices) else None
    if ids is not None and lps is not None and any(len(a) != len(b) for a, b in zip(ids, lps)):
        lps = None  # not aligned with the sampled tokens: keep the ids only
    counted = ids if ids is not None else lps
    out = PackedTokens(
        prompt_token_ids=packed.pack_ids(prompt),
        completion_token_ids=packed.pack_ids([t for x in ids for t in x]) if ids is not None else None,
        completion_logprobs=packed.pack_floats([v for x in lps for v in x]) if lps is not None else None,
        completion_lengths=packed.pack_ids([len(x) for x in counted]) if counted is not None else None,
    )
    if out.prompt_token_ids is None and counted is None:
        return None
    return out
