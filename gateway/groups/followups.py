"""What followed a lone attempt's answer, as its signal: judged into a reward (``ruler.next_message``),
or shown to the teacher (``train.teacher.hindsight``).

Every few seconds, for the policies that turn it on, the gateway reads the calls recorded since
its last look and pairs each answer with the request that continues it (core/learning/followups.py:
the next request repeats the answer and adds the user's reply or a tool's result). When the
answer is a lone attempt still waiting for its reward (a call sent with no trajectory id), the
policy's judge, shown what followed, is asked whether the user is happy (after a tool's result:
whether it worked);
P(yes) becomes the attempt's reward (source ``next_message``, with the judge's figures as its
explanation), which closes its group, and it trains like any rewarded lone attempt. A reward the
user posts first wins: the judge leaves a closed group alone. For a policy whose teacher has
hindsight, what followed is kept on the attempt (``trajectories.followed``) and, with no reward
by then, its group closes (close_reason "followed"): the teacher, shown it, distills the answer
(trainer/teacher.py). Only an answer another request continues is paired: calls of one
trajectory (an agent that sends its ids) are judged as a whole, by the reward posted for it.

The judge is the policy's RULER judge (``ruler.judge_model``, ``ruler.judge_base_url``; by default
its base model on the gateway's upstream: nothing beyond what ``burnish up`` serves), asked for
one token with its logprobs. An answer it cannot be read from (neither yes nor no among its
likeliest tokens, or an endpoint that returns no logprobs) is no reward: the group says why
(``ruler_error``) and the policy's status counts it.

Answers wait in memory for their follow-up (``MAX_WAITING`` of them, the oldest dropped first),
paired only within a project; a gateway that restarts looks back ``LOOK_BACK`` calls, and each
look reads again the last ``OVERLAP`` keys before where it stopped (on PostgreSQL a call may
commit after one with a later key). Several gateways each read every call; the store's claim
(store/followups.py) has one of them judge each answer. Calls are read in a thread, off the
gateway's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from burnish_server.core.learning.followups import SOURCE, answered_key, asked_key, judge_messages, judged_score
from burnish_server.core.learning.policies import Policy
from burnish_server.core.platform.access import project_of
from burnish_server.core.platform.errors import BurnishError, Conflict, Unavailable
from burnish_server.core.protocols.conversation import Message
from burnish_server.core.protocols.transcript import UnreadableCall, exchange
from burnish_server.gateway.groups.ruler import Judge
from burnish_server.gateway.groups.scoring import RulerIn, policy_judge
from burnish_server.gateway.services import Services
from burnish_server.store import followups as store
from burnish_server.store.writes import PostReward

log = logging.getLogger("burnish.followups")

EVERY_S = 2.0
MAX_WAITING = 20_000
LOOK_BACK = 2_000
OVERLAP = 200
# Answers judged at once (each a short request to the judge).
CONCURRENCY = 4
# The judge's likeliest first tokens read (OpenAI's API gives at most 20).
TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Answer:
    """A lone attempt's answer, waiting for what follows it; with ``followed``, what did."""

    policy: str
    trajectory_id: str
    followed: tuple[Message, ...] = ()


class JudgeUnreadable(Unavailable):
    """The next-message judge answered without a yes or a no, or without logprobs, or not at all."""

    default_code = "judge_output_invalid"


class _Retry(Unavailable):
    pass


