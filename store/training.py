"""The training queue, kept in the store: which groups are ready, and who trains them.

A group is ready for its policy when it is closed, every member has a reward, and the
rewards are not all equal, or some call carries a reward of its own that is not 0 (equal
rewards and no call's credit give zero advantages: nothing to learn); see
``core/learning/groups.py`` for the states. A group held out for evaluation is never ready: neither
one marked itself (``groups.eval``) nor one with any marked member (a trajectory marked
before it joined the group), so a held-out trajectory is never trained on, however the
marks arrived.

A trainer *claims* ready groups in one transaction (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL; SQLite's writer lock serialises the rest), so two trainers never take the
same group, and one policy is trained by one trainer at a time. It claims a full step's worth or nothing. After its step is saved it marks
them trained; if it fails, it releases them. A claim older than the lease (a trainer that
died mid-step) is claimable again, so a crash never loses a group.

These are sync functions of a ``Connection``, run by ``Database.transaction``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec
from sqlalchemy import ColumnElement, Select, and_, case, exists, false, func, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import InstrumentedAttribute, aliased

from burnish_server.core.learning.groups import EXPIRED, FOLLOWED, UNREWARDED, Lack, tolerated
from burnish_server.core.learning.policies import Objective, TrainSettings
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.settings import Settings
from burnish_server.core.protocols.records import DEMONSTRATION, OK, CallRecord
from burnish_server.store import groups
from burnish_server.store.calls import to_record
from burnish_server.store.models import Call, Group, PolicyRow, Reward, Trajectory

# A claim's lease when the caller names none: the trainer's own default (core/platform/settings.py: trainer_lease).
DEFAULT_LEASE_S = Settings().trainer_lease


def call_reward() -> Any:
    """A call's newest reward of its own (credit per turn), or NULL: a scalar subquery correlated
    with ``Call``, one probe of the rewards' ``call_pk`` index per call read."""
    return select(Reward.reward).where(Reward.call_pk == Call.pk).order_by(Reward.pk.desc()).limit(1).scalar_subquery()


def group_members(among: Select) -> Any:
    """Per group of ``among`` (a query of group ids), as a subquery: its members (``size``), how
    many have a reward (``rewarded``), the lowest and highest (``low``, ``high``: equal when the
    group tied), and how many are held out (``held_out``). Read for those groups only, from
    ``ix_trajectories_group_members`` alone: it costs what ``among`` holds, not the store's history."""
    return (
        select(
            Trajectory.group_id.label("group_id"),
            func.count().label("size"),
            func.count(Trajectory.reward).label("rewarded"),
            func.min(Trajectory.reward).label("low"),
            func.max(Trajectory.reward).label("high"),
            func.sum(case((Trajectory.eval, 1), else_=0)).label("held_out"),
        )
        .where(Trajectory.group_id.in_(among))
        .group_by(Trajectory.group_id)
        .subquery()
    )


def credited(group_id: ColumnElement[str] | InstrumentedAttribute[str]) -> ColumnElement[bool]:
    """Whether the group ``group_id`` names has a non-zero reward posted for one of its calls:
    trainable however its trajectories' rewards compare (credit per turn). Correlated with the
    group and read from its members' rewards (by ``trajectory_id``: a call's reward is kept
    under its trajectory too), a call's newest one counting; never the calls' rows."""
    # Its own names for the members and rewards: inside an aggregate of the members (``lacks``)
    # it must not take the outer query's rows for its own.
    member, reward, newer = aliased(Trajectory), aliased(Reward), aliased(Reward)
    return (
        exists()
        .where(
            member.group_id == group_id,
            reward.trajectory_id == member.id,
            reward.call_pk.is_not(None),
            reward.reward != 0,
            ~exists().where(newer.call_pk == reward.call_pk, newer.pk > reward.pk),
        )
        .correlate_except(member, reward, newer)
    )


