"""RULER on a group: the judge chosen, the verdict cached and stored as rewards; and the background
task that judges the closed groups of policies that ask for it (``ruler.auto``). The route,
``POST /v1/groups/{id}/ruler``, is ``gateway/routes/ruler.py``.

Which judge: the model is the request's ``judge_model``, else the group's policy's
``ruler.judge_model``, else ``BURNISH_JUDGE_MODEL``, else the policy's base model. The
endpoint is never the request's (the route is open to agents: a URL in a body would let
anyone aim the gateway at any host and read the answer): it is the policy's
``ruler.judge_base_url`` (set by an admin; within ``BURNISH_JUDGE_ALLOWED_URLS`` where
that is set), else ``BURNISH_JUDGE_BASE_URL``, else the gateway's own upstream. A key goes
only to the server it was configured for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Annotated, Any, Literal

import msgspec

from burnish_server.core.api.views import JudgeView, RulerView, ScoreView
from burnish_server.core.learning.policies import JUDGE_URL_PATTERN, RulerSettings
from burnish_server.core.platform.access import NO_NUL, PRINTABLE, local
from burnish_server.core.platform.errors import BurnishError, Conflict, Invalid, Unavailable
from burnish_server.core.protocols.transcript import conversation
from burnish_server.gateway.groups.ruler import Judge, RulerFailed, build_prompt, cache_key, judge_group, public_url
from burnish_server.gateway.services import Services
from burnish_server.store import ruler as store
from burnish_server.telemetry.langfuse_export import Score

log = logging.getLogger("burnish.ruler")
# How often closed groups are looked for to judge (ruler.auto): the most one waits for its
# judge. A constant: a policy's RULER settings say whether and how; this is only pacing.
AUTO_EVERY_S = 1.0


# Fields a request once could set and no longer may: the setting to use instead, and the code.
REFUSED_FIELDS = {
    "judge_base_url": (
        "the judge's endpoint comes from the gateway's configuration (BURNISH_JUDGE_BASE_URL, else its upstream) "
        "or from the policy's ruler.judge_base_url, set over the admin API",
        "judge_url_not_allowed",
    ),
    "judge_api_key": ("the judge's key comes from the gateway's configuration (BURNISH_JUDGE_API_KEY)", "judge_key_not_allowed"),
}
REFUSED_DOC = "Not accepted (400 {code}): {why}."


class RulerIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every field is optional: the policy's RULER settings, then the gateway's, fill the rest.
    The judge's endpoint and key are the server's to choose, never a request's."""

    rubric: Annotated[str, msgspec.Meta(max_length=20_000, pattern=NO_NUL)] | None = None
    judge_model: Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=PRINTABLE)] | None = None
    combine: Literal["set", "add"] | None = None
    # Refused whatever their value: fields rather than unknown keys, to answer with the setting to use.
    judge_base_url: Annotated[
        Any, msgspec.Meta(description=REFUSED_DOC.format(why=REFUSED_FIELDS["judge_base_url"][0], code=REFUSED_FIELDS["judge_base_url"][1]))
    ] = msgspec.UNSET
    judge_api_key: Annotated[
        Any, msgspec.Meta(description=REFUSED_DOC.format(why=REFUSED_FIELDS["judge_api_key"][0], code=REFUSED_FIELDS["judge_api_key"][1]))
    ] = msgspec.UNSET


def refuse_endpoint_fields(request: RulerIn) -> None:
    """400 for a request that names a judge's endpoint or key, before anything is read or asked."""
    for name, (why, code) in REFUSED_FIELDS.items():
        if getattr(request, name) is not msgspec.UNSET:
            raise Invalid(
                f"{name} is not accepted in a request: {why}. Leave it out; rubric, judge_model and combine are still the request's to choose.",
                code,
                name,
            )


_JUDGE_URL = re.compile(JUDGE_URL_PATTERN)


