"""The admin API: create and change policies, control their training, roll back; API keys; dashboard sessions.

Every route needs ``Authorization: Bearer <BURNISH_ADMIN_TOKEN>`` (compared in constant
time) or a key with the ``admin`` scope (``gateway/access/admission.py``); with neither configured the
admin API is closed. Errors use the same OpenAI-style body as ``/v1``.

The API states intent in the store; the trainer acts on it. Pause, resume and settings
take effect at the trainer's next step; train-now and rollback answer 202 and the
policy's status shows them through (``pending_version``, ``train_requested_at``).
"""

from __future__ import annotations

import functools
from typing import Annotated

import msgspec
from litestar import Controller, Router, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import JSONBody, Parameter
from litestar.response import Stream

from burnish_server.core.api.views import (
    EvalList,
    KeyList,
    KeyView,
    MetricsList,
    NewKeyView,
    PolicyList,
    PolicyView,
    SessionList,
    SessionView,
    StepFigures,
    StepList,
)
from burnish_server.core.learning.policies import LoraSettings, Policy, PromotionSettings, RulerSettings, ServingSettings, TrainSettings
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.platform.access import SCOPES, KeyName, Limits, ProjectName, Scope
from burnish_server.core.platform.ids import ID_REGEX
from burnish_server.gateway.access.admission import ACCESS_ERRORS as ACCESS
from burnish_server.gateway.access.admission import BEARER
from burnish_server.gateway.edge.errors import responses
from burnish_server.gateway.policies import actions, downloads
from burnish_server.gateway.policies.changes import BaseModel, ModelPath, PolicyPatch, patched, refuse_conflicts
from burnish_server.gateway.policies.teachers import check_teacher
from burnish_server.gateway.routes import demonstrations
from burnish_server.gateway.routes.common import PolicyName, SessionId
from burnish_server.gateway.services import Services
from burnish_server.store import controls
from burnish_server.store import keys as key_store
from burnish_server.store import policies as store

Name = Annotated[str, msgspec.Meta(pattern=ID_REGEX, description="1 to 128 characters from A-Z a-z 0-9 _ - . :")]


class PolicyIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name
    base_model: BaseModel
    model_path: ModelPath | None = None
    lora: LoraSettings = LoraSettings()
    train: TrainSettings = TrainSettings()
    ruler: RulerSettings = RulerSettings()
    promotion: PromotionSettings = PromotionSettings()
    serving: ServingSettings = ServingSettings()
    # The project it belongs to (its keys alone call it, its groups alone train it), and the
    # other projects it is shared with; none: shared by every project.
    project: ProjectName | None = None
    shared_with: Annotated[list[ProjectName], msgspec.Meta(max_length=1000)] = []
    paused: bool = False


class RollbackIn(msgspec.Struct, forbid_unknown_fields=True):
    # 0 is the base model; any other is a trained step.
    step: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


async def _status(svc: Services, name: str) -> PolicyView:
    return await svc.db.read(store.policy_status, name)


class KeyIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A new API key: its project, its scopes, and optionally an expiry and limits."""

    name: KeyName
    project: ProjectName = "default"
    scopes: Annotated[list[Scope], msgspec.Meta(min_length=1, max_length=len(SCOPES))] = msgspec.field(default_factory=lambda: ["call"])
    # Seconds from now until the key stops working; none: never.
    expires_in: Annotated[float, msgspec.Meta(gt=0, le=100 * 365 * 86400)] | None = None
    rpm_limit: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    max_parallel_requests: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None


KeyId = Annotated[str, Parameter(pattern=r"^key_[0-9a-f]{16}$(?!\n)", description="an API key's id: key_ and 16 hex digits")]


class PoliciesController(Controller):
    """A policy and its versions: settings, training control, checkpoints, history."""

    path = "/policies"

    @post("/", status_code=201, opt={"invalid": "invalid_policy"}, responses=responses(400, *ACCESS, 409, 413))
    async def create_policy(self, data: JSONBody[PolicyIn], svc: NamedDependency[Services]) -> PolicyView:
        """Create a policy: a trainable model over a base model, with LoRA, training and RULER settings."""
        policy = Policy(
            name=data.name,
            base_model=data.base_model,
            model_path=data.model_path,
            lora=data.lora,
            train=data.train,
            ruler=data.ruler,
            promotion=data.promotion,
            serving=data.serving,
            project=data.project,
            shared_with=tuple(dict.fromkeys(data.shared_with)),
            paused=data.paused,
        )
        refuse_conflicts(policy, svc.settings.max_lora_rank)
        await check_teacher(svc.upstream, policy)
        await actions.write(svc, store.create_policy, policy)
        return await _status(svc, data.name)

    @get("/", responses=responses(*ACCESS))
    async def list_policies(self, svc: NamedDependency[Services]) -> PolicyList:
        names = [p.name for p in await svc.db.read(store.load_policies)]
        return PolicyList(data=[await svc.db.read(store.policy_status, name) for name in names])

    @get("/{name:str}", responses=responses(400, *ACCESS, 404))
    async def get_policy(self, name: PolicyName, svc: NamedDependency[Services]) -> PolicyView:
        """A policy's settings and where it stands: served and pending version, groups by state, last step."""
        return await _status(svc, name)

    @patch("/{name:str}", opt={"invalid": "invalid_policy"}, responses=responses(400, *ACCESS, 404, 409, 413))
    async def change_policy(self, name: PolicyName, data: JSONBody[PolicyPatch], svc: NamedDependency[Services]) -> PolicyView:
        if (data.train is not msgspec.UNSET and "teacher" in data.train) or data.base_model is not msgspec.UNSET:
            # A served teacher's tokenizer is checked against vLLM before the write (the check is
            # asked over HTTP; the write's own merge runs in the store's transaction).
            current = await svc.db.read(store.get_policy, name)
            changed = patched(current, data, svc.settings.max_lora_rank)
            await check_teacher(svc.upstream, msgspec.structs.replace(current, **{k: v for k, v in changed.items() if k in ("train", "base_model")}))
        await actions.write(svc, controls.change_policy, name, functools.partial(patched, data=data, max_lora_rank=svc.settings.max_lora_rank))
        return await _status(svc, name)

    @post("/{name:str}/pause", status_code=200, responses=responses(400, *ACCESS, 404))
    async def pause(self, name: PolicyName, svc: NamedDependency[Services]) -> PolicyView:
        """Stop training (the served version stays); a step already running finishes."""
        await actions.pause(svc, name)
        return await _status(svc, name)

    @post("/{name:str}/resume", status_code=200, responses=responses(400, *ACCESS, 404))
    async def resume(self, name: PolicyName, svc: NamedDependency[Services]) -> PolicyView:
        await actions.resume(svc, name)
        return await _status(svc, name)

    @post("/{name:str}/train", status_code=202, responses=responses(400, *ACCESS, 404, 409))
    async def train_now(self, name: PolicyName, svc: NamedDependency[Services]) -> PolicyView:
        """Train on the groups ready now, even fewer than groups_per_step (409 if none; paused policies too)."""
        await actions.train_now(svc, name)
        return await _status(svc, name)

    @get("/{name:str}/checkpoints", responses=responses(400, *ACCESS, 404))
    async def checkpoints(self, name: PolicyName, svc: NamedDependency[Services]) -> StepList:
        steps = await svc.db.read(store.list_steps, name)
        return StepList(data=[msgspec.structs.replace(s, metrics=msgspec.UNSET) for s in steps])

    @get(
        "/{name:str}/checkpoints/{step:int}/adapter",
        responses=responses(400, *ACCESS, 404),
        media_type="application/zip",
    )
    async def download_adapter(self, name: PolicyName, step: Annotated[int, Parameter(ge=1, le=2**31 - 1)], svc: NamedDependency[Services]) -> Stream:
        """The step's LoRA adapter as a zip: peft's adapter_config.json (pointed at the policy's base)
        and adapter_model.safetensors. Merged weights and GGUF files: `burnish export`."""
        return await downloads.adapter_zip(svc, name, step)

    @post("/{name:str}/rollback", status_code=202, opt={"invalid": "invalid_rollback"}, responses=responses(400, *ACCESS, 404, 413))
    async def rollback(self, name: PolicyName, data: JSONBody[RollbackIn], svc: NamedDependency[Services]) -> PolicyView:
        """Serve (and train on from) an earlier step; 0 is the base model. The trainer loads and switches."""
        await actions.rollback(svc, name, data.step)
        return await _status(svc, name)

    @post("/{name:str}/promote", status_code=200, responses=responses(400, *ACCESS, 404, 409))
    async def promote(self, name: PolicyName, svc: NamedDependency[Services]) -> PolicyView:
        """Serve the candidate on trial to every trajectory now, whatever its evidence (409 if none)."""
        await actions.promote(svc, name)
        return await _status(svc, name)

    @post("/{name:str}/reject", status_code=200, responses=responses(400, *ACCESS, 404, 409))
    async def reject(self, name: PolicyName, svc: NamedDependency[Services]) -> PolicyView:
        """End the candidate's trial: the served version keeps serving (409 if there is no candidate)."""
        await actions.reject(svc, name)
        return await _status(svc, name)

    @get("/{name:str}/metrics", responses=responses(400, *ACCESS, 404))
    async def metrics(self, name: PolicyName, svc: NamedDependency[Services]) -> MetricsList:
        """One entry per step, oldest first, with the held-out score of that version (null where none)."""
        steps, scores = await svc.db.read(controls.history, name)
        data = []
        for s in steps:
            score = scores.get(s.step)
            figures = msgspec.structs.asdict(s.metrics) if isinstance(s.metrics, StepMetrics) else {}
            data.append(
                StepFigures(
                    step=s.step,
                    created_at=s.created_at,
                    published_at=s.published_at,
                    eval_score=score.score if score else None,
                    eval_trajectories=score.trajectories if score else None,
                    decision=s.decision,
                    decided_at=s.decided_at,
                    decisions=s.decisions,
                    **figures,
                )
            )
        return MetricsList(data=data)

    @get("/{name:str}/evals", responses=responses(400, *ACCESS, 404))
    async def eval_scores(self, name: PolicyName, svc: NamedDependency[Services]) -> EvalList:
        """Every version, oldest first (the base, step 0, included), with its held-out score: the mean
        reward of the rewarded eval trajectories it answered (null where none)."""
        return await svc.db.read(controls.eval_list, name)


