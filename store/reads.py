"""Reading the store back: one trajectory, one group, a streamed export (a list's pages are
``store/listing.py``'s).

Everything is returned as the API's typed answers (``core/api/views.py``); request and
response bodies go out as ``msgspec.Raw``, the bytes that were recorded. Each call of a
trajectory says whether its prompt extends the trajectory so far, by the rule the trainer
merges on (``core/learning/continuity.py: Continuity``), over the calls the trainer reads (``Merging``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType
from sqlalchemy import func, literal, select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from burnish_server.core.api.listing import Filters, Keyset
from burnish_server.core.api.views import CallTokensView, CallView, GroupView, RewardView, TrajectoryPage, TrajectoryView
from burnish_server.core.learning.continuity import Continuity
from burnish_server.core.learning.drift import split_reason
from burnish_server.core.learning.groups import EXPIRED, FOLLOWED, GroupState, cannot_train, group_state
from burnish_server.core.learning.policies import Objective
from burnish_server.core.platform.access import local, local_optional
from burnish_server.core.protocols.records import DEMONSTRATION, OK, Adjustments, CallTokens, unpack_tokens
from burnish_server.store import listing
from burnish_server.store.calls import to_record
from burnish_server.store.listing import narrowed
from burnish_server.store.models import Call, Group, Reward, Trajectory, iso
from burnish_server.store.training import Training, credited, training_rules

EXPORT_PAGE = 256  # trajectories per query while exporting
_encode = msgspec.json.Encoder().encode


def trajectory_view(row: Any, call_count: int | UnsetType = UNSET) -> TrajectoryView:
    return TrajectoryView(
        id=local(row.id),
        group_id=local_optional(row.group_id),
        created_at=iso(row.created_at),
        updated_at=iso(row.updated_at),
        reward=row.reward,
        reward_components=row.reward_components,
        rewarded_at=iso(row.rewarded_at),
        eval=row.eval,
        call_count=call_count,
    )


class Merging:
    """A trajectory's calls as the trainer reads them (``store/training.py: group_calls``): the ok
    calls answered by its group's policy, walked in order by ``Continuity``. A trajectory with no
    group (or a group with no policy) is read as a group would make it: the first policy among
    its calls."""

    def __init__(self, policy: str | None) -> None:
        self.policy = policy
        self.continuity = Continuity()
        self.before: Any = None  # the last single-choice call walked: its prompt and completion are the history
        self.reason: str | None = None  # why the call just walked split (core/learning/drift.py), else None

    def extends(self, row: Any, tokens: CallTokens | None) -> bool | None:
        self.reason = None
        if self.policy is None:
            self.policy = row.policy
        if tokens is None or row.status != OK or row.policy is None or row.policy != self.policy:
            return None  # not read for training
        extends = self.continuity.extends(tokens.prompt, tokens.completions)
        if extends is False and self.before is not None:
            self.reason = split_reason(to_record(self.before), to_record(row))
        if extends is not None:
            self.before = row
        return extends


def call_view(row: Any, merging: Merging, reward: float | None = None) -> CallView:
    """One call of a trajectory; ``merging`` has walked the trajectory's calls before it, in order."""
    tokens = unpack_tokens(row.prompt_token_ids, row.completion_token_ids, row.completion_logprobs, row.completion_lengths)
    extends = merging.extends(row, tokens)
    return CallView(
        id=row.pk,
        endpoint=row.endpoint,
        model=row.model,
        policy=row.policy,
        policy_step=row.policy_step,
        upstream_model=row.upstream_model,
        stream=row.stream,
        status=row.status,
        http_status=row.http_status,
        error=row.error,
        request=msgspec.Raw(row.request),
        response=msgspec.Raw(row.response) if row.response is not None else None,
        usage=row.usage,
        tokens=None
        if tokens is None
        else CallTokensView(prompt_token_ids=tokens.prompt, completion_token_ids=tokens.completions, completion_logprobs=tokens.logprobs),
        extends_previous=extends,
        split_reason=merging.reason,
        adjustments=msgspec.convert(row.adjustments, Adjustments) if row.adjustments else None,
        reward=reward,
        attempts=row.attempts,
        upstream_first_byte_ms=row.upstream_first_byte_ms,
        upstream_ms=row.upstream_ms,
        started_at=iso(row.started_at),
        finished_at=iso(row.finished_at),
    )


_CALLS_IN_ORDER = (Call.started_at, Call.pk)


def get_trajectory(conn: Connection, trajectory_id: str) -> TrajectoryView | None:
    row = conn.execute(select(Trajectory).where(Trajectory.id == trajectory_id)).first()
    if row is None:
        return None
    calls = conn.execute(select(Call).where(Call.trajectory_id == trajectory_id).order_by(*_CALLS_IN_ORDER)).all()
    rewards = conn.execute(select(Reward).where(Reward.trajectory_id == trajectory_id).order_by(Reward.pk)).all()
    policy = conn.execute(select(Group.policy).where(Group.id == row.group_id)).scalar() if row.group_id is not None else None
    out = trajectory_view(row, len(calls))
    merging = Merging(policy)
    index = {c.pk: i for i, c in enumerate(calls)}
    call_rewards = {r.call_pk: r.reward for r in rewards if r.call_pk is not None}  # the newest wins
    out.calls = [call_view(c, merging, call_rewards.get(c.pk)) for c in calls]
    out.sequence_splits = merging.continuity.splits
    out.rewards = [
        RewardView(
            reward=r.reward,
            components=r.components,
            source=r.source,
            explanation=r.explanation,
            created_at=iso(r.created_at),
            call=index.get(r.call_pk) if r.call_pk is not None else None,
        )
        for r in rewards
    ]
    return out


