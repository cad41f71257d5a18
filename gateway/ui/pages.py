"""The dashboard's pages: policies, a policy's timeline, groups, trajectories, one trajectory
down to its tokens, and two versions compared on held-out tasks.

Each page is one template rendered on the server from the store's typed reads. The parts
that change while training runs (``id="live"``) are fetched again every few seconds by htmx
(``hx-trigger="every 5s"``, the same URL, the fragment selected from the page): no
JavaScript of our own, and a page reads the same with scripts off, only without updating.
Everything is scoped as the API is: a key sees its project's data and the policies open to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlencode

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.params import FromQuery, Parameter
from litestar.response import Template

from burnish_server.core.api.listing import Filters, Keyset
from burnish_server.core.api.views import PolicyView, StepView
from burnish_server.core.learning.groups import group_state
from burnish_server.core.learning.policies import Policy, served_name
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.platform.access import Principal, local, qualify
from burnish_server.core.platform.errors import NotFound
from burnish_server.core.platform.ids import adapter_name
from burnish_server.gateway.edge import listing as listings
from burnish_server.gateway.policies.routing import Registry
from burnish_server.gateway.routes.common import CallIndex, GroupId, PolicyName, TrajectoryId
from burnish_server.gateway.services import Services
from burnish_server.gateway.ui import charts
from burnish_server.gateway.ui.auth import who
from burnish_server.gateway.ui.status import Statuses
from burnish_server.gateway.ui.tokens import TokenTexts
from burnish_server.gateway.ui.trajectory import Group, advantage_of, panels
from burnish_server.store import dashboard, evals, listing, reads

LIVE_EVERY_S = 5  # how often a live part of a page is fetched again


def context(request: Request, caller: Principal, **values: Any) -> dict[str, Any]:
    """What every page's frame shows: who is signed in, whether they may use the controls, and
    what is wrong with the store (full, short of room, away), if anything."""
    svc: Services = request.app.state.services
    return {
        "caller": who(caller),
        "admin": caller.can("admin"),
        "home": caller.project,
        "path": request.url.path,
        "live_every": LIVE_EVERY_S,
        "store_warning": svc.store_warning(),
        **values,
    }


def visible_policy(svc: Services, caller: Principal, name: str) -> Policy:
    policy = svc.policies.policies.get(name)
    if policy is None or not Registry.open_to(policy, caller):
        raise NotFound(f"no policy {name!r}", "policy_not_found", "name")
    return policy


def statuses(request: Request) -> Statuses:
    """The policies' status snapshots (``ui/status.py``), kept on the app by its lifespan."""
    found: Statuses = request.app.state.ui_status
    return found


