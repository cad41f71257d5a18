"""Trajectories and groups: rewards, closing, reading back, exporting.

Writes go through the store writer (the same queue and commit as the calls);
reads use the reader pool and see every call whose response has ended, since a
response ends only after its record is committed. Bodies are typed (``RewardIn``) and
decoded by Litestar; ids are checked against their pattern before a handler runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, TypeVar

import msgspec
from litestar import Router, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream
from sqlalchemy.engine import Connection

from burnish_server.core.api.listing import Filters, Keyset
from burnish_server.core.api.views import GroupView, TrajectoryPage, TrajectoryView
from burnish_server.core.platform.access import Principal, local
from burnish_server.core.platform.errors import NotFound
from burnish_server.gateway.access.admission import ACCESS_ERRORS, BEARER
from burnish_server.gateway.edge import listing
from burnish_server.gateway.edge.errors import responses
from burnish_server.gateway.routes.common import CallIndex, GroupId, TrajectoryId
from burnish_server.gateway.services import Services
from burnish_server.store import reads
from burnish_server.store.writes import CloseGroup, PostCallReward, PostReward
from burnish_server.telemetry.langfuse_export import Score

MAX_COMPONENTS = 64
V = TypeVar("V")
ComponentName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class RewardIn(msgspec.Struct, forbid_unknown_fields=True):
    """A reward for a trajectory: a finite number, and optionally named parts of it."""

    reward: float
    components: Annotated[dict[ComponentName, float], msgspec.Meta(max_length=MAX_COMPONENTS)] = {}

    def __post_init__(self) -> None:
        # JSON has no NaN or infinity, but 1e999 decodes to one.
        if not math.isfinite(self.reward):
            raise ValueError("reward must be a finite number")
        for name, value in self.components.items():
            if not math.isfinite(value):
                raise ValueError(f"component {name!r} must be a finite number")


async def _read(svc: Services, read: Callable[[Connection, str], V | None], key: str, kind: str) -> V:
    """One trajectory or group (by its stored id) from the reader pool, or NotFound."""
    out = await svc.db.read(read, key)
    if out is None:  # another project's is not found either: its ids are stored apart
        raise NotFound(f"no {kind} {local(key)!r}", f"{kind}_not_found", f"{kind}_id")
    return out


@post(
    "/v1/trajectories/{trajectory_id:str}/reward",
    status_code=200,
    opt={"invalid": "invalid_reward", "scope": "call"},
    responses=responses(400, *ACCESS_ERRORS, 404, 409, 413),
    security=BEARER,
)
async def post_reward(
    trajectory_id: TrajectoryId, data: JSONBody[RewardIn], svc: NamedDependency[Services], caller: NamedDependency[Principal]
) -> TrajectoryView:
    """Set a trajectory's reward. Every reward is kept; the latest is the trajectory's. A lone
    attempt's reward that came after it expired is kept too, and answered ``expired: true``: it
    is never trained on."""
    stored = caller.stored(trajectory_id)
    result = await svc.writer.write(PostReward(stored, data.reward, dict(data.components)))
    if svc.langfuse is not None:
        svc.langfuse.put(Score(stored, "reward", data.reward, metadata={"source": "user", "components": dict(data.components)}))
    out = await _read(svc, reads.get_trajectory, stored, "trajectory")
    return msgspec.structs.replace(out, calls=msgspec.UNSET, group_closed=result["group_closed"], expired=result["expired"])


@post(
    "/v1/trajectories/{trajectory_id:str}/calls/{index:int}/reward",
    status_code=200,
    opt={"invalid": "invalid_reward", "scope": "call"},
    responses=responses(400, *ACCESS_ERRORS, 404, 409, 413),
    security=BEARER,
)
async def post_call_reward(
    trajectory_id: TrajectoryId, index: CallIndex, data: JSONBody[RewardIn], svc: NamedDependency[Services], caller: NamedDependency[Principal]
) -> TrajectoryView:
    """Reward one call of a trajectory (credit per turn): ``index`` counts its calls in order
    from 0, as this trajectory's ``calls`` lists them; -1 is the last. Every reward is kept;
    the newest is the call's. The trajectory's own reward still decides when its group closes."""
    stored = caller.stored(trajectory_id)
    await svc.writer.write(PostCallReward(stored, index, data.reward, dict(data.components)))
    if svc.langfuse is not None:
        svc.langfuse.put(Score(stored, f"call_reward[{index}]", data.reward, metadata={"source": "user", "call": index, "components": dict(data.components)}))
    return await _read(svc, reads.get_trajectory, stored, "trajectory")


@post("/v1/groups/{group_id:str}/close", status_code=200, opt={"scope": "call"}, responses=responses(400, *ACCESS_ERRORS, 404), security=BEARER)
async def close_group(group_id: GroupId, svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> GroupView:
    """Close a group: it takes no more rewards and is ready for training."""
    await svc.writer.write(CloseGroup(caller.stored(group_id)))
    return await _read(svc, reads.get_group, caller.stored(group_id), "group")


@get("/v1/trajectories/{trajectory_id:str}", opt={"scope": "call|read"}, responses=responses(400, *ACCESS_ERRORS, 404), security=BEARER)
async def get_trajectory(trajectory_id: TrajectoryId, svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> TrajectoryView:
    """A trajectory: its calls in order (request, response, tokens), its rewards."""
    return await _read(svc, reads.get_trajectory, caller.stored(trajectory_id), "trajectory")


@get("/v1/groups/{group_id:str}", opt={"scope": "call|read"}, responses=responses(400, *ACCESS_ERRORS, 404), security=BEARER)
async def get_group(group_id: GroupId, svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> GroupView:
    """A group: its state and its members."""
    return await _read(svc, reads.get_group, caller.stored(group_id), "group")


@get(
    "/v1/trajectories",
    opt={"scope": "read", listing.OPT: listing.API},
    dependencies=listing.LIST_DEPENDENCIES,
    responses=responses(400, *ACCESS_ERRORS, 404),
    security=BEARER,
)
async def list_trajectories(svc: NamedDependency[Services], filters: NamedDependency[Filters], keyset: NamedDependency[Keyset]) -> TrajectoryPage:
    """A page of trajectories, newest first by default; pass ``after=<last_id>`` for the next.
    ``eval=true`` lists only the held-out trajectories, ``eval=false`` only the others. The
    dashboard's list of trajectories is this one (``gateway/edge/listing.py``, ``store/listing.py``)."""
    out = await svc.db.read(reads.list_trajectories, filters, keyset)
    if out is None:
        raise NotFound(f"no trajectory {local(keyset.after or '')!r} to page after", "trajectory_not_found", "after")
    return out


@get(
    "/v1/trajectories/export",
    opt={"scope": "read", listing.OPT: listing.API},
    dependencies=listing.LIST_DEPENDENCIES,
    media_type="application/x-ndjson",
    response_description="Newline-delimited JSON: one TrajectoryView (with its calls) per line",
    responses=responses(400, *ACCESS_ERRORS),
    security=BEARER,
)
async def export_trajectories(svc: NamedDependency[Services], filters: NamedDependency[Filters]) -> Stream:
    """Every matching trajectory with its calls, one JSON line each, oldest first, streamed."""
    return Stream(
        reads.export_jsonl(svc.db.reader, filters),
        media_type="application/x-ndjson",
        headers={"content-disposition": 'attachment; filename="trajectories.jsonl"'},
    )


router = Router(path="/", route_handlers=[post_reward, post_call_reward, close_group, export_trajectories, get_trajectory, get_group, list_trajectories])
