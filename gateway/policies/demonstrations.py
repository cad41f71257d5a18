"""A teacher's answers to a policy's recorded prompts, recorded as demonstrations (SFT), for
``POST /admin/policies/{name}/teacher-answers`` (``gateway/routes/demonstrations.py``).

The teacher is the model named, else the policy's own (``train.teacher``: its ``model``, else the
policy's base), shown its ``context`` before each prompt, as distillation shows it; the answer is
recorded after the prompt alone, so the policy learns to answer without the context.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec

from burnish_server.core.learning.demonstrations import Demonstration, record
from burnish_server.core.learning.messages import with_context
from burnish_server.core.learning.policies import Policy, served_name
from burnish_server.core.platform.access import DEFAULT_PROJECT, qualify
from burnish_server.core.platform.errors import Invalid
from burnish_server.core.protocols.records import CallRecord
from burnish_server.core.protocols.transcript import exchange
from burnish_server.gateway.services import Services
from burnish_server.store.prompts import recent_prompts
from burnish_server.store.writes import RecordDemonstrations

log = logging.getLogger("burnish.gateway")

TEACHER_AT_ONCE = 8  # prompts in flight to the teacher


@dataclass(frozen=True, slots=True)
class TeacherAnswers:
    records: list[CallRecord]  # the demonstrations recorded, one per answer
    asked: int  # prompts sent to the teacher


async def teacher_demonstrations(svc: Services, policy: Policy, model: str | None, limit: int, max_tokens: int) -> TeacherAnswers:
    """Ask the teacher to answer the policy's ``limit`` newest distinct prompts (held-out ones
    never), greedily, and record each answer as a demonstration; a prompt it gives no answer to
    is logged and left out."""
    teacher = policy.train.teacher
    context: list[dict[str, Any]] = []
    if model is None:
        if teacher is None or not (teacher.context or teacher.model is not None):
            raise Invalid(f"policy {policy.name!r} has no train.teacher (a context or a model): name the model to ask", "invalid_teacher_answers", "model")
        model, context = teacher.model or served_name(policy, 0), [msgspec.to_builtins(turn) for turn in teacher.context]
    prompts = await svc.db.read(recent_prompts, policy.name, limit)
    replica = next((r.url for r in svc.upstream.replicas.order(None, model) if r.healthy), None)
    if replica is None:
        raise Invalid("no upstream replica answers: the teacher cannot be asked", "upstream_unavailable", "model")
    headers = {"authorization": f"Bearer {svc.settings.upstream_api_key}"} if svc.settings.upstream_api_key else {}
    gate = asyncio.Semaphore(TEACHER_AT_ONCE)

    async def answer(call: CallRecord) -> Demonstration | None:
        turn = exchange(call)
        messages = [m.chat() for m in turn.prompt]
        body: dict[str, Any] = {"model": model, "messages": with_context(messages, context), "temperature": 0, "max_tokens": max_tokens}
        if turn.tools:
            body["tools"] = turn.tools
        async with gate:
            try:
                r = await svc.judge_http.post(replica.rstrip("/") + "/v1/chat/completions", json=body, headers=headers, timeout=svc.settings.upstream_timeout)
                said = r.json()["choices"][0]["message"] if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                log.warning("teacher %s gave no answer to a prompt of %s: %s", model, policy.name, exc)
                return None
        if said is None:
            log.warning("teacher %s refused a prompt of %s: %s %s", model, policy.name, r.status_code, r.text[:200])
            return None
        try:
            shown = msgspec.convert({"messages": [*messages, {k: said.get(k) for k in ("role", "content", "tool_calls")}], "tools": turn.tools}, Demonstration)
        except msgspec.ValidationError as exc:
            log.warning("teacher %s answered a prompt of %s in a form no demonstration takes: %s", model, policy.name, exc)
            return None
        return shown if shown.problem() is None else None

    answers = [a for a in await asyncio.gather(*(answer(call) for call in prompts)) if a is not None]
    project = policy.project or DEFAULT_PROJECT
    now = datetime.now(UTC)
    records = [record(d, policy.name, qualify(project, f"demo-{uuid.uuid4().hex}"), now) for d in answers]
    if records:
        await svc.writer.write(RecordDemonstrations(records))
    return TeacherAnswers(records=records, asked=len(prompts))