class Training(NamedTuple):
    """What decides which of a policy's groups may train it."""

    projects: list[str] | None  # the projects whose groups may: its own and those it is shared with; None: every project's
    objective: Objective  # whether a group needs rewards, and rewards that differ
    lone: bool = True  # whether a lone attempt trains (TrainSettings.lone_baseline)
    lone_per_group: int = TrainSettings().lone_per_group  # lone attempts that weigh as one group in a step
    followed: bool = False  # whether a lone attempt completed by its follow-up trains (TrainSettings.hindsight)


def training_rules(conn: Connection, policy: str) -> Training:
    """The policy's ``Training`` (core/learning/policies.py: open_to, TrainSettings.weights)."""
    row = conn.execute(select(PolicyRow.project, PolicyRow.shared_with, PolicyRow.train).where(PolicyRow.name == policy)).one_or_none()
    if row is None:
        return Training(None, Objective())
    train = msgspec.convert(row.train or {}, TrainSettings)
    projects = None if row.project is None else [row.project, *(row.shared_with or ())]
    return Training(projects, train.readiness, train.lone_baseline is not None, train.lone_per_group, train.hindsight)


def lacks(group_id: ColumnElement[str] | InstrumentedAttribute[str]) -> Any:
    """What the group ``group_id`` names lacks to train (core/learning/groups.py: Lack), worked out from
    its members (``ix_trajectories_group_members``) and their calls' rewards: a scalar subquery
    correlated with the group. The worst lack wins: a held-out member, then a missing reward,
    then a tie with no call's own reward; a lone member, rewarded, lacks only peers."""
    return (
        select(
            case(
                (func.max(case((Trajectory.eval, 1), else_=0)) == 1, Lack.HELD_OUT.value),
                (func.count(Trajectory.reward) < func.count(), Lack.REWARDS.value),
                (or_(func.max(Trajectory.reward) > func.min(Trajectory.reward), credited(group_id)), Lack.NOTHING.value),
                (func.count() == 1, Lack.PEERS.value),
                else_=Lack.SPREAD.value,
            )
        )
        .where(Trajectory.group_id == group_id)
        .scalar_subquery()
    )


def settle(conn: Connection, ids: list[str]) -> None:
    """Work out and keep what the groups ``ids`` lack (``Group.lacks``): run where a group closes,
    where a verdict rewrites its rewards, and by the trainer for groups a late call unsettled.
    Their rewards no longer change once closed, so what is kept stays true. The caller holds
    the groups' rows locked (FOR UPDATE): on PostgreSQL this statement's snapshot then holds
    every member that joined before, and none can join until it commits."""
    if ids:
        conn.execute(update(Group).where(Group.id.in_(ids)).values(lacks=group_lack()))


def lone_group() -> Any:
    """Over ``groups``: a lone attempt's group (store/lone.py makes them, of size 1; a group a
    client declared of size 1 is one too), rewarded or followed; a posted demonstration is not."""
    return and_(Group.expected_size == 1, or_(Group.close_reason.is_(None), Group.close_reason != DEMONSTRATION))


def group_lack() -> Any:
    """What a group lacks, read in a statement over ``groups``: a group marked held out on its row
    is held out, whatever its members say (a marked call may name a group its trajectory never
    joined: the first group seen stays); a lone attempt closed without its reward (expired, or
    completed by its follow-up) lacks it for good: one posted since is kept, not trained on."""
    return case((Group.eval, int(Lack.HELD_OUT)), (Group.close_reason.in_(UNREWARDED), int(Lack.REWARDS)), else_=lacks(Group.id))


def settle_waiting(conn: Connection, policy: str) -> None:
    """Settle the policy's waiting groups that are not (a call came after they closed, or they
    closed before migration 0017), in the writer's lock order; one another transaction holds
    is left for the next time, and read from its members meanwhile."""
    stale = select(Group.id).where(*waiting(policy), Group.lacks.is_(None)).order_by(Group.id).with_for_update(skip_locked=True)
    settle(conn, list(conn.execute(stale).scalars()))


def waiting(policy: str) -> tuple[ColumnElement[bool], ...]:
    """The policy's closed groups that no trainer has finished: what may be ready. These terms
    match the partial index ``ix_groups_waiting``, so that readiness costs what waits (ties,
    held-out and unrewarded groups included), not the policy's trained history."""
    return (Group.policy == policy, Group.closed_at.is_not(None), Group.trained_at.is_(None))


