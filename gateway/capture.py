"""What the gateway learns from a response: the final message, usage, token ids.

A plain response is decoded once. A stream is cut into server-sent events as it
passes; each event is forwarded at once, except the stream's terminal event
(``data: [DONE]``, ``message_stop``, ``response.completed``), which the relay
holds until the call's record is committed. Events are also folded into the
shape of the endpoint's plain response, so a streamed call is stored like a
plain one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from burnish_server.core import records, tokens
from burnish_server.core.records import OK, UPSTREAM_CUT, UPSTREAM_ERROR
from burnish_server.core.secrets import Redactor
from burnish_server.gateway.errors import anthropic_error_body, error_body

_decode = msgspec.json.Decoder().decode
# What msgspec raises for bytes that are no JSON: malformed, not UTF-8, nested too deeply.
UNDECODABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
# What reading a JSON value of the wrong shape raises (a number where a list was due, ...):
# an upstream's fault, reported as such, never the gateway's 500.
MALFORMED = (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError)
_encode = msgspec.json.Encoder().encode
log = logging.getLogger("burnish.gateway")


class _Pieces(list[str]):
    """A streamed string's pieces, joined once by ``_joined``. Adding each piece to a string
    held in a dict copies the whole string every time: quadratic in a long answer (an
    8,000-token stream took 0.3 s of the loop's time to assemble that way)."""


def _append(target: dict, key: str, piece: Any) -> None:
    if isinstance(piece, str):
        pieces = target.get(key)
        if isinstance(pieces, _Pieces):
            pieces.append(piece)
        else:
            target[key] = _Pieces((pieces or "", piece))


def _joined(target: dict) -> dict:
    """``target`` with its streamed strings whole."""
    for key, value in target.items():
        if isinstance(value, _Pieces):
            target[key] = "".join(value)
    return target


def _extend(target: dict, key: str, items: Any) -> None:
    """Add a chunk's list (token ids, logprobs) to ``target[key]``, in place: a new list per
    chunk would copy all the earlier ones again (quadratic, as for strings above)."""
    if not isinstance(items, list):
        raise TypeError(f"{key} is {type(items).__name__}, not a list")
    current = target.get(key)
    if current is None:
        target[key] = list(items)  # our own: the chunk's list is not ours to grow
    else:
        current.extend(items)


# Choices, tool calls and content blocks per answer: an index beyond is the upstream's error.
_MAX_INDEX = 10_000


def _index(value: Any, default: int = 0) -> int:
    """The index of a choice, tool call or content block: a small non-negative integer."""
    index = default if value is None else value
    if type(index) is not int or not 0 <= index < _MAX_INDEX:
        raise ValueError(f"index {value!r} is not an integer from 0 to {_MAX_INDEX - 1}")
    return index


class ChatAssembler:
    """``chat.completion.chunk`` events into one ``chat.completion``."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if key in chunk and key not in self.head:
                self.head[key] = chunk[key]
        if chunk.get("usage"):
            self.extra["usage"] = chunk["usage"]
        if chunk.get("prompt_token_ids") is not None:  # vLLM's return_token_ids
            self.extra["prompt_token_ids"] = chunk["prompt_token_ids"]
        for c in chunk.get("choices") or ():
            index = _index(c.get("index"))
            choice = self.choices.setdefault(
                index,
                {"index": index, "message": {"role": "assistant", "content": None}, "finish_reason": None, "logprobs": None},
            )
            message = choice["message"]
            delta = c.get("delta") or {}
            if delta.get("role"):
                message["role"] = delta["role"]
            for key in ("content", "reasoning_content", "reasoning", "refusal"):
                _append(message, key, delta.get(key))
            for call in delta.get("tool_calls") or ():
                calls = message.setdefault("tool_calls", [])
                index = _index(call.get("index"), len(calls))
                while len(calls) <= index:
                    calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                slot = calls[index]
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                function = call.get("function") or {}
                _append(slot["function"], "name", function.get("name"))
                _append(slot["function"], "arguments", function.get("arguments"))
            if c.get("finish_reason") is not None:
                choice["finish_reason"] = c["finish_reason"]
            if c.get("stop_reason") is not None:
                choice["stop_reason"] = c["stop_reason"]
            if logprobs := c.get("logprobs"):
                merged = choice["logprobs"] = choice["logprobs"] or {"content": None}
                for key in ("content", "refusal"):
                    if logprobs.get(key) is not None:
                        _extend(merged, key, logprobs[key])
            if c.get("token_ids") is not None:
                _extend(choice, "token_ids", c["token_ids"])

    def result(self) -> dict[str, Any]:
        choices = [self.choices[i] for i in sorted(self.choices)]
        for choice in choices:
            _joined(choice["message"])
            for call in choice["message"].get("tool_calls") or ():
                _joined(call["function"])
        return {**self.head, "object": "chat.completion", "choices": choices, **self.extra}


class CompletionAssembler:
    """``text_completion`` stream events into one ``text_completion``."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk and key not in self.head:
                self.head[key] = chunk[key]
        if chunk.get("usage"):
            self.extra["usage"] = chunk["usage"]
        for c in chunk.get("choices") or ():
            index = _index(c.get("index"))
            choice = self.choices.setdefault(index, {"index": index, "text": "", "finish_reason": None, "logprobs": None})
            _append(choice, "text", c.get("text"))
            if c.get("finish_reason") is not None:
                choice["finish_reason"] = c["finish_reason"]
            if c.get("stop_reason") is not None:
                choice["stop_reason"] = c["stop_reason"]
            if logprobs := c.get("logprobs"):
                merged = choice["logprobs"] = choice["logprobs"] or {}
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    if logprobs.get(key) is not None:
                        _extend(merged, key, logprobs[key])
            if c.get("token_ids") is not None:
                _extend(choice, "token_ids", c["token_ids"])
            if c.get("prompt_token_ids") is not None:
                choice["prompt_token_ids"] = c["prompt_token_ids"]

    def result(self) -> dict[str, Any]:
        choices = [_joined(self.choices[i]) for i in sorted(self.choices)]
        return {**self.head, "object": "text_completion", "choices": choices, **self.extra}


class ResponsesAssembler:
    """Responses API events: the terminal event carries the whole response."""

    TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None
        self.partial_text: list[str] = []
        self.final = False

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if isinstance(event.get("response"), dict):
            self.response = event["response"]
            self.final = kind in self.TERMINAL
        elif kind == "response.output_text.delta":
            self.partial_text.append(event.get("delta") or "")

    def result(self) -> dict[str, Any]:
        if self.final and self.response is not None:
            return self.response
        # Cut short: keep what arrived, marked as partial.
        return {**(self.response or {"object": "response"}), "status": "incomplete", "partial_output_text": "".join(self.partial_text)}


class MessagesAssembler:
    """Anthropic Messages events into one ``message``."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = {**event.get("message", {}), "content": []}
        elif kind == "content_block_start":
            self.blocks[_index(event.get("index"))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = _index(event.get("index"))
            block = self.blocks.setdefault(index, {})
            delta = event.get("delta") or {}
            match delta.get("type"):
                case "text_delta":
                    _append(block, "text", delta.get("text"))
                case "thinking_delta":
                    _append(block, "thinking", delta.get("thinking"))
                case "signature_delta":
                    block["signature"] = delta.get("signature")
                case "input_json_delta":
                    self.partial_json.setdefault(index, []).append(delta.get("partial_json") or "")
                case "citations_delta":
                    block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "content_block_stop":
            index = _index(event.get("index"))
            if index in self.partial_json:
                text = "".join(self.partial_json.pop(index))
                try:
                    self.blocks.setdefault(index, {})["input"] = _decode(text) if text else {}
                except UNDECODABLE:
                    self.blocks.setdefault(index, {})["input"] = text
        elif kind == "message_delta":
            self.message.update(event.get("delta") or {})
            if event.get("usage"):
                self.message["usage"] = {**(self.message.get("usage") or {}), **event["usage"]}

    def result(self) -> dict[str, Any]:
        for index, pieces in self.partial_json.items():  # a stream cut inside a tool_use block
            self.blocks.setdefault(index, {})["input"] = "".join(pieces)
        return {**self.message, "content": [_joined(self.blocks[i]) for i in sorted(self.blocks)]}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A recorded endpoint: its name in the store, its path under /v1, its stream format."""

    name: str
    path: str
    assembler: type
    has_choices: bool

    def is_terminal(self, event_name: str | None, data: bytes, obj: Any) -> bool:
        if self.has_choices:
            return data == b"[DONE]"
        kind = obj.get("type") if isinstance(obj, dict) else event_name
        if self.name == records.MESSAGES:
            return kind == "message_stop"
        return kind in ResponsesAssembler.TERMINAL

    def error_body(self, status: int, message: str, code: str | None = None) -> bytes:
        """An error answer in the endpoint's own format (Anthropic's on /v1/messages)."""
        if self.name == records.MESSAGES:
            return anthropic_error_body(status, message)
        return error_body(status, message, code)

    def error_event(self, message: str) -> bytes:
        """The event that tells a client its stream failed, in the endpoint's own format."""
        body: dict[str, Any]
        if self.name == records.MESSAGES:
            body = {"type": "error", "error": {"type": "api_error", "message": message}}
            return b"event: error\ndata: " + _encode(body) + b"\n\n"
        if self.name == records.RESPONSES:
            body = {"type": "error", "code": "upstream_error", "message": message, "param": None}
            return b"event: error\ndata: " + _encode(body) + b"\n\n"
        body = {"error": {"message": message, "type": "api_error", "param": None, "code": "upstream_error"}}
        return b"data: " + _encode(body) + b"\n\n"


CHAT = Endpoint(records.CHAT, "chat/completions", ChatAssembler, True)
COMPLETIONS = Endpoint(records.COMPLETIONS, "completions", CompletionAssembler, True)
RESPONSES = Endpoint(records.RESPONSES, "responses", ResponsesAssembler, False)
MESSAGES = Endpoint(records.MESSAGES, "messages", MessagesAssembler, False)
ENDPOINTS = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)


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