def get_group(conn: Connection, group_id: str) -> GroupView | None:
    row = conn.execute(select(Group).where(Group.id == group_id)).first()
    if row is None:
        return None
    members = (
        conn.execute(
            select(Trajectory, func.count(Call.pk).label("call_count"))
            .outerjoin(Call, Call.trajectory_id == Trajectory.id)
            .where(Trajectory.group_id == group_id)
            .group_by(Trajectory.pk)
            .order_by(Trajectory.pk)
        )
    ).all()
    state = group_state(row.closed_at, row.claimed_by, row.trained_at)
    # A member marked before it joined holds the group out too (store/training.py).
    held_out = row.eval or any(m.eval for m in members)
    why = None
    if state == GroupState.CLOSED:
        rewards = [m.reward for m in members if m.reward is not None]
        is_credited = bool(conn.execute(select(credited(literal(group_id)))).scalar())
        rules = training_rules(conn, row.policy) if row.policy is not None else Training(None, Objective())
        why = cannot_train(
            size=len(members),
            rewarded=len(rewards),
            low=min(rewards, default=None),
            high=max(rewards, default=None),
            credited=is_credited,
            held_out=held_out,
            objective=rules.objective,
            demonstration=row.close_reason == DEMONSTRATION,
            lone=rules.lone,
            expired=row.close_reason == EXPIRED,
            followed=row.close_reason == FOLLOWED and rules.followed,
        )
    return GroupView(
        id=local(row.id),
        expected_size=row.expected_size,
        created_at=iso(row.created_at),
        state=state.value,
        eval=held_out,
        closed_at=iso(row.closed_at),
        close_reason=row.close_reason,
        ruler_at=iso(row.ruler_at),
        ruler_error=row.ruler_error,
        size=len(members),
        rewarded=sum(1 for m in members if m.reward is not None),
        members=[trajectory_view(m, m.call_count) for m in members],
        cannot_train=why,
    )


def list_trajectories(conn: Connection, filters: Filters, keyset: Keyset) -> TrajectoryPage | None:
    """One page, OpenAI list style (the listing the dashboard shows too); None if ``keyset.after`` names no trajectory."""
    page = listing.trajectories(conn, filters, keyset)
    if page is None:
        return None
    data = [trajectory_view(row, row.calls) for row in page.rows]
    return TrajectoryPage(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=page.has_more)


async def export_jsonl(engine: AsyncEngine, filters: Filters, *, flush_bytes: int = 64 * 1024) -> AsyncIterator[bytes]:
    """Trajectories as JSON lines, oldest first, each with its calls.

    Memory stays bounded by one page of trajectory rows and one flush buffer: calls
    are streamed from a server-side cursor and each line is written piece by piece,
    so even a trajectory with a million calls is never held whole.
    """
    last_pk = 0
    buffer = bytearray()
    while True:
        async with engine.connect() as conn:
            trajectories = select(Trajectory)
            if filters.state is not None:  # its group's state: the only filter that reads the group's columns
                trajectories = trajectories.outerjoin(Group, Group.id == Trajectory.group_id)
            page = (await conn.execute(narrowed(trajectories, filters).where(Trajectory.pk > last_pk).order_by(Trajectory.pk).limit(EXPORT_PAGE))).all()
            if not page:
                break
            last_pk = page[-1].pk
            order = {r.id: i for i, r in enumerate(page)}
            grouped = {r.group_id for r in page if r.group_id is not None}
            policies = dict((await conn.execute(select(Group.id, Group.policy).where(Group.id.in_(grouped)))).all()) if grouped else {}
            posted = select(Reward.call_pk, Reward.reward).where(Reward.trajectory_id.in_(list(order)), Reward.call_pk.is_not(None)).order_by(Reward.pk)
            call_rewards = {pk: reward for pk, reward in await conn.execute(posted)}  # the newest wins
            calls = await conn.stream(
                select(Call)
                .join(Trajectory, Trajectory.id == Call.trajectory_id)
                .where(Call.trajectory_id.in_(list(order)))
                .order_by(Trajectory.pk, *_CALLS_IN_ORDER)
            )
            current = -1  # index in `page` of the trajectory whose line is open
            first_call = True
            merging = Merging(None)  # over the open trajectory's calls so far
            async for call in calls:
                index = order[call.trajectory_id]
                while current < index:  # close the open line, open the next (trajectories without calls included)
                    if current >= 0:
                        buffer += b"]}\n"
                    current += 1
                    head = _encode(trajectory_view(page[current]))
                    buffer += head[:-1] + b',"calls":['
                    first_call = True
                    merging = Merging(policies.get(page[current].group_id))
                if not first_call:
                    buffer += b","
                buffer += _encode(call_view(call, merging, call_rewards.get(call.pk)))
                first_call = False
                if len(buffer) >= flush_bytes:
                    yield bytes(buffer)
                    buffer.clear()
            while current < len(page) - 1:
                if current >= 0:
                    buffer += b"]}\n"
                current += 1
                buffer += _encode(trajectory_view(page[current]))[:-1] + b',"calls":['
            buffer += b"]}\n"
        if len(page) < EXPORT_PAGE:
            break
    if buffer:
        yield bytes(buffer)