def ready_groups(
    policy: str, *, now: datetime, lease_s: float = DEFAULT_LEASE_S, rules: Training = Training(None, Objective()), settled: bool = True
) -> Select:
    """Ids of the policy's ready, unclaimed groups, oldest closed first; only ``rules.projects``'
    where given (a group of a project the policy was unshared from waits, untrained). What
    ready asks of a group depends on the objective (core/learning/groups.py: tolerated): GRPO alone,
    every member rewarded and rewards that differ; with SFT, every member rewarded;
    distillation, nothing (the teacher scores the samples), or, with hindsight alone, a lone
    attempt's follow-up (``rules.followed``).

    ``settled``: the groups whose lack is kept on their row, read from ``ix_groups_waiting`` by
    it, so that the poll costs what is ready, not the ties and unrewarded groups that wait
    forever beside it. Else the groups not settled (closed before migration 0017, or a call came
    after they closed), each worked out from its members (``lacks``) until the trainer's next
    claim settles it (``settle_waiting``)."""
    lack: Any = Group.lacks if settled else group_lack()
    tolerance = int(tolerated(rules.objective, rules.lone))
    # On GRPO alone (the default), one value of the index: its entries come oldest closed first.
    fits = lack == tolerance if tolerance == Lack.NOTHING else lack <= tolerance
    # Posted demonstrations (core/learning/demonstrations.py) train SFT alone, and need no reward;
    # an expired lone attempt trains nothing, whatever the objective tolerates.
    sampled = or_(Group.close_reason.is_(None), Group.close_reason.not_in((DEMONSTRATION, EXPIRED)))
    kind = and_(sampled, fits)
    if rules.objective.grpo == rules.objective.sft == rules.objective.distill == 0:
        kind = false()  # distillation by hindsight alone: only what was followed
    if rules.objective.sft > 0:
        kind = or_(kind, and_(Group.close_reason == DEMONSTRATION, lack < int(Lack.HELD_OUT)))
    if rules.followed:  # the teacher learns from what followed (TrainSettings.readiness)
        kind = or_(kind, and_(Group.close_reason == FOLLOWED, lack < int(Lack.HELD_OUT)))
    return (
        select(Group.id, lone_group().label("lone"))
        .where(
            *waiting(policy),
            Group.lacks.is_not(None) if settled else Group.lacks.is_(None),
            Group.eval.is_(False),
            # Closed, or being trained by a trainer whose lease ran out (it died mid-step).
            or_(groups.is_closed(), and_(groups.is_training(), Group.claimed_at < now - timedelta(seconds=lease_s))),
            kind,
            *([Group.project.in_(rules.projects)] if rules.projects is not None else []),
        )
        .order_by(Group.closed_at, Group.pk)
    )


def count_ready(conn: Connection, policy: str, lease_s: float = DEFAULT_LEASE_S) -> int:
    """The policy's ready groups: those settled, and those not yet settled that are."""
    rules, now = training_rules(conn, policy), utcnow()
    counts = (select(func.count()).select_from(ready_groups(policy, now=now, lease_s=lease_s, rules=rules, settled=s).subquery()) for s in (True, False))
    return sum(conn.execute(count).scalar_one() for count in counts)


