"""OpenAI's (legacy) completions: ``POST /v1/completions``.

Served to vLLM as it is, streamed as ``text_completion`` events ending in ``data: [DONE]``;
read as the prompt in one user message and each choice's text as an answer.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from burnish_server.core.protocols import answers, wire
from burnish_server.core.protocols.conversation import Exchange, Message
from burnish_server.core.protocols.surfaces.base import OPENAI_ERRORS, Surface, append, extend, joined

_HEAD = ("id", "created", "model", "system_fingerprint")


class CompletionAssembler:
    """``text_completion`` stream events into one ``text_completion``."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}

    def add(self, chunk: answers.CompletionChunk) -> None:
        for key in _HEAD:
            if key not in self.head and (value := getattr(chunk, key)) is not UNSET:
                self.head[key] = value
        if chunk.usage:
            self.extra["usage"] = chunk.usage
        for c in chunk.choices or ():
            choice = self.choices.setdefault(c.index, {"index": c.index, "text": "", "finish_reason": None, "logprobs": None})
            append(choice, "text", c.text)
            if c.finish_reason is not None:
                choice["finish_reason"] = c.finish_reason
            if c.stop_reason is not None:
                choice["stop_reason"] = c.stop_reason
            if c.logprobs is not None:
                merged = choice["logprobs"] = choice["logprobs"] or {}
                extend(merged, "tokens", c.logprobs.tokens)
                extend(merged, "token_logprobs", c.logprobs.token_logprobs)
                extend(merged, "top_logprobs", c.logprobs.top_logprobs)
                extend(merged, "text_offset", c.logprobs.text_offset)
            extend(choice, "token_ids", c.token_ids)
            if c.prompt_token_ids is not None:
                choice["prompt_token_ids"] = c.prompt_token_ids

    def result(self) -> dict[str, Any]:
        choices = [joined(self.choices[i]) for i in sorted(self.choices)]
        return {**self.head, "object": "text_completion", "choices": choices, **self.extra}


def read(request: wire.CompletionRequest, response: wire.CompletionResponse | None) -> Exchange:
    prompt = request.prompt
    if isinstance(prompt, list):  # a batch of prompts: the first, if it is text
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else "[token ids]" if prompt else ""
    choices = sorted(response.choices, key=lambda c: c.index) if response else []
    return Exchange([Message("user", prompt or "")], None, [Message("assistant", c.text) for c in choices])


def terminal(name: str | None, data: bytes, event: Any) -> bool:
    return data == b"[DONE]"


COMPLETIONS = Surface(
    name="completions",
    path="completions",
    request=wire.CompletionRequest,
    response=wire.CompletionResponse,
    event=answers.CompletionChunk,
    read=read,
    assembler=CompletionAssembler,
    terminal=terminal,
    errors=OPENAI_ERRORS,
    has_choices=True,
    translator=None,
    schema_title="CompletionRequest",
    schema_description="OpenAI's (legacy) completion request (model, prompt, ...)",
)
