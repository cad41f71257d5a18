"""RULER: an LLM judge scores the trajectories of a group relative to each other.

    members' calls -> conversations (one message list each: core/protocols/transcript.py)
                   -> shared prefix shown once, each trajectory's own part after it
                   -> identical trajectories judged once
                   -> one chat call with a JSON schema: a score in [0, 1] and an explanation per id
                   -> checked (every id once, scores in range), retried, then given up with an error

Nothing here touches the store: ``store/ruler.py`` keeps verdicts and rewards,
``gateway/groups/scoring.py`` puts the two together. The judge is any OpenAI-compatible
endpoint the server is configured with; by default the gateway's own upstream.

A failure is described in our own words (``RulerFailed``): the judge's answer never reaches
a caller or the store, only the gateway's log, cut to ``LOG_EXCERPT_CHARS``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from burnish_server.core.learning.verdicts import Score
from burnish_server.core.platform.errors import Unavailable
from burnish_server.core.protocols.transcript import Message

DEFAULT_RUBRIC = """\
- A trajectory that reaches the user's goal scores higher than one that does not; this matters most.
- Among trajectories that reach the goal, the one that gets there more directly and with fewer wasted \
steps (tool calls, turns, tokens) scores higher.
- Give partial credit: a trajectory that makes real progress scores above one that makes none, even if \
neither finishes.
- Keep score gaps proportional to quality gaps: near-equal trajectories get near-equal scores, and a clearly \
better one a clearly higher score. Use the whole range from 0 to 1 when the group warrants it."""

SYSTEM_PROMPT = """\
You are a careful judge of AI agent trajectories. You will see several trajectories that attempt the same \
task. Score each one from 0 to 1 relative to the others, following the rubric, and explain each score in \
one or two sentences. Judge only what the trajectories show.

Rubric:
{rubric}

Answer with JSON only: an object with one key per trajectory id shown, each \
{{"explanation": "...", "score": <0 to 1>}}."""

# Each trajectory's own part is cut from the middle beyond this many characters (about
# 4 characters a token: ~6k tokens), keeping its start and its end.
TRAJECTORY_CHAR_BUDGET = 24_000
# The shared prefix, likewise (system prompt, task, tool definitions the agents share).
CONTEXT_CHAR_BUDGET = 16_000
# A verdict's explanation is kept to this (the judge's schema says so too).
EXPLANATION_MAX_CHARS = 500
# A verdict is a short JSON object; a larger answer is not read further (and is retried).
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# Characters of a failed answer written to the gateway's log (never to a caller or the store).
LOG_EXCERPT_CHARS = 300

log = logging.getLogger("burnish.ruler")


class JudgeOutputError(Unavailable, ValueError):
    """The judge answered, but not with a valid verdict. The message is ours, never the judge's words."""

    default_code = "judge_output_invalid"


class RulerFailed(Unavailable):
    """No valid verdict after every attempt: a message for the caller and the store, in our words."""

    default_code = "ruler_failed"


@dataclass(frozen=True, kw_only=True)
class Judge:
    """A judge's endpoint and how to call it; the defaults are Settings' (judge_*), given by
    scoring.py: _judge."""

    base_url: str  # OpenAI style, ending in /v1
    model: str
    api_key: str
    attempts: int
    timeout_s: float  # one call, whole (connecting, sending, every byte of the answer)
    connect_timeout_s: float
    max_tokens: int
    log_answers: bool  # whether a failed verdict's text (a completion) may go to the log (BURNISH_LOG_BODIES)

    @property
    def name(self) -> str:
        return f"{self.model} at {public_url(self.base_url)}"


def public_url(url: str) -> str:
    """A URL as shown to callers and stored: without a user name or password in it."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "(an invalid URL)"
    return str(parsed.copy_with(userinfo=b"")) if parsed.userinfo else url


def _cut_middle(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    keep = budget // 2
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters omitted ...]\n{text[-keep:]}"


# ---- the prompt ---------------------------------------------------------------------


@dataclass
class Prompt:
    messages: list[dict[str, str]]
    schema: dict[str, Any]
    # Trajectory ids, grouped by identical content: the first of each is the one shown.
    classes: list[list[str]] = field(default_factory=list)

    @property
    def shown_ids(self) -> list[str]:
        return [ids[0] for ids in self.classes]


def build_prompt(trajectories: dict[str, list[Message]], rubric: str | None = None) -> Prompt:
    """The judge's messages for a group: the shared prefix once, each distinct trajectory once."""
    ids = list(trajectories)
    convs = [trajectories[t] for t in ids]
    shared = 0
    while convs and all(len(c) > shared + 1 for c in convs) and all(c[shared] == convs[0][shared] for c in convs):
        shared += 1  # leave at least one message to each trajectory
    classes: dict[tuple[Message, ...], list[str]] = {}
    for t, conv in zip(ids, convs):
        classes.setdefault(tuple(conv[shared:]), []).append(t)

    parts = []
    if shared:
        context = "\n\n".join(m.render() for m in convs[0][:shared])
        parts.append(f"<shared_context>\n{_cut_middle(context, CONTEXT_CHAR_BUDGET)}\n</shared_context>")
    for rest, members in classes.items():
        body = "\n\n".join(m.render() for m in rest)
        parts.append(f'<trajectory id="{members[0]}">\n{_cut_middle(body, TRAJECTORY_CHAR_BUDGET)}\n</trajectory>')
    shown = [members[0] for members in classes.values()]
    user = (
        f"{len(shown)} trajectories attempt the same task"
        + (" after the shared context below" if shared else "")
        + ". Score each one.\n\n"
        + "\n\n".join(parts)
    )
    messages = [{"role": "system", "content": SYSTEM_PROMPT.format(rubric=rubric or DEFAULT_RUBRIC)}, {"role": "user", "content": user}]
    return Prompt(messages, verdict_schema(shown), list(classes.values()))