@get("/", name="ui-policies")
async def policies_page(request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> Template:
    names = sorted(p.name for p in svc.policies.listed(caller))
    rows = [(await statuses(request).get(name)).status for name in names]
    known = await project_counts(request, svc) if caller.can("admin") else []
    return Template("policies.html", context=context(request, caller, policies=rows, projects=known))


def _charts(status: PolicyView, steps: list[StepView], scores: dict[int, evals.Score]) -> list[charts.Chart]:
    def metric(figure: Callable[[StepMetrics], float | None]) -> list[tuple[int, float | None]]:
        return [(s.step, figure(s.metrics)) for s in steps if isinstance(s.metrics, StepMetrics)]

    markers = [
        charts.Marker(s.step, f"{d.decision} by {d.by}: {d.reason}", f"m-{d.decision}")  # each Outcome has its mark (static/dashboard.css)
        for s in steps
        for d in s.decisions
    ]
    markers.append(charts.Marker(status.step, f"served now ({status.served_version})", "m-serving"))
    held_out: list[tuple[int, float | None]] = [(step, score.score) for step, score in sorted(scores.items())]

    def share(tokens: Callable[[StepMetrics], float]) -> Callable[[StepMetrics], float | None]:
        return lambda m: tokens(m) / m.tokens if m.tokens else None

    objectives = charts.Chart(
        "Objectives beside GRPO: reverse KL to the teacher, SFT loss, and the share of tokens each trained",
        [
            charts.Series("teacher_kl", metric(lambda m: m.teacher_kl if m.distill_tokens else None), "s-teacher"),
            charts.Series("sft_loss", metric(lambda m: m.sft_loss if m.sft_tokens else None), "s-sft"),
            charts.Series("distilled share", metric(share(lambda m: m.distill_tokens)), "s-diff"),
            charts.Series("SFT share", metric(share(lambda m: m.sft_tokens)), "s-clip"),
        ],
        markers,
    )
    beyond_grpo = any(isinstance(s.metrics, StepMetrics) and (s.metrics.sft_tokens or s.metrics.distill_tokens) for s in steps)
    return [
        charts.Chart(
            "Reward: train (each step's groups) and held-out (each version)",
            [charts.Series("train reward", metric(lambda m: m.reward_mean), "s-reward"), charts.Series("held-out score", held_out, "s-eval")],
            markers,
        ),
        charts.Chart(
            "Off-policy: the mismatch to vLLM's sampling (KL), the share of tokens corrected (clipped, or capped under TIS), staleness",
            [
                charts.Series("mismatch_kl", metric(lambda m: m.mismatch_kl), "s-diff"),
                charts.Series("clip_fraction", metric(lambda m: m.clip_fraction), "s-clip"),
                charts.Series("tis_capped_fraction", metric(lambda m: m.tis_capped_fraction), "s-cap"),
                charts.Series("staleness_mean", metric(lambda m: m.staleness_mean), "s-stale"),
            ],
            markers,
        ),
        *([objectives] if beyond_grpo else []),
    ]


# The versions table shows the newest this many; the timeline shows every one.
STEPS_SHOWN = 50


@get("/policies/{name:str}", name="ui-policy")
async def policy_page(
    name: PolicyName, request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal], done: FromQuery[str | None] = None
) -> Template:
    visible_policy(svc, caller, name)
    status, steps, scores, at = await statuses(request).get(name)
    versions = sorted({0, *(s.step for s in steps)})
    return Template(
        "policy.html",
        context=context(
            request,
            caller,
            p=status,
            steps=list(reversed(steps))[:STEPS_SHOWN],
            older_steps=max(0, len(steps) - STEPS_SHOWN),
            scores=scores,
            charts=[c.svg() for c in _charts(status, steps, scores)],
            versions=versions,
            read_at=datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds"),
            done=done if done in ("paused", "resumed", "train", "rollback", "promoted", "rejected") else None,
        ),
    )


# The fields a list's form shows, and the page's own: echoed as sent, so the form shows what was asked.
FORM = ("project", "policy", "version", "state", "eval", "reward_min", "reward_max", "created_after", "created_before", "limit", "order")


@dataclass(frozen=True)
class Query:
    """A list's query as its page shows it: the form's fields as sent, the filters as parsed (``gateway/edge/listing.py``)."""

    form: dict[str, str]
    filters: Filters
    after: str | None  # not the first page: rows after this one

    def link(self, **changes: str | None) -> str:
        """This query string with ``changes`` (None removes a field): for the next page, a chip's removal."""
        values = {**self.form, **{k: v or "" for k, v in changes.items()}}
        return urlencode({k: v for k, v in values.items() if v})

    def next(self, page: listing.Page[Any]) -> str | None:
        """The next page's query string; None on the last page. Its ``after`` names the last row
        as the parser reads it: by its project's id, or by stored id in every project's list."""
        if not page.has_more:
            return None
        last: str = page.rows[-1].id
        return self.link(after=last if self.filters.project is None else local(last))


