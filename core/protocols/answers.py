"""An upstream's answers as the gateway reads them while it serves a call, typed.

``wire.py`` mirrors what was recorded, for the readers that turn a record into a
conversation. This module is the other side: what the gateway reads in an answer as it
passes. The events each surface's stream assembler folds (``core/protocols/surfaces/``), the chat
chunks the translators turn into another protocol (``core/protocols/translate/``), the token ids and
logprobs that capture keeps (``gateway/proxy/capture.py``).

An answer is converted into these (``msgspec.convert`` from its decoded JSON) before any of
it is read. An answer of the wrong shape fails there, with ``msgspec.ValidationError``. That
is the one error the gateway takes for the upstream's fault. The code after it reads typed
fields, so a TypeError or AttributeError there is the gateway's own bug and surfaces as one.

Only the fields that are read are declared; unknown ones are ignored (each vLLM release adds
some). Pieces the record keeps whole (usage, a Responses ``response``, a Messages content
block, logprob entries) are declared as JSON objects: stored, not read, so their insides are
not checked here. Where one of them is read after all (a translator reads usage's token
counts), it is converted where it is read.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET

# Choices, tool calls and content blocks per answer: an index beyond is the upstream's error
# (a stream that said index 10**9 would have the assembler grow a list that long).
MAX_INDEX = 10_000
Index = Annotated[int, msgspec.Meta(ge=0, lt=MAX_INDEX)]
# Token ids are stored as int32 (core/protocols/packed.py).
TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Ids = list[TokenId]
JSONObject = dict[str, Any]


class Answer(msgspec.Struct):
    """Base of the read shapes: unknown fields ignored."""


# ---- chat completions ---------------------------------------------------------------------


class FunctionDelta(Answer):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Answer):
    index: Index | None = None  # None: the next call
    id: str | None = None
    type: str | None = None
    function: FunctionDelta | None = None


class ChatDelta(Answer):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None  # vLLM's reasoning parsers (both names are in use)
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatLogprobs(Answer):
    content: list[JSONObject] | None = None
    refusal: list[JSONObject] | None = None


class ChatChunkChoice(Answer):
    index: Index = 0
    delta: ChatDelta | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or token that ended it
    logprobs: ChatLogprobs | None = None
    token_ids: Ids | None = None  # vLLM's return_token_ids


class ChatChunk(Answer):
    """One ``chat.completion.chunk``. The head fields are copied into the answer as they are
    (UNSET where a chunk does not carry them)."""

    id: Any = UNSET
    created: Any = UNSET
    model: Any = UNSET
    system_fingerprint: Any = UNSET
    service_tier: Any = UNSET
    usage: JSONObject | None = None
    prompt_token_ids: Ids | None = None
    choices: list[ChatChunkChoice] | None = None


CHUNK_HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")


class ChatMessage(Answer):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None  # a whole answer's calls: deltas with no index


class ChatChoice(Answer):
    index: Index = 0
    message: ChatMessage | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletion(Answer):
    """A plain ``chat.completion``, as the translators read it."""

    choices: list[ChatChoice] = []
    usage: JSONObject | None = None
    prompt_token_ids: Ids | None = None


class PromptDetails(Answer):
    cached_tokens: int | None = None


class Usage(Answer):
    """Token counts, as the translators report them in their own protocol's usage."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None


# ---- completions --------------------------------------------------------------------------


class CompletionLogprobs(Answer):
    tokens: list[Any] | None = None
    token_logprobs: list[Any] | None = None
    top_logprobs: list[Any] | None = None
    text_offset: list[Any] | None = None


class CompletionChunkChoice(Answer):
    index: Index = 0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: Ids | None = None
    prompt_token_ids: Ids | None = None


class CompletionChunk(Answer):
    """One streamed ``text_completion``."""

    id: Any = UNSET
    created: Any = UNSET
    model: Any = UNSET
    system_fingerprint: Any = UNSET
    usage: JSONObject | None = None
    choices: list[CompletionChunkChoice] | None = None


# ---- the Responses API ----------------------------------------------------------------------


class ResponsesEvent(Answer):
    """A Responses stream event. Every ``*.delta`` event of the protocol carries a string."""

    type: str | None = None
    response: JSONObject | None = None
    delta: str | None = None


# ---- Anthropic Messages -----------------------------------------------------------------------


class MessagesEvent(Answer):
    """A Messages stream event. ``delta`` is kept as an object: ``message_delta`` merges it
    whole into the message, ``content_block_delta`` reads it as a ``ContentDelta``."""

    type: str | None = None
    index: Index = 0
    message: JSONObject | None = None
    content_block: JSONObject | None = None
    delta: JSONObject | None = None
    usage: JSONObject | None = None


class MessageStart(Answer):
    """``message_start``'s message, kept whole; its usage is read (``message_delta`` adds to it)."""

    usage: JSONObject | None = None


class ContentBlock(Answer):
    """``content_block_start``'s block, kept whole; its text and thinking are added to."""

    text: str | None = None
    thinking: str | None = None


class ContentDelta(Answer):
    type: str | None = None
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    partial_json: str | None = None
    citation: Any = None


# ---- token ids and logprobs (vLLM's fields, chat and completions) -----------------------------


class SampledLogprob(Answer):
    logprob: float | None = None


class TokenLogprobs(Answer):
    content: list[SampledLogprob] | None = None  # chat
    token_logprobs: list[float | None] | None = None  # completions


class TokenChoice(Answer):
    index: Index = 0
    token_ids: Ids | None = None
    prompt_token_ids: Ids | None = None
    logprobs: TokenLogprobs | None = None


class TokenAnswer(Answer):
    """What capture keeps of a chat completion or completion: the sampled tokens."""

    choices: list[TokenChoice] = []
    prompt_token_ids: Ids | None = None
