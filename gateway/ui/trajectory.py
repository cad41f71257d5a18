"""A trajectory as the dashboard shows it: one conversation, call by call, and for each policy
call what training makes of it.

The conversation is read from each call's recorded bodies on its own surface
(``core/protocols/transcript.py``): chat messages, a completion's prompt, Responses items and Messages
blocks all become messages, tool calls and tool results included. A call whose prompt
repeats the conversation so far adds only what is new; one that does not (the agent rewrote
its history) shows its whole prompt, marked.

For a call the trainer reads (an ok call of the group's policy, with token ids), the figures
are the trainer's own (``core/learning/credit.py``): the trajectory's group-relative advantage from
its group's rewards as they stand, plus the call's credit per turn; the tokens the loss sees
(the mask: sampled, and not forced by a grammar); whether the call merged with the one
before or split, and why (``store/reads.py``, the trainer's rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from burnish_server.core.api.views import CallView, TrajectoryView
from burnish_server.core.learning.credit import group_advantages, trained_mask, turn_credits
from burnish_server.core.learning.groups import GroupState
from burnish_server.core.learning.policies import Policy
from burnish_server.core.protocols.records import OK
from burnish_server.core.protocols.transcript import Message, UnreadableCall, read_bodies


@dataclass(frozen=True)
class Token:
    id: int
    logprob: float | None
    trained: bool

    @property
    def probability(self) -> float | None:
        return None if self.logprob is None else math.exp(max(self.logprob, -50.0))


@dataclass
class Panel:
    """One call of the trajectory."""

    index: int
    call: CallView
    prompt: list[Message] = field(default_factory=list)  # what is new in its prompt
    rewritten: bool = False  # its prompt does not repeat the conversation so far: all of it is shown
    answers: list[Message] = field(default_factory=list)  # one per choice
    unreadable: str | None = None
    trains: bool = False  # the trainer reads this call
    training: str = ""  # what training makes of it, in words
    credit: float = 0.0
    advantage: float | None = None  # per sampled token: the trajectory's advantage + this call's credit
    choices: list[list[Token]] = field(default_factory=list)  # each choice's sampled tokens

    @property
    def merge(self) -> str:
        if self.call.extends_previous is None:
            return ""
        if self.call.extends_previous:
            return "merged: its prompt extends the sequence so far"
        return f"split: a new sequence starts here ({self.call.split_reason or 'first call'})"


@dataclass
class Group:
    """What the trajectory's advantage is computed from."""

    id: str
    state: GroupState
    trained_step: int | None
    policy: str | None
    rewards: list[tuple[str, float | None]]  # members in order (local ids)


def advantage_of(trajectory_id: str, group: Group, policy: Policy | None) -> float | None:
    """The trajectory's group-relative advantage, or None while a member has no reward."""
    rewards = [r for _, r in group.rewards]
    if not rewards or any(r is None for r in rewards):
        return None
    train = policy.train if policy is not None else None
    advantages = group_advantages(
        [float(r) for r in rewards if r is not None],
        scale=train.scale_advantages if train else True,
        eps=train.advantage_eps if train else 1e-4,
    )
    ids = [i for i, _ in group.rewards]
    return advantages[ids.index(trajectory_id)] if trajectory_id in ids else None


def panels(trajectory: TrajectoryView, group: Group | None, policy: Policy | None) -> list[Panel]:
    calls = trajectory.calls if isinstance(trajectory.calls, list) else []
    policy_name = group.policy if group is not None and group.policy is not None else next((c.policy for c in calls if c.policy), None)
    read_calls = [c for c in calls if c.status == OK and c.policy is not None and c.policy == policy_name]
    discount = policy.train.turn_discount if policy is not None else 1.0
    credits = dict(zip((c.id for c in read_calls), turn_credits([c.reward for c in read_calls], discount)))
    base = advantage_of(trajectory.id, group, policy) if group is not None else None
    seen: list[Message] = []
    out = []
    for index, call in enumerate(calls):
        panel = Panel(index, call)
        try:
            turn = read_bodies(call.endpoint, bytes(call.request), bytes(call.response) if call.response is not None else None)
        except UnreadableCall as exc:
            panel.unreadable = str(exc)
        else:
            if turn.prompt[: len(seen)] == seen:
                panel.prompt = turn.prompt[len(seen) :]
            else:
                panel.prompt, panel.rewritten = turn.prompt, bool(seen)
            panel.answers = turn.answers
            seen = turn.prompt + turn.answers[:1]
        panel.training = _training(trajectory, call, policy_name, group)
        panel.trains = call.id in credits and call.extends_previous is not None and group is not None and not trajectory.eval
        panel.credit = credits.get(call.id, 0.0)
        panel.advantage = None if base is None or not panel.trains else base + panel.credit
        if call.tokens is not None and call.tokens.completion_token_ids is not None:
            logprobs = call.tokens.completion_logprobs
            for choice, ids in enumerate(call.tokens.completion_token_ids):
                recorded = logprobs[choice] if logprobs is not None and choice < len(logprobs) else None
                mask = trained_mask(len(ids), recorded) if panel.trains and not trajectory.eval else [0] * len(ids)
                panel.choices.append([Token(i, recorded[n] if recorded else None, bool(mask[n])) for n, i in enumerate(ids)])
        out.append(panel)
    return out


def _training(trajectory: TrajectoryView, call: CallView, policy: str | None, group: Group | None) -> str:
    """What training makes of ``call``, in words."""
    if call.status != OK:
        return f"not trained: the call ended {call.status}"
    if call.policy is None:
        return f"not trained: {call.model or 'its model'} is no policy"
    if call.policy != policy:
        return f"not trained: answered by {call.policy}, and this trajectory trains {policy}"
    if call.tokens is None or call.tokens.prompt_token_ids is None or call.tokens.completion_token_ids is None:
        return "not trained: recorded without token ids (counted as untokenized_calls)"
    if trajectory.eval:
        return "held out for evaluation: scored, never trained on"
    if group is None:
        return "not trained: a trajectory outside any group has nothing to be compared with"
    if group.state is GroupState.TRAINED:
        return f"trained in step {group.trained_step}"
    if group.state is GroupState.TRAINING:
        return "in the step being trained now"
    if group.state is GroupState.CLOSED:
        return "waiting: its group is closed and trains when ready (rewards not all equal)"
    return "waiting: its group is open (not every member rewarded)"