async def _list(request: Request, svc: Services, caller: Principal, page: listing.Page[Any] | None, filters: Filters, template: str) -> Template:
    """A page of groups or trajectories, as the API lists them (``store/listing.py``)."""
    if page is None:
        raise NotFound(f"no row {request.query_params.get('after')!r} to page after", "not_found", "after")
    query = Query({k: request.query_params.get(k, "").strip()[:200] for k in FORM}, filters, request.query_params.get("after"))
    policies = sorted(p.name for p in svc.policies.listed(caller))
    known = await project_counts(request, svc) if caller.can("admin") else []
    return Template(template, context=context(request, caller, q=query, page=page, policies=policies, local=local, projects=known))


@get("/groups", name="ui-groups", opt={listings.OPT: listings.DASHBOARD}, dependencies=listings.LIST_DEPENDENCIES)
async def groups_page(
    request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal], filters: NamedDependency[Filters], keyset: NamedDependency[Keyset]
) -> Template:
    return await _list(request, svc, caller, await svc.db.read(listing.group_list, filters, keyset), filters, "groups.html")


@get("/trajectories", name="ui-trajectories", opt={listings.OPT: listings.DASHBOARD}, dependencies=listings.LIST_DEPENDENCIES)
async def trajectories_page(
    request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal], filters: NamedDependency[Filters], keyset: NamedDependency[Keyset]
) -> Template:
    return await _list(request, svc, caller, await svc.db.read(listing.trajectories, filters, keyset), filters, "trajectories.html")


# How long the projects' list and counts are kept before the store is asked again (the
# counts read each table's project column whole).
PROJECTS_KEPT_S = 30.0


async def project_counts(request: Request, svc: Services) -> list[dashboard.ProjectCount]:
    """Every project with data, with its counts: an admin's picker and the policies page."""
    kept = getattr(request.app.state, "ui_projects", None)
    if kept is None or time.monotonic() - kept[0] > PROJECTS_KEPT_S:
        kept = (time.monotonic(), await svc.db.read(dashboard.projects))
        request.app.state.ui_projects = kept
    found: list[dashboard.ProjectCount] = kept[1]
    return found


async def _project(request: Request, svc: Services, caller: Principal, kind: Literal["group", "trajectory"], local_id: str) -> str:
    """The project whose ids a page names: the caller's; an admin may name another
    (``?project=``), and an admin's link that names none finds the project that holds the id."""
    asked = request.query_params.get("project", "")
    if not caller.can("admin"):
        return caller.project
    if asked and asked != listings.ALL:
        return asked
    if await svc.db.read(dashboard.find_project, kind, local_id, [caller.project]) is not None:
        return caller.project
    names = [p.project for p in await project_counts(request, svc)]
    return await svc.db.read(dashboard.find_project, kind, local_id, names) or caller.project


def _stored(project: str, id: str) -> str:
    return qualify(project, id)