def verdict_schema(ids: Sequence[str]) -> dict[str, Any]:
    """One property per trajectory id, all required and no others: a judge that follows the
    schema (vLLM's guided decoding does) cannot skip, repeat or invent an id."""
    entry = {
        "type": "object",
        "properties": {"explanation": {"type": "string", "maxLength": EXPLANATION_MAX_CHARS}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["explanation", "score"],
        "additionalProperties": False,
    }
    return {"type": "object", "properties": {t: entry for t in ids}, "required": list(ids), "additionalProperties": False}


def cache_key(judge: Judge, prompt: Prompt) -> str:
    """Same judge, same rubric, same trajectories: same key (the rubric is in the messages)."""
    blob = msgspec.json.encode({"base_url": judge.base_url, "model": judge.model, "messages": prompt.messages})
    return hashlib.sha256(blob).hexdigest()


# ---- the verdict --------------------------------------------------------------------


class _Entry(msgspec.Struct):
    explanation: str
    score: float


def parse_verdict(content: str | None, ids: Sequence[str]) -> dict[str, Score]:
    """The judge's answer -> a score per shown id, or JudgeOutputError saying what is wrong."""
    if not content or not isinstance(content, str):
        raise JudgeOutputError("the judge's answer was empty")
    try:
        # strict=False: raw control characters inside strings are let through by some
        # grammar engines (xgrammar did, for the tiny model); they do not change a score.
        verdict = msgspec.convert(json.loads(content, strict=False), dict[str, _Entry])
    except (json.JSONDecodeError, RecursionError):
        raise JudgeOutputError("the judge's answer was not valid JSON") from None
    except msgspec.ValidationError:  # its message would quote the judge's keys
        raise JudgeOutputError("the judge's answer was not JSON matching the schema ({explanation, score} per trajectory id)") from None
    if set(verdict) != set(ids):
        # The missing ids are ours; the unknown ones are the judge's words, only counted.
        missing, extra = sorted(set(ids) - set(verdict)), set(verdict) - set(ids)
        raise JudgeOutputError(
            f"the judge scored {len(verdict)} trajectories for {len(ids)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; {len(extra)} unknown id{'s' if len(extra) > 1 else ''}" if extra else "")
        )
    for t, e in verdict.items():
        if not math.isfinite(e.score) or not 0 <= e.score <= 1:
            raise JudgeOutputError(f"the judge's score for {t!r} is outside 0..1")
    # The schema bounds an explanation; a judge that ignores it is cut, not trusted. A NUL
    # character is dropped: PostgreSQL's text cannot hold one, and no explanation needs it.
    return {t: Score(float(e.score), e.explanation[:EXPLANATION_MAX_CHARS].replace("\x00", "")) for t, e in verdict.items()}


class _Retry(Unavailable):
    """One attempt failed in a way worth another; the message is ours (never leaves this module)."""


def _excerpt(text: str | bytes) -> str:
    """The start of a remote answer, for the log: cut, and quoted so it cannot forge lines."""
    if isinstance(text, bytes):
        text = text[: LOG_EXCERPT_CHARS * 4].decode("utf-8", "replace")
    return repr(text[:LOG_EXCERPT_CHARS])


def _os_error(exc: BaseException) -> OSError | None:
    """The first OSError with an errno behind an exception (anyio wraps them in others)."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and (e.errno or isinstance(e, socket.gaierror)):
            return e
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


def _unreachable(exc: httpx.TransportError) -> str:
    """Why a judge could not be reached, in our words: an exception's text can quote the
    remote's bytes (h11 does, for a malformed status line), so only its kind is used."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "could not reach the judge: the connection timed out"
    if isinstance(exc, httpx.TimeoutException):
        return "the judge timed out"
    if isinstance(exc, httpx.ConnectError):
        cause = _os_error(exc)
        if isinstance(cause, ConnectionRefusedError):
            return "could not reach the judge: connection refused"
        if isinstance(cause, socket.gaierror):
            return "could not reach the judge: its host name did not resolve"
        if isinstance(cause, OSError) and isinstance(cause.errno, int) and cause.errno > 0:
            return f"could not reach the judge: {os.strerror(cause.errno).lower()}"
        return "could not reach the judge: the connection failed"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the judge broke off the HTTP exchange or answered malformed HTTP"
    if isinstance(exc, httpx.NetworkError):
        return "the connection to the judge broke"
    return f"could not reach the judge ({type(exc).__name__})"


