"""A small deterministic OpenAI-compatible upstream for tests, with injectable faults.

Answers are a pure function of the request, so a test can compute what the
client must see. Token ids are the UTF-8 bytes of the text and logprobs are
``-(i + 1) / 100``, in vLLM's field layout (``prompt_token_ids``, ``token_ids``)
when the request sets ``return_token_ids``.

``/tokenize`` answers the prompt's UTF-8 bytes too, shifted by one for a model named
``other-...`` (a teacher with another tokenizer).

Faults, chosen per request by the ``X-Fault`` header (the gateway forwards it):
  ``503-once:<key>``  first request with that key gets 503, later ones succeed
  ``status:<code>``   always that status, OpenAI error body
  ``html:<code>``     that status with a non-JSON body
  ``stall:<secs>``    wait before answering
  ``cut:<n>``         stream n events, then drop the connection
  ``slow:<secs>``     wait between streamed events
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

WORDS_PER_EVENT = 1


def answer_text(body: dict[str, Any]) -> str:
    """The text every endpoint answers with: derived from the last user input."""
    if "messages" in body:
        last = next((m for m in reversed(body["messages"]) if m.get("role") == "user"), {"content": ""})
        content = last.get("content")
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        prompt = content or ""
    elif "input" in body:
        prompt = body["input"] if isinstance(body["input"], str) else json.dumps(body["input"])
    else:
        prompt = body.get("prompt", "")
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return f"You said: {prompt[:200]} ok"


def choice_text(body: dict[str, Any], index: int) -> str:
    return answer_text(body) + ("" if index == 0 else f" #{index}")


def token_ids(text: str) -> list[int]:
    return list(text.encode())


def logprobs_for(text: str) -> list[float]:
    return [-(i + 1) / 100 for i in range(len(text.encode()))]


def prompt_ids(body: dict[str, Any]) -> list[int]:
    return list(json.dumps(body.get("messages", body.get("prompt", "")), sort_keys=True).encode())[:64]


def words(text: str) -> list[str]:
    parts = text.split(" ")
    return [p + (" " if i < len(parts) - 1 else "") for i, p in enumerate(parts)]


class Upstream:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fault_hits: Counter[str] = Counter()
        self.models = ["tiny"]  # what GET /v1/models lists (vLLM lists its adapters there too)

    # ---- ASGI -------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        self.requests.append({"path": path, "headers": headers, "body": body})
        fault = headers.get("x-fault", "")
        kind, _, arg = fault.partition(":")

        if kind == "503-once":
            self.fault_hits[arg] += 1
            if self.fault_hits[arg] == 1:
                return await self._json(send, 503, {"error": {"message": "busy", "type": "server_error", "code": 503}})
        if kind == "status":
            return await self._json(send, int(arg), {"error": {"message": f"fault {arg}", "type": "server_error", "code": int(arg)}})
        if kind == "echo-key":  # an upstream quoting the credential it refused, as OpenAI's does
            message = f"Incorrect API key provided: {headers.get('authorization', '')}"
            if arg == "late":  # the key straddles the 500th byte, where an error's message is cut
                message = "x" * 480 + message
            if arg == "text":
                return await self._send(send, 401, message.encode(), b"text/plain")
            if arg == "stream":
                await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
                await send(
                    {"type": "http.response.body", "body": _sse({"error": {"message": message, "type": "server_error", "code": 500}}), "more_body": True}
                )
                await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
                return
            return await self._json(send, 401, {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}})
        if kind == "html":
            return await self._send(send, int(arg), b"<html>bad gateway</html>", b"text/html")
        if kind == "stall":
            await asyncio.sleep(float(arg))

        if scope["method"] == "GET" and path == "/health":  # as vLLM answers it
            return await self._send(send, 200, b"", b"text/plain")
        if scope["method"] == "GET" and path == "/v1/models":
            return await self._json(send, 200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "test"} for m in self.models]})
        try:
            req = json.loads(body)
        except ValueError:
            return await self._json(send, 400, {"error": {"message": "bad json", "type": "BadRequestError", "code": 400}})
        if path == "/tokenize":  # the UTF-8 bytes, as its answers' ids; a model named other-* has another tokenizer
            model, ids = str(req.get("model", "")), list(str(req.get("prompt", "")).encode())
            if model not in self.models:
                return await self._json(send, 404, {"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}})
            return await self._json(send, 200, {"tokens": [i + 1 for i in ids] if model.startswith("other-") else ids, "count": len(ids)})
        handler = {
            "/v1/chat/completions": self.chat,
            "/v1/completions": self.completions,
            "/v1/responses": self.responses,
            "/v1/messages": self.messages,
        }.get(path)
        if handler is None:
            return await self._json(send, 404, {"error": {"message": f"no route {path}", "type": "NotFoundError", "code": 404}})
        plain, events = handler(req)
        if not req.get("stream"):
            return await self._json(send, 200, plain)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        cut = int(arg) if kind == "cut" else None
        delay = float(arg) if kind == "slow" else 0.0
        for i, event in enumerate(events):
            if cut is not None and i >= cut:
                raise ConnectionAbortedError("fault: cut")  # uvicorn drops the connection mid-body
            if delay:
                await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send: Any, status: int, body: bytes, ctype: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype), (b"x-upstream", b"test")]})
        await send({"type": "http.response.body", "body": body})

    async def _json(self, send: Any, status: int, obj: Any) -> None:
        await self._send(send, status, json.dumps(obj).encode(), b"application/json")

    # ---- endpoints: (plain response, stream events) --------------------------------------
    def chat(self, req: dict[str, Any]) -> tuple[dict, list[bytes]]:
        n = req.get("n", 1)
        want_ids = bool(req.get("return_token_ids"))
        want_lp = bool(req.get("logprobs"))
        tools = req.get("tools")
        choices, events = [], []
        base = {"id": "chatcmpl-test", "created": 1700000000, "model": req.get("model")}
        first: dict[str, Any] = {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None} for i in range(n)],
        }
        if want_ids:
            first["prompt_token_ids"] = prompt_ids(req)
        events.append(first)
        for i in range(n):
            text = choice_text(req, i)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = "stop"
            if tools:
                name = tools[0]["function"]["name"]
                args = json.dumps({"query": text})
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}],
                }
                finish = "tool_calls"
                events.append(
                    {
                        **base,
                        "object": "chat.completion.chunk",
                        "choices": [
                            {
                                "index": i,
                                "delta": {"tool_calls": [{"index": 0, "id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": ""}}]},
                                "finish_reason": None,
                            }
                        ],
                    }
                )
                for j in range(0, len(args), 7):
                    events.append(
                        {
                            **base,
                            "object": "chat.completion.chunk",
                            "choices": [
                                {"index": i, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args[j : j + 7]}}]}, "finish_reason": None}
                            ],
                        }
                    )
            else:
                for piece in words(text):
                    c: dict[str, Any] = {"index": i, "delta": {"content": piece}, "finish_reason": None}
                    if want_ids:
                        c["token_ids"] = token_ids(piece)
                    if want_lp:
                        c["logprobs"] = {"content": []}  # filled by _stream_logprobs
                    events.append({**base, "object": "chat.completion.chunk", "choices": [c]})
            events.append({**base, "object": "chat.completion.chunk", "choices": [{"index": i, "delta": {}, "finish_reason": finish}]})
            choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": finish, "logprobs": None}
            if want_ids:
                choice["token_ids"] = token_ids(text) if not tools else []
            if want_lp and not tools:
                choice["logprobs"] = {
                    "content": [
                        {"token": chr(b) if b < 128 else "?", "logprob": lp, "bytes": [b], "top_logprobs": []}
                        for b, lp in zip(token_ids(text), logprobs_for(text))
                    ]
                }
            choices.append(choice)
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": sum(len(choice_text(req, i).encode()) for i in range(n)),
            "total_tokens": 10 + sum(len(choice_text(req, i).encode()) for i in range(n)),
        }
        plain: dict[str, Any] = {**base, "object": "chat.completion", "choices": choices, "usage": usage}
        if want_ids:
            plain["prompt_token_ids"] = prompt_ids(req)
        if want_lp and not tools:
            # Streamed logprobs: fill each content event with its bytes' entries, in order.
            self._stream_logprobs(events, req, n)
        if (req.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return plain, [_sse(e) for e in events] + [b"data: [DONE]\n\n"]

    def _stream_logprobs(self, events: list[dict], req: dict[str, Any], n: int) -> None:
        used = dict.fromkeys(range(n), 0)
        for event in events:
            for c in event["choices"]:
                if "logprobs" in c:
                    text = choice_text(req, c["index"])
                    piece = c["delta"]["content"].encode()
                    start = used[c["index"]]
                    lps = logprobs_for(text)[start : start + len(piece)]
                    c["logprobs"] = {
                        "content": [{"token": chr(b) if b < 128 else "?", "logprob": lp, "bytes": [b], "top_logprobs": []} for b, lp in zip(piece, lps)]
                    }
                    used[c["index"]] = start + len(piece)

    def completions(self, req: dict[str, Any]) -> tuple[dict, list[bytes]]:
        n = req.get("n", 1)
        want_ids = bool(req.get("return_token_ids"))
        base = {"id": "cmpl-test", "created": 1700000000, "model": req.get("model"), "object": "text_completion"}
        choices, events = [], []
        for i in range(n):
            text = choice_text(req, i)
            choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": "length", "logprobs": None}
            if want_ids:
                choice["token_ids"] = token_ids(text)
                choice["prompt_token_ids"] = prompt_ids(req)
            choices.append(choice)
            for j, piece in enumerate(words(text)):
                c: dict[str, Any] = {"index": i, "text": piece, "finish_reason": None, "logprobs": None}
                if want_ids:
                    c["token_ids"] = token_ids(piece)
                    if j == 0:
                        c["prompt_token_ids"] = prompt_ids(req)
                events.append({**base, "choices": [c]})
            events.append({**base, "choices": [{"index": i, "text": "", "finish_reason": "length", "logprobs": None}]})
        plain = {**base, "choices": choices, "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}
        return plain, [_sse(e) for e in events] + [b"data: [DONE]\n\n"]

    def responses(self, req: dict[str, Any]) -> tuple[dict, list[bytes]]:
        text = answer_text(req)
        item = {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        done = {
            "id": "resp_test",
            "object": "response",
            "created_at": 1700000000,
            "model": req.get("model"),
            "status": "completed",
            "output": [item],
            "usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12},
        }
        started = {**done, "status": "in_progress", "output": [], "usage": None}
        events = [("response.created", {"type": "response.created", "sequence_number": 0, "response": started})]
        for i, piece in enumerate(words(text)):
            events.append(
                (
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "sequence_number": i + 1,
                        "item_id": "msg_test",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": piece,
                    },
                )
            )
        events.append(("response.completed", {"type": "response.completed", "sequence_number": len(events), "response": done}))
        return done, [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]

    def messages(self, req: dict[str, Any]) -> tuple[dict, list[bytes]]:
        text = answer_text(req)
        message = {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": req.get("model"),
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 5, "output_tokens": 7},
        }
        events = [
            (
                "message_start",
                {"type": "message_start", "message": {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}}},
            )
        ]
        events.append(("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}))
        for piece in words(text):
            events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 7}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return message, [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
