"""The served window, as a client understands it: vLLM's refusals read, and told in each
protocol's own words.

vLLM (0.32) refuses a request that does not fit the model's window (``--max-model-len``) with a
400 whose message says why; this module reads the two kinds:

- ``max_tokens=32000 cannot be greater than max_model_len=8192``: the budget alone is past the
  window. vLLM gives a budget up to the window whatever the prompt leaves of it (a prompt of
  7,000 tokens with max_tokens 2,000 is served, up to 1,192 tokens), so the gateway lowers the
  budget to the window and sends the call again (``MaxTokensPastWindow``).
- ``This model's maximum context length is 8192 tokens. However, your prompt contains at
  least 8193 input tokens``: the prompt itself is too long (``PromptPastWindow``). A client must
  hear it in the words it acts on: ``context_length_exceeded`` on the OpenAI surfaces (the
  Codex CLI says it ran out of room in the model's window), "prompt is too long: N tokens > M
  maximum" on Anthropic's (Claude Code reads both numbers, and compacts or says so).
"""

from __future__ import annotations

import re

import msgspec

_MAX_TOKENS = re.compile(r"max_(?:completion_)?tokens=(\d+) cannot be greater than max_model_len=(\d+)")
_PROMPT = re.compile(r"maximum context length is (\d+) tokens\. However, your prompt contains (?:at least )?(\d+) (input tokens|characters)")


class MaxTokensPastWindow(msgspec.Struct, frozen=True):
    asked: int
    window: int


class PromptPastWindow(msgspec.Struct, frozen=True):
    window: int
    # Tokens in the prompt as far as vLLM counted (it stops one past the window); None where
    # it counted characters only.
    at_least: int | None


Refusal = MaxTokensPastWindow | PromptPastWindow


def refusal(message: str) -> Refusal | None:
    """What an upstream's 400 message says about the window, if it is a window refusal."""
    if found := _MAX_TOKENS.search(message):
        return MaxTokensPastWindow(int(found[1]), int(found[2]))
    if found := _PROMPT.search(message):
        return PromptPastWindow(int(found[1]), int(found[2]) if found[3] == "input tokens" else None)
    return None


# The error code OpenAI's API answers a prompt past the window with, which clients act on.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def openai_message(prompt_tokens: int, window: int) -> str:
    """OpenAI's own words for a prompt past the window."""
    return (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in {prompt_tokens} tokens. "
        "Please reduce the length of the messages."
    )


def anthropic_message(prompt_tokens: int, window: int) -> str:
    """Anthropic's own words for a prompt past the window (Claude Code reads both numbers)."""
    return f"prompt is too long: {prompt_tokens} tokens > {window} maximum"