def inject(endpoint: Endpoint, request: dict[str, Any]) -> Injected | None:
    """Ask for the sampled tokens' ids and logprobs (vLLM's fields); say what was added."""
    if not endpoint.has_choices:
        return None
    added_ids = not request.get("return_token_ids")
    request["return_token_ids"] = True
    if endpoint is CHAT:
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
        endpoint: Endpoint,
        injected: Injected | None = None,
        listener: Callable[[dict[str, Any]], None] | None = None,
        redact: Redactor | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.injected = injected
        self.listener = listener  # sees each decoded event (a translated surface turns it into its own)
        self.redact = redact  # masks the gateway's secrets in an upstream's error event (core/secrets.py)
        self.assembler = endpoint.assembler()
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
        obj = None
        rewritten = None
        if data != b"[DONE]":
            try:
                obj = _decode(data)
            except UNDECODABLE:  # passed on as it came, not folded in
                return False, None
            if isinstance(obj, dict):
                self.events += 1
                if obj.get("error") is not None and (self.endpoint.has_choices or obj.get("type") == "error"):
                    err = obj["error"]
                    return self._failed(event, str(err.get("message") if isinstance(err, dict) else err))
                if name == "error" or obj.get("type") == "error":
                    return self._failed(event, str(obj.get("message") or obj))
                try:
                    self.assembler.add(obj)  # sees the token ids before they are scrubbed
                    if self.listener is not None:
                        self.listener(obj)
                except MALFORMED as exc:  # relayed as it came; the call is recorded as the upstream's error
                    log.warning("unreadable %s stream event from the upstream: %r", self.endpoint.name, exc)
                    self.error = self.error or f"the upstream sent a stream event of the wrong shape ({type(exc).__name__}: {exc})"
                if self.injected is not None:
                    rewritten = b"data: " + _encode(self.injected.scrub(obj)) + b"\n\n"
        return self.endpoint.is_terminal(name, data, obj), rewritten

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
class Tokens:
    prompt_token_ids: bytes | None = None
    completion_token_ids: bytes | None = None
    completion_logprobs: bytes | None = None
    completion_lengths: bytes | None = None


