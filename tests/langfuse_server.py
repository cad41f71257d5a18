"""A stand-in for Langfuse's ingestion on a loopback socket.

It takes what a Langfuse server takes from exporters: OTLP traces (protobuf, gzip or not)
at ``/api/public/otel/v1/traces`` and score batches (JSON) at ``/api/public/scores``,
behind Basic auth. It keeps every request and flattens what it accepted into ``spans`` and ``scores``.
``mode`` makes it misbehave: "ok", "stall" (hold each request ``stall_s``), or an HTTP
status to answer with (503, 401, ...).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.servers import http_body

PUBLIC_KEY, SECRET_KEY = "pk-lf-test", "sk-lf-test"


class Langfuse:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.epoch = getattr(self, "epoch", 0) + 1  # a request held from before a reset records nothing
        self.mode: str | int = "ok"
        self.stall_s = 30.0
        self.requests: list[dict[str, Any]] = []  # path, headers, body, for every request
        self.spans: list[dict[str, Any]] = []
        self.scores: list[dict[str, Any]] = []

    def generations(self) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["attributes"].get("langfuse.observation.type") == "generation"]

    def events(self) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["attributes"].get("langfuse.observation.type") == "event"]

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - raw ASGI
        if (body := await http_body(scope, receive, send)) is None:
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append({"path": scope["path"], "headers": headers, "body": body})
        epoch = self.epoch
        if self.mode == "stall":
            await asyncio.sleep(self.stall_s)
        status, out = self.answer(scope["path"], headers, body) if epoch == self.epoch else (503, {"message": "from an earlier test"})
        payload = json.dumps(out).encode()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        if isinstance(self.mode, int):
            return self.mode, {"message": "no"}
        if headers.get("authorization") != "Basic " + base64.b64encode(f"{PUBLIC_KEY}:{SECRET_KEY}".encode()).decode():
            return 401, {"message": "Invalid credentials"}
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if path == "/api/public/otel/v1/traces":
            assert headers["content-type"] == "application/x-protobuf"
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope_spans in resource.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append({
                            "traceId": span.trace_id.hex(),
                            "spanId": span.span_id.hex(),
                            "parentSpanId": span.parent_span_id.hex(),
                            "name": span.name,
                            "startTimeUnixNano": span.start_time_unix_nano,
                            "endTimeUnixNano": span.end_time_unix_nano,
                            "status": span.status.code,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                        })  # fmt: skip
            return 200, {}
        if path == "/api/public/scores":
            self.scores.extend(json.loads(body))
            return 202, {"message": "Accepted"}
        return 404, {"message": f"no route {path}"}


def _value(value: Any) -> Any:
    """An OTLP attribute value; the JSON strings Langfuse reads (input, output, ...) decoded."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        try:
            return json.loads(value.string_value)
        except ValueError:
            return value.string_value
    if kind == "array_value":  # a list of plain values (Langfuse's trace tags)
        return [_value(v) for v in value.array_value.values]
    assert kind in ("int_value", "double_value", "bool_value"), kind
    return getattr(value, kind)