async def _post(client: httpx.AsyncClient, judge: Judge, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    """One call, its answer read up to MAX_ANSWER_BYTES (+1, to tell that there was more)."""
    timeout = httpx.Timeout(judge.timeout_s, connect=min(judge.connect_timeout_s, judge.timeout_s))
    async with client.stream("POST", url, json=body, headers=headers, timeout=timeout, follow_redirects=False) as r:
        data = bytearray()
        async for chunk in r.aiter_bytes():
            data += chunk
            if len(data) > MAX_ANSWER_BYTES:
                break
        return r.status_code, bytes(data)


async def _attempt(client: httpx.AsyncClient, judge: Judge, url: str, body: dict[str, Any], headers: dict[str, str], ids: list[str]) -> dict[str, Score]:
    try:
        async with asyncio.timeout(judge.timeout_s):
            status, data = await _post(client, judge, url, body, headers)
    except TimeoutError:
        raise _Retry(f"the judge timed out (no whole answer in {judge.timeout_s:g} s)") from None
    except httpx.TransportError as exc:
        log.warning("RULER: the judge %s could not be reached: %s: %s", judge.name, type(exc).__name__, _excerpt(str(exc)))
        raise _Retry(_unreachable(exc)) from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # not worth retrying (an invalid URL, say: InvalidURL is no HTTPError)
        log.warning("RULER: the judge %s could not be asked: %s: %s", judge.name, type(exc).__name__, _excerpt(str(exc)))
        raise RulerFailed(f"the judge ({judge.name}) could not be asked ({type(exc).__name__})") from None
    if status in (408, 429) or status >= 500:
        log.warning("RULER: the judge %s answered HTTP %d: %s", judge.name, status, _excerpt(data))
        raise _Retry(f"the judge answered HTTP {status}")
    if status != 200:
        log.warning("RULER: the judge %s refused the request with HTTP %d: %s", judge.name, status, _excerpt(data))
        raise RulerFailed(f"the judge ({judge.name}) refused the request: it answered HTTP {status}")
    if len(data) > MAX_ANSWER_BYTES:
        log.warning("RULER: the judge %s answered more than %d bytes", judge.name, MAX_ANSWER_BYTES)
        raise _Retry(f"the judge's answer was larger than {MAX_ANSWER_BYTES} bytes")
    try:
        content = json.loads(data)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        log.warning("RULER: the judge %s answered HTTP 200 with no chat completion: %s", judge.name, _excerpt(data))
        raise _Retry("the judge's answer was not a chat completion") from None
    try:
        return parse_verdict(content, ids)
    except JudgeOutputError as exc:
        # The verdict's text is a completion: its excerpt is logged only where bodies may be.
        shown = _excerpt(content if isinstance(content, str) else repr(content)) if judge.log_answers else "(BURNISH_LOG_BODIES shows an excerpt)"
        log.warning("RULER: the judge %s gave no valid verdict: %s: %s", judge.name, exc, shown)
        raise _Retry(str(exc)) from None


async def judge_group(client: httpx.AsyncClient, judge: Judge, prompt: Prompt) -> tuple[dict[str, Score], int]:
    """Ask the judge, retrying invalid answers and transient failures. Returns the scores of
    every member (identical trajectories share one) and the number of judge calls made.
    ``RulerFailed`` says what went wrong in our words; the judge's own are only logged."""
    body = {
        "model": judge.model,
        "messages": prompt.messages,
        "temperature": 0,
        "max_tokens": judge.max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "ruler_verdict", "schema": prompt.schema, "strict": True}},
    }
    headers = {"authorization": f"Bearer {judge.api_key}"} if judge.api_key else {}
    url = judge.base_url.rstrip("/") + "/chat/completions"
    calls = 0
    retrying = AsyncRetrying(
        stop=stop_after_attempt(judge.attempts),
        wait=wait_exponential(multiplier=0.2, max=5),
        retry=retry_if_exception_type(_Retry),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                calls += 1
                shown = await _attempt(client, judge, url, body, headers, prompt.shown_ids)
    except _Retry as exc:
        raise RulerFailed(f"no valid verdict from the judge ({judge.name}) in {calls} attempts: {exc}") from None
    scores = {t: shown[members[0]] for members in prompt.classes for t in members}
    return scores, calls