def _choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):  # chat
        return [entry.get("logprob") for entry in logprobs["content"]]
    if isinstance(logprobs.get("token_logprobs"), list):  # completions
        return logprobs["token_logprobs"]
    return None


def extract_tokens(endpoint: Endpoint, body: Any) -> Tokens | None:
    """Token ids and sampled-token logprobs, where the upstream returned them (vLLM's fields);
    None where it did not, or returned them in the wrong shape (the call is then not trained on)."""
    try:
        return _extract_tokens(endpoint, body)
    except MALFORMED as exc:
        log.warning("token ids of the wrong shape from the upstream (%s): %r", endpoint.name, exc)
        return None


def _extract_tokens(endpoint: Endpoint, body: Any) -> Tokens | None:
    if not endpoint.has_choices or not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return None
    choices = sorted((c for c in body["choices"] if isinstance(c, dict)), key=lambda c: c.get("index", 0))
    if not choices:
        return None
    prompt = body.get("prompt_token_ids") or choices[0].get("prompt_token_ids")
    ids: list[Any] = [c.get("token_ids") for c in choices]
    lps: list[Any] = [_choice_logprobs(c) for c in choices]
    have_ids = all(isinstance(x, list) for x in ids)
    have_lps = all(isinstance(x, list) and None not in x for x in lps)
    if have_ids and have_lps and any(len(a) != len(b) for a, b in zip(ids, lps)):
        have_lps = False  # not aligned with the sampled tokens: keep the ids only
    lengths = [len(x) for x in (ids if have_ids else lps)] if (have_ids or have_lps) else None
    out = Tokens(
        prompt_token_ids=tokens.pack_ids(prompt) if isinstance(prompt, list) else None,
        completion_token_ids=tokens.pack_ids([t for x in ids for t in x]) if have_ids else None,
        completion_logprobs=tokens.pack_floats([v for x in lps for v in x]) if have_lps else None,
        completion_lengths=tokens.pack_ids(lengths) if lengths is not None else None,
    )
    if out.prompt_token_ids is None and lengths is None:
        return None
    return out
