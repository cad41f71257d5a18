"""RULER in the store: a group's members for the judge, cached verdicts, and the rewards they set.

Sync functions of a ``Connection`` (``Database.read`` / ``Database.transaction``). A
verdict is stored in one transaction with every member's reward (source ``ruler``, the
component ``ruler``, the judge's explanation), and the group closes if it was open. A
group a trainer has claimed or trained is refused (``Conflict``): its rewards are in a step.

How a RULER score combines with a reward the user posted is one rule, per request or per
policy (``combine``): ``set`` (default) makes the score the reward; ``add`` adds it to the
user's reward (0 if none). Either way the user's components stay, next to ``ruler``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import exists, insert, or_, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from burnish_server.core.learning.groups import UNREWARDED, group_state, rewards_final
from burnish_server.core.learning.verdicts import Score
from burnish_server.core.platform.access import local
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import Conflict, NotFound
from burnish_server.core.protocols.records import OK, CallRecord
from burnish_server.store import evals, groups
from burnish_server.store.calls import to_record
from burnish_server.store.models import Call, Group, PolicyRow, Reward, RulerVerdict, Trajectory
from burnish_server.store.training import settle

# A gateway that died while judging a group of a policy with automatic RULER: another
# (or the restarted one) takes the group again after this long.
AUTO_LEASE_S = 600.0


@dataclass
class Member:
    trajectory_id: str
    reward: float | None
    components: dict[str, float]
    calls: list[CallRecord]  # its ok calls, in order


@dataclass
class GroupForJudge:
    group_id: str
    policy: str | None
    members: list[Member]


def _check_judgeable(group: Any, group_id: str) -> None:
    if group is None:
        raise NotFound(f"no group {local(group_id)!r}", "group_not_found", "group_id")
    if rewards_final(group_state(group.closed_at, group.claimed_by, group.trained_at)):
        raise Conflict(f"group {local(group_id)!r} is being trained or was trained; its rewards can no longer change", "group_trained", "group_id")


def group_for_judge(conn: Connection, group_id: str) -> GroupForJudge:
    group = conn.execute(select(Group).where(Group.id == group_id)).first()
    _check_judgeable(group, group_id)
    assert group is not None
    members: dict[str, Member] = {}
    for t in conn.execute(select(Trajectory).where(Trajectory.group_id == group_id).order_by(Trajectory.pk)):
        members[t.id] = Member(t.id, t.reward, dict(t.reward_components or {}), [])
    if not members:
        raise Conflict(f"group {local(group_id)!r} has no trajectories to judge", "group_empty", "group_id")
    rows = conn.execute(select(Call).where(Call.trajectory_id.in_(list(members)), Call.status == OK).order_by(Call.started_at, Call.pk))
    for row in rows:
        members[row.trajectory_id].calls.append(to_record(row, group_id))
    return GroupForJudge(group_id, group.policy, list(members.values()))


def cached_verdict(conn: Connection, key: str) -> dict[str, Score] | None:
    row = conn.execute(select(RulerVerdict.scores).where(RulerVerdict.key == key)).first()
    if row is None:
        return None
    return {t: Score(s["score"], s["explanation"]) for t, s in row.scores.items()}


def store_verdict(conn: Connection, group_id: str, key: str, judge: str, scores: dict[str, Score], combine: str) -> dict[str, float]:
    """Cache the verdict and set every member's reward from it; returns the rewards set."""
    group = conn.execute(select(Group).where(Group.id == group_id).with_for_update()).first()
    _check_judgeable(group, group_id)
    assert group is not None
    upsert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    conn.execute(
        upsert(RulerVerdict)
        .values(key=key, judge=judge, scores={t: {"score": s.score, "explanation": s.explanation} for t, s in scores.items()}, created_at=utcnow())
        .on_conflict_do_nothing(index_elements=["key"])
    )
    now, rewards = utcnow(), {}
    members = {t.id: t for t in conn.execute(select(Trajectory).where(Trajectory.group_id == group_id))}
    if set(members) != set(scores):  # a member joined while the judge was thinking
        raise Conflict(f"group {local(group_id)!r} changed while it was judged; ask again", "group_changed", "group_id")
    for trajectory_id, s in scores.items():
        member = members[trajectory_id]
        user = conn.execute(
            select(Reward.reward)
            .where(Reward.trajectory_id == trajectory_id, Reward.source == "user", Reward.call_pk.is_(None))
            .order_by(Reward.pk.desc())
            .limit(1)
        ).scalar()
        reward = s.score if combine == "set" else (user or 0.0) + s.score
        components = {**(member.reward_components or {}), "ruler": s.score}
        conn.execute(update(Trajectory).where(Trajectory.id == trajectory_id).values(reward=reward, reward_components=components, rewarded_at=now))
        conn.execute(
            insert(Reward).values(trajectory_id=trajectory_id, reward=reward, components=components, source="ruler", explanation=s.explanation, created_at=now)
        )
        rewards[trajectory_id] = reward
    evals.settle(conn, [m.pk for m in members.values() if m.eval])  # held-out members' scores, with these rewards
    values: dict[str, Any] = {"ruler_at": now, "ruler_key": key, "ruler_error": None}
    if group.closed_at is None:
        values.update(closed_at=now, close_reason="ruler")
    conn.execute(update(Group).where(Group.id == group_id).values(**values))
    settle(conn, [group_id])  # closed by this verdict, or closed before and its rewards rewritten
    return rewards


def store_error(conn: Connection, group_id: str, message: str) -> None:
    conn.execute(update(Group).where(Group.id == group_id).values(ruler_error=message[:2000], ruler_at=utcnow()))


def claim_auto(conn: Connection, limit: int = 8) -> list[tuple[str, str]]:
    """Closed groups of policies with automatic RULER that no one judged yet: (group, policy)
    pairs, claimed by stamping ``ruler_at``. With ``combine: set``, a group whose members all
    carry a user reward is left alone: there is nothing for the judge to decide."""
    policies = {p.name: p.ruler for p in conn.execute(select(PolicyRow.name, PolicyRow.ruler)) if (p.ruler or {}).get("auto")}
    if not policies:
        return []
    now = utcnow()
    # Under "set", only groups with a member the user did not reward (in SQL, so that groups
    # left alone never fill the window of oldest candidates).
    unrewarded = exists().where(Trajectory.group_id == Group.id, Trajectory.reward.is_(None))
    needs = [p for p, r in policies.items() if r.get("combine", "set") == "set"]
    candidates = conn.execute(
        select(Group.id, Group.policy)
        .where(
            Group.policy.in_(list(policies)),
            or_(Group.policy.not_in(needs), unrewarded) if needs else true(),
            groups.is_closed(),
            # A lone attempt closed without its reward keeps none: nothing for a judge to decide.
            or_(Group.close_reason.is_(None), Group.close_reason.not_in(UNREWARDED)),
            Group.ruler_key.is_(None),
            Group.ruler_error.is_(None),
            or_(Group.ruler_at.is_(None), Group.ruler_at < now - timedelta(seconds=AUTO_LEASE_S)),
        )
        .order_by(Group.closed_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    for group_id, _ in candidates:
        conn.execute(update(Group).where(Group.id == group_id).values(ruler_at=now))
    return [(group_id, policy) for group_id, policy in candidates if policy is not None]
