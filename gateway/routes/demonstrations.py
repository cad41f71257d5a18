"""``POST /v1/demonstrations``: conversations a policy imitates (core/learning/demonstrations.py); and
``POST /admin/policies/{name}/teacher-answers``: a teacher's answers to the policy's recorded
prompts, recorded as demonstrations (``gateway/policies/demonstrations.py``).

Each demonstration is recorded as one call, in a trajectory and group of its own, closed at
once; the ids come back so that each can be read (``GET /v1/trajectories/{id}``) or exported
like any trajectory. They train a policy whose ``train.objective`` gives ``sft`` a weight, a
step taking ``groups_per_step`` of them as it takes groups.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Annotated

import msgspec
from litestar import Router, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from burnish_server.core.learning.demonstrations import MAX_DEMONSTRATIONS, DemonstrationsIn, record
from burnish_server.core.platform.access import PRINTABLE, Principal, local
from burnish_server.core.platform.errors import Invalid, NotFound
from burnish_server.gateway.access.admission import ACCESS_ERRORS, BEARER
from burnish_server.gateway.edge.errors import responses
from burnish_server.gateway.policies.demonstrations import teacher_demonstrations
from burnish_server.gateway.routes.common import PolicyName
from burnish_server.gateway.services import Services
from burnish_server.store.writes import RecordDemonstrations

log = logging.getLogger("burnish.gateway")


class DemonstrationsOut(msgspec.Struct):
    policy: str
    ids: list[str]  # one trajectory (and group) per demonstration, in the order posted
    trains: bool  # the policy's objective has sft now: they wait for its next steps


@post(
    "/v1/demonstrations",
    status_code=201,
    opt={"invalid": "invalid_demonstration", "scope": "call"},
    responses=responses(400, *ACCESS_ERRORS, 404, 409, 413),
    security=BEARER,
)
async def post_demonstrations(data: JSONBody[DemonstrationsIn], svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> DemonstrationsOut:
    """Conversations for a policy to imitate: each one's assistant turns, tool calls included,
    are trained by supervised fine-tuning (at most 1,000 a request)."""
    policy = svc.policies.policies.get(data.policy)
    if policy is None or not svc.policies.open_to(policy, caller):
        raise NotFound(f"no policy {data.policy!r}", "policy_not_found", "policy")
    for i, demonstration in enumerate(data.data):
        if (problem := demonstration.problem()) is not None:
            raise Invalid(f"data[{i}]: {problem}", "invalid_demonstration", f"data[{i}]")
    now = datetime.now(UTC)
    records = [record(d, policy.name, caller.stored(f"demo-{uuid.uuid4().hex}"), now) for d in data.data]
    await svc.writer.write(RecordDemonstrations(records))
    return DemonstrationsOut(policy=policy.name, ids=[local(r.trajectory_id) for r in records], trains=policy.train.weights.sft > 0)


router = Router(path="/", route_handlers=[post_demonstrations])


class TeacherAnswersIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Ask ``model`` (any model the gateway's upstream serves) to answer the policy's ``limit``
    newest distinct prompts, and record each answer as a demonstration. ``model`` omitted: the
    policy's own teacher (``train.teacher``: its ``model``, else the policy's base), shown its
    ``context`` before each prompt, as distillation shows it; the answer is recorded after
    the prompt alone, so the policy learns to answer without the context."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=PRINTABLE)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_DEMONSTRATIONS)] = 100
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=32_768)] = 512


class TeacherAnswersOut(DemonstrationsOut):
    asked: int  # prompts sent to the teacher
    failed: int  # of which it gave no answer (each logged): not recorded


@post("/policies/{name:str}/teacher-answers", status_code=201, opt={"invalid": "invalid_teacher_answers"}, responses=responses(400, *ACCESS_ERRORS, 404, 413))
async def teacher_answers(name: PolicyName, data: JSONBody[TeacherAnswersIn], svc: NamedDependency[Services]) -> TeacherAnswersOut:
    """A teacher's answers to the policy's recorded prompts, as demonstrations (SFT): the
    prompts of its newest calls (held-out ones never), answered greedily by ``model``."""
    policy = svc.policies.policies.get(name)
    if policy is None:
        raise NotFound(f"no policy {name!r}", "policy_not_found", "name")
    answers = await teacher_demonstrations(svc, policy, data.model, data.limit, data.max_tokens)
    ids = [local(r.trajectory_id) for r in answers.records]
    return TeacherAnswersOut(policy=policy.name, ids=ids, trains=policy.train.weights.sft > 0, asked=answers.asked, failed=answers.asked - len(answers.records))


admin_handlers = [teacher_answers]