def claim_groups(conn: Connection, policy: str, worker: str, count: int, lease_s: float = DEFAULT_LEASE_S, minimum: int | None = None) -> list[str]:
    """Claim up to ``count`` ready groups' worth for ``worker``; none if fewer than ``minimum``
    (default: count; 0: whatever is ready) are ready. A lone attempt (``lone_group``) weighs
    1 / ``lone_per_group`` of a group (TrainSettings), so a step of lone traffic trains
    ``count x lone_per_group`` of them.

    One trainer at a time trains a policy (each step builds on the last): while another
    worker holds a live claim on the policy's groups, this one gets none. The policy's row
    is locked for the check, so two trainers cannot both see it free (on SQLite the
    writer's lock does the same)."""
    now = utcnow()
    conn.execute(select(PolicyRow.pk).where(PolicyRow.name == policy).with_for_update())
    if other_trainer_busy(conn, policy, worker, lease_s):
        return []
    settle_waiting(conn, policy)  # those a writer holds stay unsettled, and wait for the next poll
    rules = training_rules(conn, policy)
    query = ready_groups(policy, now=now, lease_s=lease_s, rules=rules).limit(count * rules.lone_per_group).with_for_update(skip_locked=True, of=Group)
    # Worth counted in lone attempts: a group is lone_per_group of them.
    ids, worth, per_group = [], 0, rules.lone_per_group
    for group_id, lone in conn.execute(query):
        if worth >= count * per_group:
            break
        ids.append(group_id)
        worth += 1 if lone else per_group
    if not ids or worth < (count if minimum is None else minimum) * per_group:
        return []
    conn.execute(update(Group).where(Group.id.in_(ids)).values(claimed_by=worker, claimed_at=now))
    return ids


def other_trainer_busy(conn: Connection, policy: str, worker: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
    """Whether another worker holds a live claim on the policy's groups (it is mid-step)."""
    since = utcnow() - timedelta(seconds=lease_s)
    busy = select(Group.pk).where(Group.policy == policy, groups.is_training(), Group.claimed_by != worker, Group.claimed_at >= since)
    return conn.execute(busy.limit(1)).first() is not None


def complete_groups(conn: Connection, ids: list[str], worker: str, step: int) -> None:
    """Mark claimed groups trained at ``step``; fails if the claim was lost (lease expired and taken)."""
    done = conn.execute(
        update(Group).where(Group.id.in_(ids), Group.claimed_by == worker, Group.trained_at.is_(None)).values(trained_at=utcnow(), trained_step=step)
    ).rowcount
    if done != len(ids):
        raise RuntimeError(f"{worker} lost its claim on {len(ids) - done} of {len(ids)} groups")


def release_groups(conn: Connection, worker: str, ids: list[str] | None = None) -> int:
    """Give back a worker's untrained claims (all of them, or ``ids``): they wait again."""
    query = update(Group).where(Group.claimed_by == worker, Group.trained_at.is_(None))
    if ids is not None:
        query = query.where(Group.id.in_(ids))
    return conn.execute(query.values(claimed_by=None, claimed_at=None)).rowcount


class TrainingCall(NamedTuple):
    group_id: str
    trajectory_id: str
    reward: float | None  # None: not rewarded (a group that distills needs no reward)
    call: CallRecord
    call_reward: float | None = None  # posted for this call alone (credit per turn)
    # What followed its trajectory's answer (core/learning/followups.py): chat messages, for a
    # teacher with hindsight; None where nothing did.
    followed: list[dict[str, Any]] | None = None


def group_calls(conn: Connection, ids: list[str]) -> list[TrainingCall]:
    """Every ok call the group's policy answered in the groups' trajectories (and every
    demonstration posted for it), with the trajectory's reward, in order. Calls to other models (a judge, a tool's own model, another
    policy) stay in the trajectory but are not this policy's samples: they are not trained.
    Nor is anything held out: a mark that arrived after the claim still keeps its trajectory
    (or group) out of the step."""
    rows = conn.execute(
        select(Trajectory.group_id, Trajectory.reward, call_reward().label("call_reward"), Trajectory.followed, Call)
        .join(Call, Call.trajectory_id == Trajectory.id)
        .join(Group, Group.id == Trajectory.group_id)
        .where(
            Trajectory.group_id.in_(ids), Call.status.in_((OK, DEMONSTRATION)), Call.policy == Group.policy, Group.eval.is_(False), Trajectory.eval.is_(False)
        )
        .order_by(Trajectory.group_id, Trajectory.pk, Call.started_at, Call.pk)
    )
    return [TrainingCall(row.group_id, row.trajectory_id, row.reward, to_record(row, row.group_id), row.call_reward, row.followed) for row in rows]
