"""One call in flight through the proxy: what the gateway reads of it, and its record.

``parse_head`` reads the two fields every surface needs (``model``, ``stream``) without
decoding the rest; ``Call`` carries what the record needs, whatever happens to the call,
and commits it (``commit`` returns only once the record is durable).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeVar
from urllib.parse import quote

import msgspec

from burnish_server.core.learning.policies import Policy, Route
from burnish_server.core.platform.access import ANONYMOUS, Principal
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import Invalid, NotRecorded, UpstreamError
from burnish_server.core.protocols.records import OK, UNADJUSTED, CallRecord
from burnish_server.core.protocols.surfaces import Surface
from burnish_server.gateway.proxy.capture import Injected, PackedTokens, extract_tokens, inject
from burnish_server.gateway.proxy.filing import Filing
from burnish_server.gateway.services import Services
from burnish_server.gateway.upstream.client import UpstreamResponse, failed

log = logging.getLogger("burnish.gateway")
T = TypeVar("T")


class RequestHead(msgspec.Struct):
    """The only fields the gateway reads from a request body."""

    model: str | None = None
    stream: bool | None = None


MAX_MODEL_CHARS = 256  # the store's column
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_decode_head = msgspec.json.Decoder(RequestHead).decode
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def parse_head(body: bytes) -> RequestHead:
    """``model`` and ``stream``; ``Invalid`` (400) for a body that is not a JSON object.

    The rest is not decoded, but it is checked as far as the store and the upstream need:
    JSON is UTF-8 (msgspec skips the fields it does not decode without checking their
    text), and nested no deeper than the interpreter can decode again (``RecursionError``).
    ``model`` is recorded and named in a response header: at most 256 characters, none a
    control character.
    """
    if not body.strip():
        raise Invalid("the request body is empty; expected a JSON object", "invalid_json")
    try:
        if not body.isascii():
            body.decode()
        head = _decode_head(body)
    except msgspec.ValidationError as exc:
        raise Invalid(f"invalid request body: {exc}", "invalid_request") from None
    except msgspec.DecodeError as exc:
        raise Invalid(f"the request body is not valid JSON: {exc}", "invalid_json") from None
    except UnicodeDecodeError as exc:
        raise Invalid(f"the request body is not valid JSON: it is not UTF-8 (byte {exc.start})", "invalid_json") from None
    except RecursionError:
        raise Invalid("the request body is not valid JSON: nested too deeply", "invalid_json") from None
    if head.model is not None and (len(head.model) > MAX_MODEL_CHARS or _CONTROL.search(head.model)):
        message = f"invalid request body: model must be at most {MAX_MODEL_CHARS} characters, none of them a control character"
        raise Invalid(message, "invalid_request", "model")
    return head


def json_or_none(raw: bytes) -> Any:
    """A JSON document, or None for anything else (not JSON, not UTF-8, nested too deeply)."""
    try:
        return _decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None


def read_answer(read: Callable[[dict[str, Any]], T], answer: Any) -> T | None:
    """``read(answer)`` for a JSON object; None for anything else, or an object of the wrong
    shape (the upstream's fault: the caller answers 502)."""
    if not isinstance(answer, dict):
        return None
    try:
        return read(answer)
    except msgspec.ValidationError as exc:
        log.warning("an answer of the wrong shape from the upstream: %s", exc)
        return None


def upstream_message(status: int, parsed: Any, raw: bytes) -> str:
    """What an upstream's error answer says: its error's message, else the start of its body."""
    if isinstance(parsed, dict) and "error" in parsed:
        err = parsed["error"]
        return str(err.get("message", f"upstream answered {status}") if isinstance(err, dict) else err)
    text = raw[:500].decode("utf-8", "replace")
    return f"upstream answered {status}: {text}" if text else f"upstream answered {status}"


def ms(since: float) -> float:
    return round((perf_counter() - since) * 1000, 3)


class Call:
    """One call in flight: what it needs to be recorded, whatever happens to it."""

    def __init__(self, svc: Services, surface: Surface, filing: Filing, head: RequestHead, body: bytes, caller: Principal = ANONYMOUS) -> None:
        self.svc = svc
        self.caller = caller
        self.surface = surface
        self.filing = filing
        self.head = head
        self.body = body  # as the client sent it: that is what gets recorded
        self.upstream_body = body
        self.route: Route | None = svc.policies.resolve(head.model, filing.trajectory_id, caller)
        self.injected: Injected | None = None
        self.response_id: str | None = None  # a Responses answer served for a policy, to continue later
        self.started_at = utcnow()
        self.sent_at = perf_counter()
        self.attempts = 1
        self.first_byte_ms: float | None = None
        self.http_status: int | None = None  # the upstream's answer's
        self.adjustments = UNADJUSTED  # what the gateway changed to serve it
        self.recorded = False  # its record handed to the store (commit)

    @property
    def policy(self) -> Policy | None:
        """The policy the call routes to, with its settings."""
        return self.svc.policies.policies.get(self.route.policy) if self.route is not None else None

    def to_policy(self, surface: Surface, request: dict[str, Any]) -> None:
        """Send vLLM the policy's served version (on ``surface``), asking for the sampled tokens."""
        assert self.route is not None
        request["model"] = self.route.upstream_model
        self.fit_budget(request)
        self.injected = inject(surface, request)
        self.upstream_body = _encode(request)

    def fit_budget(self, request: dict[str, Any]) -> None:
        """Give ``request`` the policy's ``serving.max_tokens`` where it asks for no budget, and
        lower its budget (``max_tokens``, ``max_completion_tokens``) to the policy's served
        window where the gateway knows it (gateway/proxy/window.py), noting both on the call."""
        assert self.route is not None
        policy = self.policy
        if policy is not None and policy.serving.max_tokens is not None and request.get("max_tokens") is None and request.get("max_completion_tokens") is None:
            request["max_tokens"] = policy.serving.max_tokens
            self.adjustments = msgspec.structs.replace(self.adjustments, max_tokens_sent=policy.serving.max_tokens)
        if (size := self.svc.windows.get(self.route.policy)) is None:
            return
        for key in ("max_tokens", "max_completion_tokens"):
            asked = request.get(key)
            if isinstance(asked, int) and not isinstance(asked, bool) and asked > size:
                request[key] = size
                self.adjustments = msgspec.structs.replace(self.adjustments, max_tokens_asked=asked, max_tokens_sent=size)

    @property
    def version(self) -> str:
        """For ``X-Policy-Version``: the policy's version, else the model as asked for (a name
        beyond ASCII percent-encoded, as a header value cannot carry it)."""
        if self.route is not None:
            return self.route.version
        model = self.head.model or ""
        return model if model.isascii() else quote(model, safe="")

    def answer(self, parsed: Any) -> tuple[PackedTokens | None, Any]:
        """The tokens in the full answer, then the answer as the client should see it."""
        tokens = extract_tokens(self.surface, parsed)
        if self.injected is not None:
            parsed = self.injected.scrub(parsed)
        return tokens, parsed

    def masked(self, raw: bytes, parsed: Any) -> tuple[bytes, Any]:
        """An upstream's error answer with the gateway's secrets masked (core/platform/secrets.py), and
        what it decodes to (decoded again only where something was masked)."""
        masked = self.svc.redact(raw)
        return (raw, parsed) if masked is raw else (masked, json_or_none(masked))

    def record(
        self,
        status: str,
        http_status: int | None,
        *,
        response: bytes | None = None,
        parsed: Any = None,
        tokens: PackedTokens | None = None,
        error: str | None = None,
    ) -> CallRecord:
        usage = parsed.get("usage") if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict) else None
        return CallRecord(
            trajectory_id=self.filing.trajectory_id,
            group_id=self.filing.group_id,
            group_size=self.filing.group_size,
            eval=self.filing.eval,
            endpoint=self.surface.name,
            model=self.head.model,
            stream=bool(self.head.stream),
            status=status,
            http_status=http_status,
            request=self.body,
            response=response,
            error=error.replace("\x00", "\ufffd") if error else error,  # an upstream's words; PostgreSQL's text holds no NUL
            usage=usage,
            prompt_token_ids=tokens.prompt_token_ids if tokens else None,
            completion_token_ids=tokens.completion_token_ids if tokens else None,
            completion_logprobs=tokens.completion_logprobs if tokens else None,
            completion_lengths=tokens.completion_lengths if tokens else None,
            attempts=self.attempts,
            upstream_first_byte_ms=self.first_byte_ms,
            upstream_ms=ms(self.sent_at),
            started_at=self.started_at,
            finished_at=utcnow(),
            policy=self.route.policy if self.route else None,
            policy_step=self.route.step if self.route else None,
            upstream_model=self.route.upstream_model if self.route else self.head.model,
            response_id=self.response_id if status == OK else None,  # only an answer the client got continues
            adjustments=None if self.adjustments is UNADJUSTED else self.adjustments,
        )

    async def commit(self, record: CallRecord) -> None:
        """Wait until the record is durable; raise ``NotRecorded`` (503) if it cannot be."""
        if not self.svc.settings.record:
            self.observe(record)
            return
        self.recorded = True  # on its way: a client that leaves now must not get a second record (forward.left)
        try:
            await self.svc.writer.write(record, alone=self.svc.in_flight <= 1)
        except Exception as exc:
            log.error("call for trajectory %s not recorded: %s", self.filing.trajectory_id, exc)
            self.observe(record, status=503)
            raise NotRecorded("the gateway could not record this call; it was not completed", "record_failed") from exc
        self.observe(record)
        if self.svc.settings.log_bodies:
            log.debug(
                "call %s/%s: request %s response %s", self.filing.trajectory_id, self.surface.name, record.request[:4000], (record.response or b"")[:4000]
            )

    async def send(self, request_headers: Any, path: str) -> UpstreamResponse:
        """Send the upstream body: the upstream's (streaming) response, or ``UpstreamError``."""
        upstream = self.svc.upstream
        try:
            response, self.attempts = await upstream.send(
                "POST",
                path,
                content=self.upstream_body,
                headers=upstream.request_headers(request_headers, ours=self.caller is not ANONYMOUS),
                sticky=self.filing.trajectory_id,
                model=self.route.upstream_model if self.route is not None else self.head.model,
                kept=self.route is not None and self.route.kept,
            )
        except UpstreamError as failure:
            self.attempts = failure.attempts
            raise
        self.first_byte_ms = ms(self.sent_at)
        self.http_status = response.status_code
        return response

    async def read(self, response: UpstreamResponse) -> bytes:
        """A plain response's body; ``UpstreamError`` if the upstream broke off."""
        try:
            return await response.aread()
        except UpstreamError as exc:
            raise failed(exc, "the upstream broke off its answer", self.attempts) from exc
        finally:
            await response.aclose()

    def observe(self, record: CallRecord, status: int | None = None) -> None:
        """Count the call for /metrics: its whole time so far, and the upstream's part of it."""
        upstream = record.upstream_ms / 1000 if record.upstream_ms is not None else None
        self.svc.metrics.observe_call(self.surface.name, status or record.http_status or 502, perf_counter() - self.sent_at, upstream)
