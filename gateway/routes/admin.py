"""The admin API: create and change policies, control their training, roll back.

Every route needs ``Authorization: Bearer <BURNISH_ADMIN_TOKEN>`` (compared in constant
time); with no token configured the admin API is closed. Errors use the same
OpenAI-style body as ``/v1``.

The API states intent in the store; the trainer acts on it. Pause, resume and settings
take effect at the trainer's next step; train-now and rollback answer 202 and the
policy's status shows them through (``pending_version``, ``train_requested_at``).
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

import msgspec
from litestar import Request, Router, get, patch, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.response import Response

from gateway.errors import APIError
from gateway.keys import check_id
from gateway.policies import LoraSettings, Policy, RulerSettings, TrainSettings
from gateway.services import services
from gateway.store import policies as store

_encode = msgspec.json.Encoder().encode


def require_admin(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    expected = services(connection).settings.admin_token  # type: ignore[arg-type]
    if not expected:
        raise APIError(401, "the admin API is closed: set BURNISH_ADMIN_TOKEN on the gateway", "admin_disabled")
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        error = APIError(401, "missing or wrong admin token (Authorization: Bearer <BURNISH_ADMIN_TOKEN>)", "invalid_admin_token")
        error.headers = {"www-authenticate": "Bearer"}
        raise error


BaseModel = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
ModelPath = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class PolicyIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    base_model: BaseModel
    model_path: ModelPath | None = None
    lora: LoraSettings = LoraSettings()
    train: TrainSettings = TrainSettings()
    ruler: RulerSettings = RulerSettings()
    paused: bool = False


class PolicyPatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields left out stay as they are; ``lora``, ``train`` and ``ruler`` are merged key by key."""

    base_model: BaseModel | msgspec.UnsetType = msgspec.UNSET
    model_path: ModelPath | None | msgspec.UnsetType = msgspec.UNSET
    lora: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    train: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    ruler: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    paused: bool | msgspec.UnsetType = msgspec.UNSET


class RollbackIn(msgspec.Struct, forbid_unknown_fields=True):
    step: Annotated[int, msgspec.Meta(le=2**31 - 1)]


def _decode(body: bytes, kind: type[Any], what: str) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise APIError(400, f"invalid {what}: {exc}", f"invalid_{what}") from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None


def _json(body: Any, status: int = 200) -> Response:
    return Response(content=_encode(body), status_code=status, media_type="application/json")


async def _write(request: Request, fn: Any, *args: Any) -> Any:
    """A write, then the gateway's own routing table re-read at once (others follow within REFRESH_EVERY_S)."""
    svc = services(request)
    result = await svc.db.transaction(fn, *args)
    svc.policies.replace(await svc.db.read(store.load_policies))
    return result


async def _status(request: Request, name: str, status: int = 200) -> Response:
    return _json(await services(request).db.read(store.policy_status, name), status)


@post("/policies", status_code=201)
async def create_policy(request: Request) -> Response:
    data = _decode(await request.body(), PolicyIn, "policy")
    check_id(data.name, "name")
    policy = Policy(
        name=data.name, base_model=data.base_model, model_path=data.model_path, lora=data.lora, train=data.train, ruler=data.ruler, paused=data.paused
    )
    await _write(request, store.create_policy, policy)
    return await _status(request, data.name, 201)


@get("/policies")
async def list_policies(request: Request) -> Response:
    db = services(request).db
    names = [p.name for p in await db.read(store.load_policies)]
    return _json({"object": "list", "data": [await db.read(store.policy_status, name) for name in names]})


@get("/policies/{name:str}")
async def get_policy(request: Request, name: FromPath[str]) -> Response:
    check_id(name, "name")
    return await _status(request, name)


@patch("/policies/{name:str}")
async def change_policy(request: Request, name: FromPath[str]) -> Response:
    check_id(name, "name")
    data = _decode(await request.body(), PolicyPatch, "policy")
    await _write(request, _patch, name, data)
    return await _status(request, name)


def _patch(conn: Any, name: str, data: PolicyPatch) -> Any:
    """Merge inside the write transaction, on the locked row, so two PATCHes of different keys both stand."""
    store.lock_policy(conn, name)
    current = store.get_policy(conn, name)
    values: dict[str, Any] = {k: getattr(data, k) for k in ("base_model", "model_path", "paused") if getattr(data, k) is not msgspec.UNSET}
    for key, kind in (("lora", LoraSettings), ("train", TrainSettings), ("ruler", RulerSettings)):
        if (changes := getattr(data, key)) is not msgspec.UNSET:
            merged = {**msgspec.to_builtins(getattr(current, key)), **changes}
            values[key] = _decode(msgspec.json.encode(merged), kind, key)
    return store.update_policy(conn, name, **values)


def _update(conn: Any, name: str, values: dict[str, Any]) -> Any:
    return store.update_policy(conn, name, **values)


@post("/policies/{name:str}/pause", status_code=200)
async def pause(request: Request, name: FromPath[str]) -> Response:
    """Stop training (the served version stays); a step already running finishes."""
    check_id(name, "name")
    await _write(request, _update, name, {"paused": True})
    return await _status(request, name)


@post("/policies/{name:str}/resume", status_code=200)
async def resume(request: Request, name: FromPath[str]) -> Response:
    check_id(name, "name")
    await _write(request, _update, name, {"paused": False})
    return await _status(request, name)


@post("/policies/{name:str}/train", status_code=202)
async def train_now(request: Request, name: FromPath[str]) -> Response:
    """Train on the groups ready now, even fewer than groups_per_step (409 if none; paused policies too)."""
    check_id(name, "name")
    if (await services(request).db.read(store.get_policy, name)).paused:
        raise APIError(409, f"policy {name!r} is paused; resume it first", "policy_paused")
    await _write(request, store.request_training, name)
    return await _status(request, name, 202)


@get("/policies/{name:str}/checkpoints")
async def checkpoints(request: Request, name: FromPath[str]) -> Response:
    check_id(name, "name")
    steps = await services(request).db.read(store.list_steps, name)
    return _json({"object": "list", "data": [{k: v for k, v in s.items() if k != "metrics"} for s in steps]})


@post("/policies/{name:str}/rollback", status_code=202)
async def rollback(request: Request, name: FromPath[str]) -> Response:
    """Serve (and train on from) an earlier step; 0 is the base model. The trainer loads and switches."""
    check_id(name, "name")
    data = _decode(await request.body(), RollbackIn, "rollback")
    if data.step < 0:
        raise APIError(400, "step is 0 (the base model) or a trained step", "invalid_rollback", "step")
    await _write(request, store.request_rollback, name, data.step)
    return await _status(request, name, 202)


@get("/policies/{name:str}/metrics")
async def metrics(request: Request, name: FromPath[str]) -> Response:
    """One entry per step, oldest first."""
    check_id(name, "name")
    steps = await services(request).db.read(store.list_steps, name)
    return _json({"object": "list", "data": [{"step": s["step"], "created_at": s["created_at"], "published_at": s["published_at"], **s["metrics"]} for s in steps]})


router = Router(
    path="/admin",
    guards=[require_admin],
    route_handlers=[create_policy, list_policies, get_policy, change_policy, pause, resume, train_now, checkpoints, rollback, metrics],
    tags=["admin"],
)
