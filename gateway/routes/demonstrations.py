"""``POST /v1/demonstrations``: conversations a policy imitates (core/demonstrations.py).

Each demonstration is recorded as one call, in a trajectory and group of its own, closed at
once; the ids come back so that each can be read (``GET /v1/trajectories/{id}``) or exported
like any trajectory. They train a policy whose ``train.objective`` gives ``sft`` a weight, a
step taking ``groups_per_step`` of them as it takes groups.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec
from litestar import post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from burnish_server.core.access import Principal, local
from burnish_server.core.demonstrations import DemonstrationsIn, record
from burnish_server.core.errors import Invalid, NotFound
from burnish_server.gateway.access import ACCESS_ERRORS, BEARER
from burnish_server.gateway.errors import responses
from burnish_server.gateway.services import Services
from burnish_server.store.writes import RecordDemonstrations


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


route_handlers = [post_demonstrations]
