"""Trajectories and groups: rewards, closing, reading back, exporting.

Writes go through the store writer (the same queue and commit as the calls);
reads use the reader pool and see every call whose response has ended, since a
response ends only after its record is committed.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
from litestar import Request, get, post
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Response, Stream

from gateway.errors import APIError
from gateway.keys import check_id
from gateway.langfuse_export import Score
from gateway.services import services
from gateway.store import reads
from gateway.store.writes import CloseGroup, PostReward

_encode = msgspec.json.Encoder().encode
MAX_COMPONENTS = 64


class RewardIn(msgspec.Struct, forbid_unknown_fields=True):
    reward: float
    components: dict[str, float] = {}


_decode_reward = msgspec.json.Decoder(RewardIn).decode


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(content=_encode(body), status_code=status, media_type="application/json")


async def _read_reward(request: Request) -> RewardIn:
    body = await request.body()
    try:
        data = _decode_reward(body)
    except msgspec.ValidationError as exc:
        raise APIError(400, f"invalid reward: {exc}", "invalid_reward", "reward") from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not math.isfinite(data.reward):
        raise APIError(400, "reward must be a finite number", "invalid_reward", "reward")
    if len(data.components) > MAX_COMPONENTS:
        raise APIError(400, f"at most {MAX_COMPONENTS} reward components", "invalid_reward", "components")
    for name, value in data.components.items():
        if not name or len(name) > 64:
            raise APIError(400, "component names are 1 to 64 characters", "invalid_reward", "components")
        if not math.isfinite(value):
            raise APIError(400, f"component {name!r} must be a finite number", "invalid_reward", "components")
    return data


async def _read(request: Request, read: Callable[..., Awaitable[dict[str, Any] | None]], key: str, kind: str) -> dict[str, Any]:
    """One trajectory or group from the reader pool, or a 404 in the API's format."""
    async with services(request).db.reader.connect() as conn:
        out = await read(conn, key)
    if out is None:
        raise APIError(404, f"no {kind} {key!r}", f"{kind}_not_found", f"{kind}_id")
    return out


@post("/v1/trajectories/{trajectory_id:str}/reward", status_code=200)
async def post_reward(request: Request, trajectory_id: FromPath[str]) -> Response:
    """Set a trajectory's reward. Every reward is kept; the latest is the trajectory's."""
    check_id(trajectory_id, "trajectory_id")
    data = await _read_reward(request)
    svc = services(request)
    result = await svc.writer.write(PostReward(trajectory_id, data.reward, dict(data.components)))
    if svc.langfuse is not None:
        svc.langfuse.put(Score(trajectory_id, "reward", data.reward, metadata={"source": "user", "components": dict(data.components)}))
    out = await _read(request, reads.get_trajectory, trajectory_id, "trajectory")
    out.pop("calls")
    out["group_closed"] = result["group_closed"]
    return _json(out)


@post("/v1/groups/{group_id:str}/close", status_code=200)
async def close_group(request: Request, group_id: FromPath[str]) -> Response:
    """Close a group: it takes no more rewards and is ready for training."""
    check_id(group_id, "group_id")
    await services(request).writer.write(CloseGroup(group_id))
    return _json(await _read(request, reads.get_group, group_id, "group"))


@get("/v1/trajectories/{trajectory_id:str}")
async def get_trajectory(request: Request, trajectory_id: FromPath[str]) -> Response:
    check_id(trajectory_id, "trajectory_id")
    return _json(await _read(request, reads.get_trajectory, trajectory_id, "trajectory"))


@get("/v1/groups/{group_id:str}")
async def get_group(request: Request, group_id: FromPath[str]) -> Response:
    check_id(group_id, "group_id")
    return _json(await _read(request, reads.get_group, group_id, "group"))


def _filters(group_id: str | None, rewarded: bool | None, created_after: float | None, created_before: float | None) -> reads.Filters:
    if group_id is not None:
        check_id(group_id, "group_id")

    def when(value: float | None, name: str) -> datetime | None:
        if value is None:
            return None
        if not math.isfinite(value) or not 0 <= value < 1e11:
            raise APIError(400, f"{name} is a Unix time in seconds", "invalid_request", name)
        return datetime.fromtimestamp(value, UTC)

    return reads.Filters(group_id, rewarded, when(created_after, "created_after"), when(created_before, "created_before"))


@get("/v1/trajectories")
async def list_trajectories(
    request: Request,
    group_id: FromQuery[str | None] = None,
    rewarded: FromQuery[bool | None] = None,
    created_after: FromQuery[float | None] = None,
    created_before: FromQuery[float | None] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=1000)] = 100,
    after: FromQuery[str | None] = None,
    order: Annotated[str, QueryParameter(pattern="^(asc|desc)$")] = "desc",
) -> Response:
    """A page of trajectories, newest first by default; pass ``after=<last_id>`` for the next."""
    filters = _filters(group_id, rewarded, created_after, created_before)
    if after is not None:
        check_id(after, "after")
    async with services(request).db.reader.connect() as conn:
        out = await reads.list_trajectories(conn, filters, limit=limit, after=after, order=order)
    if out is None:
        raise APIError(404, f"no trajectory {after!r} to page after", "trajectory_not_found", "after")
    return _json(out)


@get("/v1/trajectories/export")
async def export_trajectories(
    request: Request,
    group_id: FromQuery[str | None] = None,
    rewarded: FromQuery[bool | None] = None,
    created_after: FromQuery[float | None] = None,
    created_before: FromQuery[float | None] = None,
) -> Stream:
    """Every matching trajectory with its calls, one JSON line each, streamed."""
    filters = _filters(group_id, rewarded, created_after, created_before)
    engine = services(request).db.reader
    return Stream(
        reads.export_jsonl(engine, filters),
        media_type="application/x-ndjson",
        headers={"content-disposition": 'attachment; filename="trajectories.jsonl"'},
    )


route_handlers = [post_reward, close_group, export_trajectories, get_trajectory, get_group, list_trajectories]
