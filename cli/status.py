"""``burnish status``: where each policy stands, read from a gateway's admin API (what a user
would otherwise curl ``/admin/policies`` for): the served and candidate versions, groups by
state, the last step, the held-out scores, and the health warning; first, what is wrong with
the store, if anything (its ``/health``)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import msgspec

from burnish_server.core.api.views import PolicyList, PolicyView
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.platform.errors import BurnishError


class StatusFailed(BurnishError, RuntimeError):
    """The gateway could not be asked, or refused; the message says what to do."""

    default_code = "status_failed"


def fetch(url: str, token: str, policy: str | None = None) -> list[PolicyView]:
    path = f"/admin/policies/{policy}" if policy else "/admin/policies"
    try:
        response = httpx.get(url.rstrip("/") + path, headers={"authorization": f"Bearer {token}"}, timeout=30)
    except httpx.TransportError as exc:
        raise StatusFailed(f"no gateway answers at {url} ({exc}): is burnish up running? (--url)") from None
    if response.status_code in (401, 403):
        raise StatusFailed(f"{url} refused the admin token ({response.status_code}): pass --token, or set BURNISH_ADMIN_TOKEN")
    if response.status_code == 404 and policy:
        raise StatusFailed(f"no policy {policy!r} at {url}: `burnish status` with no name lists them")
    if response.status_code != 200:
        raise StatusFailed(f"{url}{path}: {response.status_code} {response.text[:300]}")
    if policy:
        return [msgspec.json.decode(response.content, type=PolicyView)]
    return msgspec.json.decode(response.content, type=PolicyList).data


class Health(msgspec.Struct):
    """``/health``: ``store`` says what is wrong with the store, if anything."""

    status: str
    store: str | None = None


def store_warning(url: str) -> str | None:
    """What the gateway's ``/health`` says of its store (full, short of room, away), if anything."""
    try:
        response = httpx.get(url.rstrip("/") + "/health", timeout=30)
        return msgspec.json.decode(response.content, type=Health).store if response.status_code == 200 else None
    except (httpx.TransportError, msgspec.DecodeError):
        return None  # fetch() says the gateway did not answer


def _ago(stamp: str | None, now: datetime) -> str:
    if not stamp:
        return ""
    seconds = (now - datetime.fromisoformat(stamp)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f", {seconds / size:.0f} {unit} ago"
    return f", {seconds:.0f} s ago"


def render(policy: PolicyView, now: datetime | None = None) -> str:
    """A few lines a person reads: what serves, what waits, how the last step went, health."""
    now = now or datetime.now(UTC)
    head = f"{policy.name}: serving {policy.served_version} (base {policy.base_model})"
    if policy.paused:
        head += ", paused"
    lines = [head]
    if policy.candidate is not None:
        share = f", {policy.candidate.share:.0%} of trajectories" if policy.candidate.share else ", pinned calls only"
        lines.append(f"  candidate {policy.candidate.version} on trial ({policy.candidate.rule}{share})")
    if policy.pending_version:
        lines.append(f"  switching to {policy.pending_version}")
    lines.append(
        f"  groups: {policy.groups_open} open, {policy.groups_closed} closed ({policy.groups_ready} ready to train), "
        f"{policy.groups_trained} trained, {policy.groups_eval} held out; a step takes {policy.train.groups_per_step}"
    )
    lone = policy.lone
    if lone.waiting or lone.ready or lone.trained or lone.expired:  # traffic answered once (docs/production.md)
        lines.append(f"  lone attempts: {lone.waiting} waiting for a reward, {lone.ready} ready, {lone.trained} trained, {lone.expired} expired unrewarded")
    if lone.judged or lone.unreadable:
        lines.append(f"  next-message judge: {lone.judged} answers scored by what followed, {lone.unreadable} unreadable verdicts")
    step = policy.last_step
    if step is None:
        lines.append("  no step yet")
    else:
        reward = step.metrics.reward_mean if isinstance(step.metrics, StepMetrics) else None
        figures = f": train reward {reward:.3f}" if reward is not None else ""
        lines.append(f"  last step {step.step}{figures}{_ago(step.created_at, now)}")
    scored = [e for e in policy.eval if e.score is not None]
    if scored:
        lines.append("  held-out score: " + ", ".join(f"{e.version} {e.score:.3f} (n={e.trajectories})" for e in scored))
    if policy.load_error:
        lines.append(f"  load error: {policy.load_error}")
    for replica in policy.replicas:  # one that does not serve the version gets none of the policy's calls
        if not replica.serving:
            why = "unreachable" if not replica.reachable else f"does not serve {policy.served_version}" + (f": {replica.error}" if replica.error else "")
            lines.append(f"  replica {replica.url} {why}{_ago(replica.since, now)}")
    for conflict in policy.settings_warnings:
        lines.append(f"  settings: {conflict}")
    warning = policy.health.warning if policy.health is not None else None
    lines.append(f"  health: {warning}" if warning else "  health: ok")
    return "\n".join(lines)