async def ask_judge(http: httpx.AsyncClient, judge: Judge, messages: list[dict[str, str]]) -> tuple[float, str]:
    """P(yes) from the judge's first token, and the figures behind it (kept as the reward's explanation)."""
    body = {"model": judge.model, "messages": messages, "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    headers = {"authorization": f"Bearer {judge.api_key}"} if judge.api_key else {}
    url = judge.base_url.rstrip("/") + "/chat/completions"
    retrying = AsyncRetrying(
        stop=stop_after_attempt(judge.attempts), wait=wait_exponential(multiplier=0.2, max=5), retry=retry_if_exception_type(_Retry), reraise=True
    )
    try:
        async for attempt in retrying:
            with attempt:
                try:
                    answer = await http.post(url, json=body, headers=headers, timeout=judge.timeout_s)
                except httpx.TransportError as exc:
                    raise _Retry(f"the judge ({judge.name}) could not be reached ({type(exc).__name__})") from None
                if answer.status_code in (408, 429) or answer.status_code >= 500:
                    raise _Retry(f"the judge ({judge.name}) answered HTTP {answer.status_code}")
    except _Retry as exc:
        raise JudgeUnreadable(exc.message) from None
    if answer.status_code != 200:
        raise JudgeUnreadable(f"the judge ({judge.name}) refused the request: HTTP {answer.status_code}")
    try:
        first = answer.json()["choices"][0]["logprobs"]["content"][0]
        top = [(t["token"], float(t["logprob"])) for t in first["top_logprobs"]] or [(first["token"], float(first["logprob"]))]
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeUnreadable(f"the judge ({judge.name}) answered without logprobs: it must return top_logprobs") from None
    score = judged_score(top)
    if score is None:
        raise JudgeUnreadable(f"the judge ({judge.name}) answered neither yes nor no (its likeliest first tokens: {[t for t, _ in top[:5]]})")
    return score, f"P(yes) {score:.3f} from the judge's first token ({judge.name})"


class Followups:
    """The answers waiting for their follow-up, and where the next look starts."""

    def __init__(self) -> None:
        self.waiting: OrderedDict[tuple[str, str], Answer] = OrderedDict()  # by (project, key)
        self.cursor: int | None = None
        self.seen: OrderedDict[int, None] = OrderedDict()  # the keys of the calls read lately

    def see(self, call: store.Recorded) -> Answer | None:
        """Take in one recorded call: the earlier answer it follows up, if one waits; keep its own
        answer waiting, where it is a lone attempt's. A call read before is passed over."""
        if call.pk in self.seen:
            return None
        self.seen[call.pk] = None
        while len(self.seen) > OVERLAP * 4:
            self.seen.popitem(last=False)
        try:
            turn = exchange(call.call)
        except UnreadableCall:
            return None
        project, followed = project_of(call.call.trajectory_id), None
        if (asked := asked_key(turn)) is not None and (earlier := self.waiting.get((project, asked.key))) is not None:
            if earlier.trajectory_id != call.call.trajectory_id:
                del self.waiting[(project, asked.key)]
                followed = Answer(earlier.policy, earlier.trajectory_id, asked.followed)
        if call.lone and call.call.policy is not None and (key := answered_key(turn)) is not None:
            self.waiting[(project, key)] = Answer(call.call.policy, call.call.trajectory_id)
            while len(self.waiting) > MAX_WAITING:
                self.waiting.popitem(last=False)
        return followed

    def take(self, calls: list[store.Recorded]) -> list[Answer]:
        """A look's calls, in order: the answers they follow up."""
        found = []
        for call in calls:
            self.cursor = max(self.cursor or 0, call.pk)
            if (followed := self.see(call)) is not None:
                found.append(followed)
        return found


def watched(policy: Policy) -> bool:
    return policy.ruler.next_message or policy.train.hindsight


async def judge_followup(svc: Services, followed: Answer) -> None:
    """Claim one answer, keep what followed it for the teacher, and judge it into its reward."""
    policy = svc.policies.policies.get(followed.policy)
    if policy is None or not watched(policy):
        return
    group_id = followed.trajectory_id  # a lone attempt's group is named after it
    after = [m.chat() for m in followed.followed]
    if not await svc.db.transaction(store.claim_answer, followed.trajectory_id, policy.name):
        # Rewarded already (or another gateway has it): the teacher is still shown what followed,
        # so a step trains on both and says whether they agree (core/learning/health.py).
        if policy.train.hindsight:
            await svc.db.transaction(store.keep_followed_rewarded, followed.trajectory_id, policy.name, after)
        return
    if policy.train.hindsight:
        await svc.db.transaction(store.keep_followed, followed.trajectory_id, after)
    if policy.ruler.next_message:
        await judge_answer(svc, policy, followed, group_id)
    if policy.train.hindsight:  # no reward came first: the follow-up is its signal, and it is complete
        await svc.db.transaction(store.close_followed, group_id)


async def judge_answer(svc: Services, policy: Policy, followed: Answer, group_id: str) -> None:
    """The judge's P(yes) as the answer's reward; an unreadable verdict said on its group."""
    messages = judge_messages(followed.followed)
    try:
        judge = policy_judge(svc, policy.ruler, RulerIn(), policy.base_model, policy.name, group_id)
        score, why = await ask_judge(svc.judge_http, judge, messages)
    except BurnishError as exc:
        log.warning("next-message judge on %s of %s: %s", group_id, policy.name, exc.message)
        await svc.db.transaction(store.judge_failed, policy.name, group_id, exc.message)
        return
    with contextlib.suppress(Conflict):  # the user's own reward came first: it stands
        answer = await svc.writer.write(PostReward(followed.trajectory_id, score, {SOURCE: score}, source=SOURCE, explanation=why))
        if not answer["expired"]:  # a judge slower than the policy's group_idle_close_s: kept, not trained
            await svc.db.transaction(store.judged, policy.name)


async def watch_followups(svc: Services, every_s: float = EVERY_S) -> None:
    """Until cancelled: pair answers with what followed them, and judge those of policies that ask."""
    state = Followups()
    limit = asyncio.Semaphore(CONCURRENCY)

    async def judged(followed: Answer) -> None:
        async with limit:
            try:
                await judge_followup(svc, followed)
            except Exception:  # one answer's failure must not stop the others
                log.exception("judging %s by what followed it failed", followed.trajectory_id)

    while True:
        await asyncio.sleep(every_s)
        policies = [p.name for p in svc.policies.policies.values() if watched(p)]
        if not policies:
            continue
        try:
            if state.cursor is None:
                state.cursor = max(await svc.db.read(store.last_call) - LOOK_BACK, 0)
            calls = await svc.db.read(store.recorded_since, max(state.cursor - OVERLAP, 0), policies)
        except Exception as exc:  # the store away for a moment: look again next time
            log.warning("the next-message judge could not read the new calls: %s", exc)
            continue
        found = await asyncio.to_thread(state.take, calls)  # parsing bodies: off the event loop
        await asyncio.gather(*(judged(f) for f in found))