@get("/groups/{group_id:str}", name="ui-group")
async def group_page(group_id: GroupId, request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> Template:
    project = await _project(request, svc, caller, "group", group_id)
    stored = _stored(project, group_id)
    group = await svc.db.read(reads.get_group, stored)
    if group is None:
        raise NotFound(f"no group {group_id!r}", "group_not_found", "group_id")
    row = await svc.db.read(dashboard.group_row, stored)
    policy = svc.policies.policies.get(row.policy) if row is not None and row.policy else None
    info = Group(group.id, group_state(row.closed_at, row.claimed_by, row.trained_at), row.trained_step, row.policy, [(m.id, m.reward) for m in group.members])
    advantages = {m.id: advantage_of(m.id, info, policy) for m in group.members}
    return Template("group.html", context=context(request, caller, g=group, info=info, advantages=advantages, project=project))


async def _trajectory(svc: Services, project: str, trajectory_id: str) -> tuple[Any, Group | None, Policy | None]:
    stored = _stored(project, trajectory_id)
    trajectory = await svc.db.read(reads.get_trajectory, stored)
    if trajectory is None:
        raise NotFound(f"no trajectory {trajectory_id!r}", "trajectory_not_found", "trajectory_id")
    group = None
    policy = None
    if trajectory.group_id is not None:
        stored_group = _stored(project, trajectory.group_id)
        row = await svc.db.read(dashboard.group_row, stored_group)
        members = await svc.db.read(dashboard.group_rewards, stored_group)
        group = Group(
            trajectory.group_id, group_state(row.closed_at, row.claimed_by, row.trained_at), row.trained_step, row.policy, [(local(i), r) for i, r in members]
        )
        policy = svc.policies.policies.get(row.policy) if row.policy else None
    if policy is None and isinstance(trajectory.calls, list):
        policy = next((svc.policies.policies[c.policy] for c in trajectory.calls if c.policy in svc.policies.policies), None)
    return trajectory, group, policy


@get("/trajectories/{trajectory_id:str}", name="ui-trajectory")
async def trajectory_page(trajectory_id: TrajectoryId, request: Request, svc: NamedDependency[Services], caller: NamedDependency[Principal]) -> Template:
    project = await _project(request, svc, caller, "trajectory", trajectory_id)
    trajectory, group, policy = await _trajectory(svc, project, trajectory_id)
    shown = panels(trajectory, group, policy)
    return Template(
        "trajectory.html",
        context=context(
            request, caller, t=trajectory, group=group, panels=shown, project=project, project_query="" if project == caller.project else f"?project={project}"
        ),
    )


@get("/trajectories/{trajectory_id:str}/calls/{index:int}/tokens", name="ui-tokens")
async def tokens_fragment(
    trajectory_id: TrajectoryId,
    index: CallIndex,
    request: Request,
    svc: NamedDependency[Services],
    caller: NamedDependency[Principal],
    choice: int = Parameter(default=0, ge=0, le=1024),
) -> Template:
    """A call's sampled tokens with their text, asked of vLLM (``ui/tokens.py``): loaded into the
    trajectory page by htmx, or shown alone where scripts are off."""
    project = await _project(request, svc, caller, "trajectory", trajectory_id)
    trajectory, group, policy = await _trajectory(svc, project, trajectory_id)
    shown = panels(trajectory, group, policy)
    if not -len(shown) <= index < len(shown) or choice >= len(shown[index].choices):
        raise NotFound(f"no call {index} (choice {choice}) in trajectory {trajectory_id!r}", "call_not_found", "index")
    panel = shown[index]
    tokens = panel.choices[choice]
    model = served_name(policy, 0) if policy is not None else (panel.call.model or "")
    known: TokenTexts = request.app.state.setdefault("ui_token_texts", TokenTexts())
    texts = await known.texts(svc.upstream, model, [t.id for t in tokens])
    # htmx asks for the fragment that replaces the ids on the trajectory page; a browser without scripts gets a page.
    template = "_tokens.html" if request.headers.get("hx-request") == "true" else "tokens.html"
    return Template(
        template, context=context(request, caller, panel=panel, tokens=tokens, texts=texts, choice=choice, t=trajectory, load=False, project_amp="")
    )


@get("/policies/{name:str}/compare", name="ui-compare")
async def compare_page(
    name: PolicyName,
    request: Request,
    svc: NamedDependency[Services],
    caller: NamedDependency[Principal],
    a: int = Parameter(default=0, ge=0, le=2**31 - 1),
    b: int | None = Parameter(default=None, ge=0, le=2**31 - 1),
) -> Template:
    policy = visible_policy(svc, caller, name)
    b = policy.step if b is None else b
    result = await svc.db.read(dashboard.held_out_answers, name, a, b, caller.project)
    _, steps, scores, _ = await statuses(request).get(name)  # each version's score over every held-out task
    return Template(
        "compare.html",
        context=context(
            request,
            caller,
            name=name,
            a=a,
            b=b,
            version_a=adapter_name(name, a),
            version_b=adapter_name(name, b),
            result=result,
            scores=scores,
            versions=sorted({0, a, b, *(s.step for s in steps)}),
            mean=lambda xs: sum(x.reward for x in xs) / len(xs) if xs else None,
        ),
    )


route_handlers = [policies_page, policy_page, groups_page, trajectories_page, group_page, trajectory_page, tokens_fragment, compare_page]
