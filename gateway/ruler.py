"""RULER: an LLM judge scores the trajectories of a group relative to each other.

    members' calls -> conversations (one message list each: core/transcript.py)
                   -> shared prefix shown once, each trajectory's own part after it
                   -> identical trajectories judged once
                   -> one chat call with a JSON schema: a score in [0, 1] and an explanation per id
                   -> checked (every id once, scores in range), retried, then given up with an error

Nothing here touches the store: ``store/ruler.py`` keeps verdicts and rewards,
``gateway/routes/ruler.py`` puts the two together. The judge is any OpenAI-compatible
endpoint; by default the gateway's own upstream.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from burnish_server.core.transcript import Message
from burnish_server.core.verdicts import Score

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
EXPLANATION_MAX_CHARS = 500


class JudgeOutputError(ValueError):
    """The judge answered, but not with a valid verdict."""


class RulerFailed(Exception):
    """No valid verdict after every attempt: a message for the caller and the store."""


@dataclass(frozen=True)
class Judge:
    base_url: str  # OpenAI style, ending in /v1
    model: str
    api_key: str = ""
    attempts: int = 3
    timeout_s: float = 120.0
    max_tokens: int = 2048

    @property
    def name(self) -> str:
        return f"{self.model} at {self.base_url}"


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
    if not content:
        raise JudgeOutputError("the judge returned no content")
    try:
        # strict=False: raw control characters inside strings are let through by some
        # grammar engines (xgrammar did, for the tiny model); they do not change a score.
        verdict = msgspec.convert(json.loads(content, strict=False), dict[str, _Entry])
    except json.JSONDecodeError as exc:
        raise JudgeOutputError(f"the judge's answer is not JSON: {exc}") from None
    except msgspec.ValidationError as exc:
        raise JudgeOutputError(f"the judge's answer is not a verdict: {exc}") from None
    if set(verdict) != set(ids):
        missing, extra = sorted(set(ids) - set(verdict)), sorted(set(verdict) - set(ids))
        raise JudgeOutputError(
            f"the judge scored {len(verdict)} trajectories for {len(ids)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {extra}" if extra else "")
        )
    for t, e in verdict.items():
        if not math.isfinite(e.score) or not 0 <= e.score <= 1:
            raise JudgeOutputError(f"score {e.score} for {t!r} is outside 0..1")
    return {t: Score(float(e.score), e.explanation) for t, e in verdict.items()}


class _RetryableStatus(Exception):
    pass


async def judge_group(client: httpx.AsyncClient, judge: Judge, prompt: Prompt) -> tuple[dict[str, Score], int]:
    """Ask the judge, retrying invalid answers and transient failures. Returns the scores of
    every member (identical trajectories share one) and the number of judge calls made."""
    body = {
        "model": judge.model,
        "messages": prompt.messages,
        "temperature": 0,
        "max_tokens": judge.max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "ruler_verdict", "schema": prompt.schema, "strict": True}},
    }
    headers = {"authorization": f"Bearer {judge.api_key}"} if judge.api_key else {}
    url = judge.base_url.rstrip("/") + "/chat/completions"
    calls, last_error = 0, ""
    retrying = AsyncRetrying(
        stop=stop_after_attempt(judge.attempts),
        wait=wait_exponential(multiplier=0.2, max=5),
        retry=retry_if_exception_type((JudgeOutputError, _RetryableStatus, httpx.TransportError)),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                calls += 1
                r = await client.post(url, json=body, headers=headers, timeout=judge.timeout_s)
                if r.status_code in (408, 429) or r.status_code >= 500:
                    last_error = f"the judge answered {r.status_code}: {r.text[:300]}"
                    raise _RetryableStatus(last_error)
                if r.status_code != 200:
                    raise RulerFailed(f"the judge ({judge.name}) refused the request: {r.status_code} {r.text[:500]}")
                try:
                    content = r.json()["choices"][0]["message"]["content"]
                except (ValueError, KeyError, IndexError, TypeError):
                    raise JudgeOutputError(f"the judge's response is not a chat completion: {r.text[:300]}") from None
                shown = parse_verdict(content, prompt.shown_ids)
    except (JudgeOutputError, _RetryableStatus, httpx.TransportError) as exc:
        raise RulerFailed(f"no valid verdict from the judge ({judge.name}) in {calls} attempts: {exc or last_error}") from None
    except httpx.HTTPError as exc:  # not worth retrying (an invalid URL, a redirect loop)
        raise RulerFailed(f"the judge ({judge.name}) could not be asked: {type(exc).__name__}: {exc}") from None
    scores = {t: shown[members[0]] for members in prompt.classes for t in members}
    return scores, calls
