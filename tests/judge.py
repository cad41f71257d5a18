"""A deterministic judge on a loopback socket: it answers RULER's chat calls from a script.

``Judge.script`` is a list of answers, used in turn (the last one repeats): each is a
callable of the trajectory ids the request's schema names, returning the message content
(a string), an int for an HTTP status with an error body, or a ``Reply``: any status and
body, sent late or slowly. Every request is kept.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.servers import http_body


@dataclass
class Reply:
    """A raw answer: ``body`` as it is, after ``delay_s``, one byte every ``drip_s`` if set."""

    status: int = 200
    body: str = ""
    delay_s: float = 0.0
    drip_s: float = 0.0


Answer = Callable[[list[str]], "str | int | Reply"]


def raw(status: int, body: str = "", *, delay_s: float = 0.0, drip_s: float = 0.0) -> Answer:
    return lambda ids: Reply(status, body, delay_s, drip_s)


def scores(values: dict[str, float] | Callable[[str], float]) -> Answer:
    """A valid verdict: a score (and an explanation) for every id asked for."""

    def answer(ids: list[str]) -> str:
        pick = values if callable(values) else values.__getitem__
        return json.dumps({t: {"explanation": f"{t} judged", "score": pick(t)} for t in ids})

    return answer


def first_token(top: dict[str, float]) -> Answer:
    """An answer of one token, with its likeliest alternatives' logprobs (the next-message judge's)."""
    best = max(top, key=top.__getitem__)
    logprobs = {"content": [{"token": best, "logprob": top[best], "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top.items()]}]}
    choice = {"index": 0, "message": {"role": "assistant", "content": best}, "logprobs": logprobs, "finish_reason": "length"}
    body = {"id": "chatcmpl-judge", "object": "chat.completion", "created": 0, "model": "judge", "choices": [choice]}
    return raw(200, json.dumps(body))


class Judge:
    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.requests: list[dict[str, Any]] = []
        # Where set, each answer comes from the request itself (a judge that reads what it is shown).
        self.reads: Callable[[dict[str, Any]], Answer] | None = None

    def ids(self, request: dict[str, Any]) -> list[str]:
        if "response_format" not in request:  # the next-message judge asks for one token
            return []
        return request["response_format"]["json_schema"]["schema"]["required"]

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - raw ASGI
        if (body := await http_body(scope, receive, send)) is None:
            return
        request = json.loads(body)
        request["_headers"] = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append(request)
        step = self.reads(request) if self.reads is not None else self.script[min(len(self.requests) - 1, len(self.script) - 1)]
        out = step(self.ids(request))
        if isinstance(out, Reply):
            await asyncio.sleep(out.delay_s)
            await send({"type": "http.response.start", "status": out.status, "headers": [(b"content-type", b"application/json")]})
            if out.drip_s:
                for byte in out.body.encode():
                    await send({"type": "http.response.body", "body": bytes([byte]), "more_body": True})
                    await asyncio.sleep(out.drip_s)
                await send({"type": "http.response.body", "body": b""})
            else:
                await send({"type": "http.response.body", "body": out.body.encode()})
            return
        if isinstance(out, int):
            status, payload = out, {"error": {"message": "judge says no", "type": "server_error", "code": None, "param": None}}
        else:
            status = 200
            payload = {
                "id": "chatcmpl-judge",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "stop"}],
            }
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})