class KeysController(Controller):
    """API keys: made (the secret shown once), listed, read, revoked."""

    path = "/keys"

    @post("/", status_code=201, opt={"invalid": "invalid_key"}, responses=responses(400, *ACCESS, 413))
    async def create_key(self, data: JSONBody[KeyIn], svc: NamedDependency[Services]) -> NewKeyView:
        """Make an API key. Its secret is in this answer and nowhere else, ever: the store keeps its hash."""
        limits = Limits(rpm_limit=data.rpm_limit, max_parallel_requests=data.max_parallel_requests)
        make = functools.partial(
            key_store.create_key, name=data.name, project=data.project, scopes=list(data.scopes), limits=limits, expires_in_s=data.expires_in
        )
        made = await svc.db.transaction(make)
        svc.access.ring.replace(await svc.db.read(key_store.load_keys))  # this gateway closes at once; others within a second
        return made

    @get("/", responses=responses(*ACCESS))
    async def list_keys(self, svc: NamedDependency[Services]) -> KeyList:
        """Every key, revoked and expired ones included, oldest first (never a secret nor its hash)."""
        return KeyList(data=[key_store.key_view(k) for k in await svc.db.read(key_store.load_keys)])

    @get("/{key_id:str}", responses=responses(400, *ACCESS, 404))
    async def get_key(self, key_id: KeyId, svc: NamedDependency[Services]) -> KeyView:
        return key_store.key_view(await svc.db.read(key_store.get_key, key_id))

    @delete("/{key_id:str}", status_code=200, responses=responses(400, *ACCESS, 404))
    async def revoke_key(self, key_id: KeyId, svc: NamedDependency[Services]) -> KeyView:
        """Revoke a key: refused by this gateway at once, by every other within a second. The row stays."""
        key = await svc.db.transaction(key_store.revoke_key, key_id)
        svc.access.ring.replace(await svc.db.read(key_store.load_keys))
        return key_store.key_view(key)


class SessionsController(Controller):
    """The dashboard's sign-ins: listed, ended."""

    path = "/sessions"

    @get("/", responses=responses(*ACCESS))
    async def list_sessions(self, svc: NamedDependency[Services]) -> SessionList:
        """Every dashboard sign-in not past its lifetime, oldest first, with its status (never its secret nor the secret's hash)."""
        return SessionList(data=await svc.access.sessions.listing())

    @delete("/{session_id:str}", status_code=200, responses=responses(400, *ACCESS, 404))
    async def end_session(self, session_id: SessionId, svc: NamedDependency[Services]) -> SessionView:
        """End a dashboard session: every gateway refuses its cookie from its next request. The answer says `status: ended`."""
        return await svc.access.sessions.end_by_id(session_id)


router = Router(
    path="/admin",
    opt={"scope": "admin"},
    security=BEARER,
    route_handlers=[PoliciesController, *demonstrations.admin_handlers, KeysController, SessionsController],
    tags=["admin"],
)