def _norm(url: str) -> str:
    return url.strip().rstrip("/")


def policy_judge(svc: Services, policy: RulerSettings, request: RulerIn, base_model: str | None, policy_name: str | None, group_id: str) -> Judge:
    s = svc.settings
    model = request.judge_model or policy.judge_model or s.judge_model or base_model
    if not model:
        raise Invalid("no judge model: pass judge_model, or set the policy's ruler.judge_model or BURNISH_JUDGE_MODEL", "no_judge_model", "judge_model")
    # The upstream as the judge: a group's verdicts go to one replica, as a trajectory's calls do.
    replicas = svc.upstream.replicas
    upstreams = {r.url + "/v1" for r in replicas.replicas}
    chosen = replicas.order(group_id, model)
    upstream = chosen[0].url + "/v1" if chosen else "(no replica)"
    configured = _norm(s.judge_base_url)
    if policy.judge_base_url:
        url, source = _norm(policy.judge_base_url), f"policy {policy_name!r}'s ruler.judge_base_url"
        allowed = {_norm(u) for u in s.judge_allowed_urls.split(",") if u.strip()}
        if allowed and url not in allowed | upstreams | {configured}:
            raise Conflict(
                f"{source} is not among BURNISH_JUDGE_ALLOWED_URLS: an admin must change one or the other", "judge_url_not_allowed", "judge_base_url"
            )
    elif configured:
        url, source = configured, "BURNISH_JUDGE_BASE_URL"
    else:
        url, source = upstream, "BURNISH_UPSTREAM"
    if not _JUDGE_URL.match(url) or len(url) > 700:
        # The server's configuration is wrong, not the request: say which setting, not its value.
        raise Unavailable(f"the judge's base URL ({source}) is not an http(s) base URL without query or fragment", "judge_misconfigured", "judge_base_url")
    # A configured key goes only to the server it was configured for.
    if s.judge_api_key and configured and url == configured:
        api_key = s.judge_api_key
    elif url in upstreams:
        api_key = s.upstream_api_key
    else:
        api_key = ""
    return Judge(
        base_url=url,
        model=model,
        api_key=api_key,
        attempts=s.judge_attempts,
        timeout_s=s.judge_timeout,
        connect_timeout_s=s.connect_timeout,
        max_tokens=s.judge_max_tokens,
        log_answers=s.log_bodies,
    )


async def run_ruler(svc: Services, group_id: str, request: RulerIn) -> RulerView:
    """Judge a group (by its stored id: ``core/platform/access.py``) or reuse a cached verdict, and store its rewards."""
    group = await svc.db.read(store.group_for_judge, group_id)
    policy = svc.policies.policies.get(group.policy) if group.policy else None
    settings = policy.ruler if policy is not None else RulerSettings()
    judge = policy_judge(svc, settings, request, policy.base_model if policy is not None else None, group.policy, group_id)
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
        group_id=local(group_id),
        judge=JudgeView(model=judge.model, base_url=public_url(judge.base_url)),
        combine=combine,
        cached=calls == 0,
        judge_calls=calls,
        distinct_trajectories=len(prompt.classes),
        scores=[ScoreView(trajectory_id=local(t), score=verdict[t].score, explanation=verdict[t].explanation, reward=rewards[t]) for t in rewards],
    )


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
                if isinstance(exc, BurnishError):  # our own words, fit for the group's ruler_error
                    message = exc.message
                    log.warning("RULER on group %s of %s failed: %s", group_id, policy, message)
                else:  # an unexpected error's text is for the log only
                    message = "RULER failed inside the gateway (its log says why); POST .../ruler tries again"
                    log.exception("RULER on group %s of %s failed", group_id, policy)
                if not (isinstance(exc, BurnishError) and exc.code == "ruler_failed"):  # that one is stored already
                    with contextlib.suppress(Exception):
                        await svc.db.transaction(store.store_error, group_id, message)
