"""POST /v1/groups/{id}/ruler, and the background task that runs RULER for policies that ask.

Which judge: the request's ``judge_model`` / ``judge_base_url`` / ``judge_api_key``, else
the group's policy's RULER settings, else the gateway's (``BURNISH_JUDGE_*``), else the
gateway's own upstream and, for the model, the policy's base model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated, Literal

import httpx
import msgspec
from litestar import post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from burnish_server.core.errors import BurnishError, Invalid, Unavailable
from burnish_server.core.policies import RulerSettings
from burnish_server.core.transcript import conversation
from burnish_server.core.views import JudgeView, RulerView, ScoreView
from burnish_server.gateway.errors import responses
from burnish_server.gateway.routes.common import GroupId
from burnish_server.gateway.ruler import Judge, RulerFailed, build_prompt, cache_key, judge_group
from burnish_server.gateway.services import Services
from burnish_server.gateway.upstream import base_url
from burnish_server.store import ruler as store
from burnish_server.telemetry.langfuse_export import Score

log = logging.getLogger("burnish.ruler")
AUTO_EVERY_S = 1.0


class RulerIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every field is optional: the policy's RULER settings, then the gateway's, fill the rest."""

    rubric: Annotated[str, msgspec.Meta(max_length=20_000)] | None = None
    judge_model: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    judge_base_url: Annotated[str, msgspec.Meta(min_length=1, max_length=700)] | None = None
    judge_api_key: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    combine: Literal["set", "add"] | None = None


def _judge(svc: Services, policy: RulerSettings, request: RulerIn, base_model: str | None) -> Judge:
    s = svc.settings
    model = request.judge_model or policy.judge_model or s.judge_model or base_model
    if not model:
        raise Invalid("no judge model: pass judge_model, or set the policy's ruler.judge_model or BURNISH_JUDGE_MODEL", "no_judge_model", "judge_model")
    upstream = base_url(s.upstream) + "/v1"
    url = (request.judge_base_url or policy.judge_base_url or s.judge_base_url or upstream).rstrip("/")
    # A configured key goes only to the server it was configured for: a request naming
    # another judge URL must not receive it (the ruler route is open to agents).
    if request.judge_api_key:
        api_key = request.judge_api_key
    elif s.judge_api_key and url == s.judge_base_url.rstrip("/"):
        api_key = s.judge_api_key
    elif url == upstream:
        api_key = s.upstream_api_key
    else:
        api_key = ""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise Invalid(f"judge_base_url {url[:200]!r} is not an http(s) URL", "invalid_request", "judge_base_url")
    if len(model) > 256 or len(url) > 700:
        raise Invalid("judge_model is at most 256 characters and judge_base_url at most 700", "invalid_request", "judge_model")
    return Judge(base_url=url, model=model, api_key=api_key, attempts=s.judge_attempts, timeout_s=s.upstream_timeout, max_tokens=s.judge_max_tokens)


async def run_ruler(svc: Services, group_id: str, request: RulerIn) -> RulerView:
    """Judge a group (or reuse a cached verdict) and store its rewards."""
    group = await svc.db.read(store.group_for_judge, group_id)
    policy = svc.policies.policies.get(group.policy) if group.policy else None
    settings = policy.ruler if policy is not None else RulerSettings()
    judge = _judge(svc, settings, request, policy.base_model if policy is not None else None)
    rubric = request.rubric or settings.rubric
    combine = request.combine or settings.combine
    prompt = build_prompt({m.trajectory_id: conversation(m.calls) for m in group.members}, rubric)
    key = cache_key(judge, prompt)
    verdict, calls = await svc.db.read(store.cached_verdict, key), 0
    if verdict is None:
        try:
            shown, calls = await judge_group(svc.judge_http, judge, prompt)
        except RulerFailed as exc:
            await svc.db.transaction(store.store_error, group_id, str(exc))
            raise Unavailable(str(exc), "ruler_failed", "group_id") from None
        verdict = shown
    else:  # the cache holds the shown ids' scores; identical members share them
        verdict = {t: verdict[members[0]] for members in prompt.classes for t in members}
    rewards = await svc.db.transaction(store.store_verdict, group_id, key, judge.name, verdict, combine)
    if svc.langfuse is not None:
        for t, reward in rewards.items():
            svc.langfuse.put(Score(t, "ruler", verdict[t].score, comment=verdict[t].explanation, metadata={"judge": judge.name, "group_id": group_id}))
            svc.langfuse.put(Score(t, "reward", reward, metadata={"source": "ruler", "combine": combine}))
    return RulerView(
        group_id=group_id,
        judge=JudgeView(model=judge.model, base_url=judge.base_url),
        combine=combine,
        cached=calls == 0,
        judge_calls=calls,
        distinct_trajectories=len(prompt.classes),
        scores=[ScoreView(trajectory_id=t, score=verdict[t].score, explanation=verdict[t].explanation, reward=rewards[t]) for t in rewards],
    )


@post("/v1/groups/{group_id:str}/ruler", status_code=200, opt={"invalid": "invalid_request"}, responses=responses(400, 404, 409, 502))
async def ruler(group_id: GroupId, svc: NamedDependency[Services], data: JSONBody[RulerIn | None] = None) -> RulerView:
    """Score a group's trajectories relative to each other with an LLM judge; the scores become rewards."""
    return await run_ruler(svc, group_id, data or RulerIn())


async def auto_ruler(svc: Services, every_s: float = AUTO_EVERY_S) -> None:
    """Until cancelled: judge the closed groups of policies whose RULER settings say auto."""
    while True:
        await asyncio.sleep(every_s)
        if not any(p.ruler.auto for p in svc.policies.policies.values()):
            continue  # no write transaction each second for nothing
        try:
            claimed = await svc.db.transaction(store.claim_auto)
        except Exception as exc:  # the store away for a moment: try again next time
            log.warning("automatic RULER could not look for groups: %s", exc)
            continue
        for group_id, policy in claimed:
            try:
                out = await run_ruler(svc, group_id, RulerIn())
                log.info("RULER scored group %s of %s: %s", group_id, policy, [round(s.score, 3) for s in out.scores])
            except Exception as exc:  # one group's failure must not stop the task for every policy
                message = exc.message if isinstance(exc, BurnishError) else f"{type(exc).__name__}: {exc}"
                log.warning("RULER on group %s of %s failed: %s", group_id, policy, message)
                if not (isinstance(exc, BurnishError) and exc.code == "ruler_failed"):  # that one is stored already
                    with contextlib.suppress(Exception):
                        await svc.db.transaction(store.store_error, group_id, message)


route_handlers = [ruler]
