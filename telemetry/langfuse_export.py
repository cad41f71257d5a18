"""Langfuse export: what burnish records, sent to Langfuse off the request path.

What goes where:

- a recorded call -> a generation in the trace of its trajectory. The trace id is
  Langfuse's own derivation from the trajectory id (``Langfuse.create_trace_id(seed=id)``),
  so whoever holds a trajectory id can open its trace. The group is the trace's session;
  trajectory, group, policy and version are metadata, and the observation's version is
  ``policy@step``. Its start and end are the call's own. (No time to first token: the
  gateway records when the upstream's headers arrived, which for a stream precede the first
  token.) A call held out for evaluation tags its trace ``eval`` and says ``"eval": true``
  in the trace's and the observation's metadata, so held-out runs can be filtered.
- a reward or a RULER verdict -> a score on that trace (every reward, as burnish keeps
  every reward; the latest is the trajectory's).
- a training step -> an event in a trace of its own, in one session per policy.

How: the caller (the gateway's event loop, the trainer) only puts an item on a bounded
queue; when it is full the item is dropped and counted, never waited for. One thread takes
what is queued (up to ``BATCH_MAX`` items) and sends it the way the ``langfuse`` package
does: observations as OpenTelemetry spans in Langfuse's attribute conventions, through
OpenTelemetry's OTLP exporter (protobuf, gzip) to Langfuse's OTLP endpoint; scores with
the package's API client. While a batch is in flight the next one gathers, as in the
store's group commit. The thread sends synchronously, so each item ends counted exactly
once in ``burnish_langfuse_items_total``: sent, failed (refused, or unreachable after the
retries) or dropped.

The high-level ``Langfuse`` client is not used: it stamps an observation with the moment
it is created rather than the call's own times, sends from threads whose failures are only
logged, and keeps one client per public key for the whole process. Nor is the API client
used for spans: its JSON encoding costs ~2.5 ms of CPU a span (bench/langfuse_overhead.py),
in the gateway's process.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from burnish_server.core.platform.ids import adapter_name
from burnish_server.core.protocols.records import CallRecord
from burnish_server.core.protocols.transcript import UnreadableCall, exchange
from burnish_server.telemetry.exporter import Exporter
from burnish_server.telemetry.watchers import Decision, Step

if TYPE_CHECKING:
    from burnish_server.core.platform.settings import Settings

log = logging.getLogger("burnish.langfuse")

# A batch is sent when it holds BATCH_MAX items or its first item has waited LINGER_S: at a
# trickle of calls, one request to Langfuse a second rather than one a call; under load, a
# request per 256 items keeps up with a distant Langfuse (at 150 ms a round trip, ~1,700 a
# second). Langfuse's own SDK uses OpenTelemetry's batch processor: 5 s or 512 spans.
BATCH_MAX = 256
LINGER_S = 1.0
_encode = msgspec.json.Encoder(enc_hook=str).encode
# Of a call's request, what Langfuse shows as model parameters (the rest of the body is the input).
MODEL_PARAMETERS = (
    "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "seed", "stop",
    "frequency_penalty", "presence_penalty", "tool_choice", "response_format", "reasoning_effort",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Score:
    """A reward (name "reward") or a RULER score (name "ruler") of one trajectory."""

    trajectory_id: str
    name: str
    value: float
    comment: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Fixed when the score is made, so a retried request cannot make it twice in Langfuse.
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


Item = CallRecord | Score | Step | Decision


@dataclass(slots=True)
class _Batch:
    spans: list[Any] = field(default_factory=list)
    scores: list[Any] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)  # spans by kind
    taken: int = 0


def trace_id(trajectory_id: str) -> str:
    """The Langfuse trace id of a trajectory (Langfuse's own seeded derivation)."""
    from langfuse import Langfuse

    return Langfuse.create_trace_id(seed=trajectory_id)


class LangfuseExport(Exporter[Item]):
    def __init__(
        self,
        *,
        public_key: str,
        secret_key: str,
        base_url: str,
        timeout_s: float,
        attempts: int,
        queue_size: int,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if timeout_s <= 0 or attempts < 1:
            raise ValueError("langfuse_timeout must be above 0 and langfuse_attempts at least 1")
        # Imported here: the package (pydantic, OpenTelemetry) loads only when export is on.
        from langfuse.api import LangfuseAPI
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        base_url = base_url.rstrip("/")
        # Spans are made here and handed to the exporter by this module, not by a span processor.
        self._tracer = TracerProvider(resource=Resource.create({"service.name": "burnish"}), shutdown_on_exit=False).get_tracer("burnish")
        auth = "Basic " + base64.b64encode(f"{public_key}:{secret_key}".encode()).decode()
        self._spans = OTLPSpanExporter(
            endpoint=f"{base_url}/api/public/otel/v1/traces",
            # What Langfuse asks of OTLP exporters: Basic auth with the keys, its ingestion version.
            headers={"Authorization": auth, "x-langfuse-public-key": public_key, "x-langfuse-ingestion-version": "4"},
            # OpenTelemetry retries 429/502/503/504 and lost connections with backoff within this.
            timeout=timeout_s * attempts,
            compression=Compression.Gzip,
        )
        self._http = httpx.Client(timeout=timeout_s)
        self.api = LangfuseAPI(
            base_url=base_url,
            username=public_key,
            password=secret_key,
            x_langfuse_sdk_name="burnish",
            x_langfuse_public_key=public_key,
            timeout=timeout_s,
            httpx_client=self._http,
        )
        self.retries = max(attempts - 1, 0)
        self.items = Counter(
            "burnish_langfuse_items",
            "Items for Langfuse by kind and outcome: sent; failed (refused, or unreachable after retries); dropped (queue full)",
            ["kind", "outcome"], registry=registry,
        )  # fmt: skip
        super().__init__("burnish-langfuse", queue_size)
        Gauge("burnish_langfuse_queue", "Items waiting to be sent to Langfuse", registry=registry).set_function(self.queue.qsize)
        self._lock = threading.Lock()  # counting, against close() giving up on a batch in flight
        self._inflight: dict[str, int] = {}  # by kind: items the thread took and has not counted
        self._abandoned = False
        self.start()

    @classmethod
    def from_settings(cls, settings: Settings, registry: CollectorRegistry | None = None) -> LangfuseExport | None:
        """The export the settings ask for, or None when no keys are set."""
        if not (settings.langfuse_public_key and settings.langfuse_secret_key):
            return None
        return cls(
            public_key=settings.langfuse_public_key,
            secret_key=settings.langfuse_secret_key,
            base_url=settings.langfuse_base_url,
            timeout_s=settings.langfuse_timeout,
            attempts=settings.langfuse_attempts,
            queue_size=settings.langfuse_queue_size,
            registry=registry,
        )

    # ---- the caller's side: never blocks -------------------------------------------------

    def on_dropped(self, item: Item) -> None:
        self.items.labels(_kind(item), "dropped").inc()

    # As a watcher of training (telemetry/watchers.py): each step and decision an event.
    def step(self, step: Step) -> None:
        self.put(step)

    def decision(self, decision: Decision) -> None:
        self.put(decision)

    def put_calls(self, items: list[Any]) -> None:
        """The calls among a commit's items (the writer's on_commit)."""
        for item in items:
            if isinstance(item, CallRecord):
                self.put(item)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, for at most ``timeout_s``; what is left then is counted as dropped."""
        self.stop(timeout_s)
        with self._lock:
            self._abandoned = True  # a batch still in flight is counted here, not when it ends
            left = dict(self._inflight)
        while (item := self.take(0)) is not None:
            left[_kind(item)] = left.get(_kind(item), 0) + 1
        for kind, n in left.items():
            if n > 0:
                self.items.labels(kind, "dropped").inc(n)
        if any(left.values()):
            log.warning("Langfuse export stopped with %s unsent", left)
        self._http.close()
        self._spans.shutdown()

    # ---- the export thread ---------------------------------------------------------------

    def run(self) -> None:
        while True:
            first = self.take()
            if first is None:
                if self.stopping.is_set():
                    return
                continue
            # Each item is turned into Langfuse data as it is taken, so the work is spread over
            # the linger rather than done in one burst that would hold the GIL from the event loop.
            batch = _Batch()
            self._add(batch, first)
            deadline = time.monotonic() + LINGER_S
            while batch.taken < BATCH_MAX:
                item = self.take(0 if self.stopping.is_set() else max(deadline - time.monotonic(), 0))
                if item is None:
                    break
                self._add(batch, item)
            self._send(batch)

    def _add(self, batch: _Batch, item: Item) -> None:
        batch.taken += 1
        with self._lock:  # taken and not yet counted: what close() counts as dropped if it gives up
            if self._abandoned:
                self.items.labels(_kind(item), "dropped").inc()
                return
            self._inflight[_kind(item)] = self._inflight.get(_kind(item), 0) + 1
        try:
            if isinstance(item, Score):
                batch.scores.append(_score(item))
                return
            event = _generation(item) if isinstance(item, CallRecord) else _step_event(item) if isinstance(item, Step) else _decision_event(item)
            batch.spans.append(self._span(*event))
            batch.kinds[_kind(item)] = batch.kinds.get(_kind(item), 0) + 1
        except Exception:  # one odd record must not stop the thread
            log.exception("could not turn a %s into Langfuse data", _kind(item))
            self._count({_kind(item): 1}, "failed")

    def _send(self, batch: _Batch) -> None:
        from langfuse.api import CreateScoreBatchResults
        from opentelemetry.sdk.trace.export import SpanExportResult

        if batch.spans:
            try:  # the exporter logs why a batch failed (a status, a connection error)
                sent = self._spans.export(batch.spans) is SpanExportResult.SUCCESS
            except Exception:
                log.exception("the OTLP exporter failed")
                sent = False
            self._count(batch.kinds, "sent" if sent else "failed")
        if batch.scores:
            try:
                response = self.api.scores.create(request=batch.scores, request_options={"max_retries": self.retries})
            except Exception as exc:
                self._count({"score": len(batch.scores)}, "failed", _reason(exc))
                return
            rejected = response.rejected if isinstance(response, CreateScoreBatchResults) else 0
            if rejected:  # 207: Langfuse took some and refused the rest (no retry: they would be refused again)
                self._count({"score": rejected}, "failed", "; ".join(e.message for e in response.errors)[:500])
            self._count({"score": len(batch.scores) - rejected}, "sent")

    def _count(self, kinds: dict[str, int], outcome: str, reason: str = "") -> None:
        with self._lock:
            if self._abandoned:  # close() gave up on this batch and counted it dropped
                return
            if outcome == "failed":
                log.warning("Langfuse did not take %s%s", ", ".join(f"{n} {kind}s" for kind, n in kinds.items()), f": {reason}" if reason else "")
            for kind, n in kinds.items():
                if n:
                    self.items.labels(kind, outcome).inc(n)
                    self._inflight[kind] -= n

    def _span(self, trace: str, name: str, start: datetime, end: datetime, attributes: dict[str, Any]) -> Any:
        """An ended OpenTelemetry span in the Langfuse trace ``trace``, with the given times."""
        from opentelemetry import trace as otel

        # A remote parent carries the trace id in; Langfuse reads as_root as "no parent observation",
        # as its own SDK marks spans started in a given trace.
        parent = otel.NonRecordingSpan(
            otel.SpanContext(int(trace, 16), int.from_bytes(os.urandom(8)), is_remote=True, trace_flags=otel.TraceFlags(otel.TraceFlags.SAMPLED))
        )
        values = {k: v if _primitive(v) else _encode(v).decode() for k, v in attributes.items() if v is not None}
        span = self._tracer.start_span(
            name, context=otel.set_span_in_context(parent), start_time=_ns(start), attributes=values | {"langfuse.internal.as_root": True}
        )
        if attributes.get("langfuse.observation.level") == "ERROR":
            span.set_status(otel.Status(otel.StatusCode.ERROR, attributes.get("langfuse.observation.status_message")))
        span.end(end_time=_ns(end))
        return span


def _primitive(value: Any) -> bool:
    """An OpenTelemetry attribute value as it is: a scalar, or a list of strings (Langfuse's trace
    tags are one); anything else goes as JSON text, which Langfuse decodes."""
    if isinstance(value, list):
        return all(isinstance(v, str) for v in value)
    return isinstance(value, (str, bool, int, float))


def _kind(item: Item) -> str:
    return "generation" if isinstance(item, CallRecord) else "score" if isinstance(item, Score) else "event"


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status is not None else f"{type(exc).__name__}: {exc}"[:300]


# ---- burnish's records in Langfuse's terms ---------------------------------------------------


def _generation(call: CallRecord) -> tuple[str, str, datetime, datetime, dict[str, Any]]:
    request = call.request_json()
    body = request if isinstance(request, dict) else {}
    version = call.version
    metadata = {
        "trajectory_id": call.trajectory_id,
        "group_id": call.group_id,
        "policy": call.policy,
        "version": version,
        "endpoint": call.endpoint,
        "stream": call.stream,
        "status": call.status,
        "http_status": call.http_status,
        "attempts": call.attempts,
        "eval": call.eval or None,  # said only when held out, like the trace's metadata
    }
    shown, answer = _conversation(call)
    attributes = {
        **_trace_attributes(call.trajectory_id, call.group_id, call.policy, version, held_out=call.eval),
        "langfuse.observation.type": "generation",
        "langfuse.observation.input": shown,
        "langfuse.observation.output": answer,
        "langfuse.observation.model.name": call.upstream_model or call.model,
        "langfuse.observation.model.parameters": {k: body[k] for k in MODEL_PARAMETERS if k in body} or None,
        "langfuse.observation.usage_details": _usage(call.usage),
        "langfuse.observation.metadata": {k: v for k, v in metadata.items() if v is not None},
        "langfuse.version": version,
    }
    if call.error:
        attributes |= {"langfuse.observation.level": "ERROR", "langfuse.observation.status_message": call.error[:2000]}
    return trace_id(call.trajectory_id), call.endpoint, call.started_at, call.finished_at, attributes


def _training_event(policy: str, step: int, name: str, at: datetime, fields: dict[str, Any]) -> tuple[str, str, datetime, datetime, dict[str, Any]]:
    """An event in the trace of one step of a policy (its session: the policy's training). An
    event is a moment: when it was recorded (a step's duration is in its metrics, "seconds")."""
    session = f"train:{policy}"
    attributes = {
        "langfuse.trace.name": f"train {adapter_name(policy, step)}",
        "session.id": session,
        "langfuse.trace.metadata": {"policy": policy, "step": step},
        "langfuse.observation.type": "event",
        "langfuse.version": adapter_name(policy, step),
        **fields,
    }
    return trace_id(f"{session}@{step}"), name, at, at, attributes


def _step_event(step: Step) -> tuple[str, str, datetime, datetime, dict[str, Any]]:
    fields = {
        "langfuse.observation.input": {"parent": step.parent, "groups": step.groups},
        "langfuse.observation.output": step.metrics.figures(),
        "langfuse.observation.metadata": {"policy": step.policy, "step": step.step, "parent": step.parent},
    }
    return _training_event(step.policy, step.step, "training step", step.recorded_at, fields)


def _decision_event(decision: Decision) -> tuple[str, str, datetime, datetime, dict[str, Any]]:
    """In the trace of the step it decides, beside that step's event."""
    record = decision.record
    fields = {
        "langfuse.observation.output": msgspec.to_builtins(record),
        "langfuse.observation.metadata": {"policy": decision.policy, "step": decision.step, "decision": record.decision},
    }
    return _training_event(decision.policy, decision.step, record.decision, record.decided_at or datetime.now(UTC), fields)


def _trace_attributes(trajectory_id: str, group_id: str | None, policy: str | None, version: str | None, *, held_out: bool = False) -> dict[str, Any]:
    metadata = {"trajectory_id": trajectory_id, "group_id": group_id, "policy": policy, "version": version, "eval": held_out or None}
    return {
        "langfuse.trace.name": policy or "trajectory",
        "session.id": group_id,
        "langfuse.trace.metadata": {k: v for k, v in metadata.items() if v is not None},
        # Langfuse filters traces by tag: the held-out runs apart from the training ones.
        "langfuse.trace.tags": ["eval"] if held_out else None,
    }


def _score(score: Score) -> Any:
    from langfuse.api import CreateScoreRequest, ScoreDataType

    trace = trace_id(score.trajectory_id)
    return CreateScoreRequest(
        id=score.id,
        trace_id=trace,
        name=score.name,
        value=score.value,
        data_type=ScoreDataType.NUMERIC,
        comment=score.comment,
        metadata={"trajectory_id": score.trajectory_id, **score.metadata},
    )


def _ns(moment: datetime) -> int:
    if moment.tzinfo is None:  # the store's times are UTC
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e6) * 1000


def _conversation(call: CallRecord) -> tuple[Any, Any]:
    """Input and output as Langfuse renders a chat: the prompt's messages (with the tools, if
    any) and the answer message (a list when n > 1), whatever protocol the call spoke. A body
    that is not its endpoint's shape goes as text."""
    try:
        turn = exchange(call)
    except UnreadableCall:
        return _text(call.request), _text(call.response)
    messages = [m.chat() for m in turn.prompt]
    shown = {"messages": messages, "tools": turn.tools} if turn.tools else messages
    answers = [m.chat() for m in turn.answers]
    if call.response is None:
        return shown, None
    return shown, answers[0] if len(answers) == 1 else answers


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw[:20_000].decode("utf-8", "replace")


def _usage(usage: dict[str, Any] | None) -> dict[str, int] | None:
    if not usage:
        return None
    out = {
        "input": usage.get("prompt_tokens", usage.get("input_tokens")),
        "output": usage.get("completion_tokens", usage.get("output_tokens")),
        "total": usage.get("total_tokens"),
    }
    return {k: int(v) for k, v in out.items() if isinstance(v, (int, float))} or None
