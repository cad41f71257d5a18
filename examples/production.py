"""Traffic as it comes: does a policy learn from lone calls whose verdicts come late or never?

    python examples/production.py --mode lone --minutes 20      # starts `burnish up` (SmolLM2, CPU), runs, stops it
    python examples/production.py --mode grouped --minutes 20   # the demo's harness, for the same figures side by side
    python examples/production.py --gateway http://127.0.0.1:8080 --admin-token ...   # against one already up

The demo's task (examples/arithmetic.py: "What is 13 + 14? Reply with only the number.", its
train/held-out split and its rewards), or with ``--task`` a reasoning-gym task (its generator's
settings as ``--set key=value``; the task's own score is the reward, and a correction gives the
generator's answer), played three ways:

- ``lone`` (production traffic): ``--users`` simulated users, each sending one request at a
  time for a random train sum with the plain ``openai`` client on the gateway's ``/v1``, no
  trajectory or group ids: every call is a one-call trajectory whose id comes back in the
  ``X-Trajectory-Id`` header. For ``--verdict-share`` of the answers the user posts the
  shaped train reward after a random delay of up to ``--late-max-s`` seconds, without waiting
  for it before the next request; the other answers never get a verdict.
- ``next`` (the user's next message the only signal): as ``lone``, but no verdict is ever
  posted; each user answers the answer with a next message, "Thanks." where it is right and
  brief, else a correction that states what was wanted ("No, 13 + 14 is 27. Reply with only
  the number."), sent as the next request of the conversation (again with no ids). ``--signal``
  sets what the policy learns from it: ``hint``, the teacher shown what followed
  (``train.teacher.hindsight``, distilled); ``judge``, the next-message judge's score as the
  reward (``ruler.next_message``); ``both``.
- ``grouped`` (today's harness): the SDK's task runner as the demo runs it: rounds of
  ``--groups`` groups of ``--size`` answers to one sum each, every answer rewarded at once,
  each round waiting for the trainer's next version. The runner's clock leaves its held-out
  evaluations out, so this mode runs a little longer in wall time.

Both modes evaluate as the demo does (the runner's ``evaluate``: the 64 held-out sums answered
greedily by the served version, pinned as ``agent@<step>`` and marked for evaluation, so never
trained on) before any traffic, about every ``--eval-every-s`` seconds, and at the end. Each
evaluation prints a line: minutes since traffic began, the step, the held-out score (``right``)
and ``exact``, and the share of the most common reply with the number of distinct replies, so
that a collapse onto one answer shows. The summary (calls sent, rewards posted, rewards never
sent, training steps made, held-out before -> after) is printed and written to ``--out`` as one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import openai
from arithmetic import SUMS  # noqa: I001  (examples/ is run as a folder of scripts)
from digits import burnish_running, gateway_arguments

from burnish import AsyncClient, BurnishError, Score
from burnish.tasks import Chat, Schedule, evaluate, train
from burnish.tasks.runner import MAX_TOKENS, TEMPERATURE

REPLY_CHARS = 24  # of the most common held-out reply, shown on each evaluation line


@dataclass
class Traffic:
    """What the agents sent: calls, the verdicts posted and withheld, the train rewards earned."""

    calls: int = 0
    call_errors: int = 0
    rewards_posted: int = 0
    rewards_never_sent: int = 0
    reward_errors: int = 0
    rewards: list[float] = field(default_factory=list)  # every answer's shaped reward, posted or not
    versions: Counter[str] = field(default_factory=Counter)  # X-Policy-Version of each call

    def line(self) -> str:
        return f"calls {self.calls}, rewards posted {self.rewards_posted}, never sent {self.rewards_never_sent}"


@dataclass(frozen=True)
class HeldOut:
    """One held-out evaluation: the version, its score, and how varied its 64 replies were."""

    minutes: float  # since traffic began, when the evaluation began
    step: int
    right: float  # the held-out score
    exact: float
    top_share: float  # the share of the most common reply
    top_reply: str
    distinct: int
    train_reward: float | None  # the mean shaped reward of the answers since the last evaluation


class Watched:
    """The demo's task as the runner plays it, watched: every held-out reply is kept (the
    runner's ``evaluate`` keeps only the first 8) and each complete evaluation is printed;
    train episodes are counted as traffic (grouped mode)."""

    def __init__(self, task: Any, traffic: Traffic) -> None:
        self.task, self.name, self.traffic = task, task.name, traffic
        self.held_out = len(task.split()[1])
        self.evals: list[HeldOut] = []
        self.started: float | None = None  # when traffic began: after the first evaluation
        self._began: float | None = None  # when the evaluation under way began
        self._replies: list[tuple[str, str, Score]] = []  # (model, reply, score) of that evaluation
        self._rewards_seen = 0

    def split(self) -> tuple[list, list]:
        return self.task.split()

    async def play(self, chat: Chat, problem: Any) -> Score:
        if not chat.held_out:
            score = await self.task.play(chat, problem)
            self.traffic.calls += 1
            self.traffic.rewards_posted += 1  # the runner posts every train episode's score
            self.traffic.rewards.append(score.reward)
            self.traffic.versions[chat.versions[-1] if chat.versions else ""] += 1
            return score
        if self._began is None:
            self._began = time.monotonic()
        score = await self.task.play(chat, problem)
        self._replies.append((chat.model, chat.replies[-1] if chat.replies else "", score))
        if len(self._replies) == self.held_out:
            self._close()
        return score

    def minutes(self, at: float | None = None) -> float:
        return 0.0 if self.started is None else max((at or time.monotonic()) - self.started, 0.0) / 60

    def _close(self) -> None:
        replies, self._replies = self._replies, []
        began, self._began = self._began, None
        if self.started is None:
            self.started = time.monotonic()
        (top, count), *_ = Counter(text.strip() for _, text, _ in replies).most_common(1)
        recent = self.traffic.rewards[self._rewards_seen :]
        self._rewards_seen = len(self.traffic.rewards)
        held = HeldOut(
            minutes=round(self.minutes(began), 2),
            step=int(replies[0][0].rpartition("@")[2]),
            right=sum(s.reward for _, _, s in replies) / len(replies),
            exact=sum(s.components.get("exact", 0.0) for _, _, s in replies) / len(replies),
            top_share=count / len(replies),
            top_reply=top,
            distinct=len({text.strip() for _, text, _ in replies}),
            train_reward=sum(recent) / len(recent) if recent else None,
        )
        self.evals.append(held)
        reward = "  -  " if held.train_reward is None else f"{held.train_reward:.3f}"
        print(
            f"eval {held.minutes:5.1f} min  step {held.step:3d}  held-out right {held.right:.3f} exact {held.exact:.3f}  "
            f"top reply {held.top_share:4.0%} {json.dumps(top[:REPLY_CHARS])}  distinct {held.distinct:2d}/{len(replies)}  "
            f"train reward {reward}  ({self.traffic.line()})",
            flush=True,
        )


# ---- lone: production traffic -------------------------------------------------------


async def late_reward(client: AsyncClient, trajectory: str, reward: float, delay: float, traffic: Traffic) -> None:
    """A verdict that arrives ``delay`` seconds after its answer."""
    await asyncio.sleep(delay)
    try:
        await client.reward(trajectory, reward)
        traffic.rewards_posted += 1
    except (BurnishError, httpx.HTTPError) as exc:
        traffic.reward_errors += 1
        print(f"  reward for {trajectory} failed: {exc}", flush=True)


@dataclass(frozen=True)
class Asked:
    """A one-turn task as traffic asks it: the environment the runner plays (held out, and
    grouped mode), and what lone traffic needs of it besides: a question's messages, an
    answer's train reward, and what the user says next."""

    env: Any  # burnish.tasks' Environment: split() and play()
    messages: Callable[[Any], list[dict[str, str]]]
    reward: Callable[[str, Any], float]
    reply: Callable[[str, Any], str]
    temperature: float = TEMPERATURE
    max_tokens: int = MAX_TOKENS

    async def once(self, agent: openai.AsyncOpenAI, client: AsyncClient, policy: str, problem: Any, seed: int, reply: bool) -> Once:
        return await one_turn(self, agent, policy, problem, reply)


class Once(NamedTuple):
    """One request as a user makes it (and, in ``next`` mode, their next turn after it)."""

    trajectory: str  # the attempt's id (X-Trajectory-Id), where its verdict is posted
    reward: float  # the train reward it earned, posted or not
    calls: int
    version: str  # X-Policy-Version of its first call


async def one_turn(task: Asked, agent: openai.AsyncOpenAI, policy: str, problem: Any, reply: bool) -> Once:
    """A one-turn task's question, sent with no ids: a lone attempt, its id from the answer's header."""
    question = task.messages(problem)
    raw = await agent.chat.completions.with_raw_response.create(model=policy, messages=question, temperature=task.temperature, max_tokens=task.max_tokens)
    text = raw.parse().choices[0].message.content or ""
    calls = 1
    if reply:
        turns = [*question, {"role": "assistant", "content": text}, {"role": "user", "content": task.reply(text, problem)}]
        await agent.chat.completions.create(model=policy, messages=turns, temperature=task.temperature, max_tokens=task.max_tokens)
        calls += 1
    return Once(raw.headers["x-trajectory-id"], task.reward(text, problem), calls, raw.headers.get("x-policy-version", ""))


@dataclass(frozen=True)
class ToolAgent:
    """examples/lookup_agent.py's agent (the OpenAI Agents SDK, a lookup tool, two turns) as
    traffic. A verdict is for the whole episode, so the agent sends one trajectory id for it
    (a lone attempt of two calls, no group); with the next turn as the only signal it sends no
    ids, as most agents do: each call is a lone attempt, the first followed by the tool's
    result, the second by the user's next turn."""

    env: Any  # lookup_agent.LookupTask
    temperature: float
    max_tokens: int

    async def once(self, agent: openai.AsyncOpenAI, client: AsyncClient, policy: str, problem: Any, seed: int, reply: bool) -> Once:
        from lookup_agent import episode, next_turn

        q = self.env.question(problem)
        if reply:
            played = await episode(agent, q, model=policy, temperature=self.temperature, seed=seed, then=next_turn)
            return Once("", played.reward, 3, "")
        trajectory = client.trajectory()
        played = await episode(trajectory.async_openai(max_retries=0), q, model=policy, temperature=self.temperature, seed=seed)
        return Once(trajectory.id, played.reward, 2, "")


def asked(task: str, settings: Sequence[str]) -> Asked | ToolAgent:
    """``sums`` (the demo's task), ``lookup`` (a tool agent), or a reasoning-gym task with its
    generator's settings (``key=value``)."""
    if task == "lookup":
        import lookup_agent

        return ToolAgent(lookup_agent.LookupTask(), lookup_agent.TEMPERATURE, lookup_agent.MAX_TOKENS)
    if task == "sums":
        return Asked(SUMS, lambda p: [{"role": "user", "content": SUMS.prompt(p)}], SUMS.shaped, next_message, SUMS.temperature, SUMS.max_tokens)
    from burnish.tasks.reasoning_gym import INSTRUCTION, ReasoningGym

    env = ReasoningGym(task, {k: json.loads(v) for k, _, v in (item.partition("=") for item in settings)})

    def reply(text: str, entry: Any) -> str:
        return "Thanks." if env.score(text, entry) >= 1.0 else f"No, the answer is {entry['answer']}. {INSTRUCTION}"

    return Asked(env, env.messages, env.score, reply)


def next_message(text: str, problem: tuple[int, int]) -> str:
    """What a user says after a sum's answer: thanks where it is what was asked, else what was wanted."""
    a, b = problem
    if SUMS.exact(text, problem):
        return "Thanks."
    if SUMS.right(text, problem):
        return f"Right, but reply with only the number: {a + b}"
    return f"No, {a} + {b} is {a + b}. Reply with only the number."


async def user(
    n: int, agent: openai.AsyncOpenAI, client: AsyncClient, args: argparse.Namespace, deadline: float, traffic: Traffic, pending: set[asyncio.Task[None]]
) -> None:
    """One user until ``deadline``: a train problem at a time, its verdict posted late or never
    (or, in ``next`` mode, never, and the user's next message sent instead)."""
    rng = random.Random(args.seed * 1000 + n)
    task = args.asked
    train_problems = task.env.split()[0]
    while time.monotonic() < deadline:
        problem = train_problems[rng.randrange(len(train_problems))]
        try:
            played = await task.once(agent, client, args.policy, problem, rng.randrange(1 << 30), args.mode == "next")
        except (openai.APIError, BurnishError, httpx.HTTPError) as exc:
            traffic.call_errors += 1
            print(f"  user {n}: call failed: {exc}", flush=True)
            await asyncio.sleep(1.0)
            continue
        traffic.calls += played.calls
        traffic.versions[played.version] += 1
        traffic.rewards.append(played.reward)
        if args.mode != "next" and rng.random() < args.verdict_share:
            verdict = asyncio.create_task(late_reward(client, played.trajectory, played.reward, rng.uniform(0, args.late_max_s), traffic))
            pending.add(verdict)
            verdict.add_done_callback(pending.discard)
        else:
            traffic.rewards_never_sent += 1
        if args.think_s > 0:
            await asyncio.sleep(args.think_s)


async def lone(client: AsyncClient, args: argparse.Namespace, watched: Watched) -> None:
    """Users sending lone calls for ``--minutes``, the held-out set evaluated on a wall clock."""
    held_out = args.asked.env.split()[1]
    schedule = Schedule(rounds=0, max_tokens=args.asked.max_tokens)  # evaluate's settings: the task's max_tokens

    async def held_out_now() -> None:  # the newest served version, pinned
        await evaluate(client, watched, held_out, args.policy, (await client.status(args.policy))["step"], schedule)

    await held_out_now()  # before any traffic
    total, every = args.minutes * 60, args.eval_every_s
    deadline = time.monotonic() + total
    pending: set[asyncio.Task[None]] = set()
    agent = openai.AsyncOpenAI(base_url=f"{args.gateway.rstrip('/')}/v1", api_key=args.api_key or "burnish", max_retries=0)
    try:
        users = [asyncio.create_task(user(n, agent, client, args, deadline, watched.traffic, pending)) for n in range(args.users)]
        mark = every
        while True:
            await asyncio.sleep(max(min(mark, total) - watched.minutes() * 60, 0))
            if watched.minutes() * 60 >= total:
                break
            await held_out_now()
            while mark <= watched.minutes() * 60:
                mark += every
        await asyncio.gather(*users)  # each finishes the call it has under way
        # The version served when traffic stopped, while the verdicts still due arrive.
        await asyncio.gather(held_out_now(), *list(pending))
    finally:
        await agent.close()


# ---- grouped: today's harness -------------------------------------------------------


async def grouped(client: AsyncClient, args: argparse.Namespace, watched: Watched) -> None:
    """The demo's loop (the SDK's runner) for ``--minutes``, held out every ``--eval-every-s``."""
    schedule = Schedule(
        minutes=args.minutes,
        eval_minutes=args.eval_every_s / 60,
        groups=args.groups,
        size=args.size,
        temperature=args.asked.temperature,
        max_tokens=args.asked.max_tokens,
    )

    def log(text: str) -> None:  # the runner's own lines, told apart from this script's
        print("\n".join(f"  runner | {line}" for line in text.splitlines()), flush=True)

    await train(client, watched, args.policy, schedule, plot=args.plot, log=log)


# ---- the run ------------------------------------------------------------------------


def summary(args: argparse.Namespace, traffic: Traffic, evals: Sequence[HeldOut], head_before: int, status: dict[str, Any], seconds: float) -> dict[str, Any]:
    before, after = evals[0], evals[-1]
    return {
        "mode": args.mode,
        "task": args.task,
        "task_settings": args.set,
        "minutes": args.minutes,
        "signal": args.signal if args.mode == "next" else None,
        "lone_baseline": args.lone_baseline,
        "users": args.users if args.mode != "grouped" else None,
        "verdict_share": {"lone": args.verdict_share, "next": 0.0}.get(args.mode, 1.0),
        "late_max_s": args.late_max_s if args.mode == "lone" else 0.0,
        "calls": traffic.calls,
        "call_errors": traffic.call_errors,
        "rewards_posted": traffic.rewards_posted,
        "rewards_never_sent": traffic.rewards_never_sent,
        "reward_errors": traffic.reward_errors,
        "train_reward": round(sum(traffic.rewards) / len(traffic.rewards), 4) if traffic.rewards else None,
        "steps": status["head"] - head_before,
        "served_step": status["step"],
        "held_out_before": before.right,
        "held_out_after": after.right,
        "gain": round(after.right - before.right, 4),
        "collapsed_after": {"top_share": after.top_share, "top_reply": after.top_reply, "distinct": after.distinct},
        "calls_by_version": dict(sorted(traffic.versions.items())),
        "evals": [asdict(e) for e in evals],
        "wall_s": round(seconds),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    async with AsyncClient(args.gateway, api_key=args.api_key, admin_token=args.admin_token) as client:
        head_before = (await client.status(args.policy))["head"]
        if args.mode == "next":  # what the policy learns from the next message (docs/production.md)
            await client.update_policy(args.policy, **SIGNALS[args.signal])
        if args.lone_baseline is not None:
            await client.update_policy(args.policy, train={"lone_baseline": args.lone_baseline})
        watched = Watched(args.asked.env, Traffic())
        await (grouped if args.mode == "grouped" else lone)(client, args, watched)
        status = await client.status(args.policy)  # GET /admin/policies/<policy>
    return summary(args, watched.traffic, watched.evals, head_before, status, time.monotonic() - started)


# The policy settings each --signal sets (PATCH /admin/policies/<policy>).
HINT = {"train": {"objective": {"grpo": 1, "distill": 1}, "teacher": {"hindsight": True}}}
JUDGE = {"ruler": {"next_message": True}}
SIGNALS: dict[str, dict[str, Any]] = {"hint": HINT, "judge": JUDGE, "both": {**HINT, **JUDGE}}


FLAG_HELP = {  # for the flags digits.gateway_arguments adds without a help text
    "admin_token": "the gateway's admin token (default: $BURNISH_ADMIN_TOKEN, or the one `burnish up` wrote)",
    "port": "the port of the `burnish up` this starts",
    "plot": "grouped mode: the runner's plot of train reward and held-out score (PNG); default: none",
}


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gateway_arguments(parser, plot="")
    parser.set_defaults(plot=None)
    for action in parser._actions:  # argparse keeps no public list of them
        action.help = action.help or FLAG_HELP.get(action.dest)
    parser.add_argument("--api-key", help="the API key the agents send, where the gateway has keys (default: none)")
    parser.add_argument("--policy", default="agent", help="the policy the agents call (default: agent)")
    parser.add_argument("--task", default="sums", help="sums (the demo's), lookup (a tool agent), or a reasoning-gym task by name (default: sums)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a reasoning-gym task's generator setting, VALUE as JSON (repeatable)")
    parser.add_argument(
        "--mode",
        choices=("lone", "next", "grouped"),
        default="lone",
        help="lone: production traffic with late verdicts; next: the user's next message the only signal; grouped: the demo's runner (default: lone)",
    )
    parser.add_argument("--signal", choices=tuple(SIGNALS), default="hint", help="next: what the policy learns from the next message (default: hint)")
    parser.add_argument("--lone-baseline", choices=("kept", "step"), help="the policy's train.lone_baseline for the run (default: as the policy has it)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=20.0,
        help="minutes of traffic after the first evaluation (grouped: on the runner's clock, evaluations left out; default: 20)",
    )
    parser.add_argument("--eval-every-s", type=float, default=240.0, help="seconds between held-out evaluations of the served version (default: 240)")
    parser.add_argument("--users", type=int, default=8, help="lone: concurrent users, one request each at a time (default: 8)")
    parser.add_argument("--verdict-share", type=float, default=0.75, help="lone: the share of answers whose reward is ever posted (default: 0.75)")
    parser.add_argument("--late-max-s", type=float, default=30.0, help="lone: a reward is posted 0 to this many seconds after its answer (default: 30)")
    parser.add_argument("--think-s", type=float, default=0.0, help="lone: seconds a user waits between its requests (default: 0; 8 users suit 2 cores)")
    parser.add_argument("--seed", type=int, default=0, help="lone: the seed of the users' sums, verdicts and delays (default: 0)")
    parser.add_argument("--groups", type=int, default=4, help="grouped: groups a round (default: 4)")
    parser.add_argument("--size", type=int, default=8, help="grouped: answers a group (default: 8)")
    parser.add_argument(
        "--out", type=Path, default=Path("production.json"), help="the file the summary is appended to, one JSON line a run (default: production.json)"
    )
    return parser


def main() -> None:
    args = arguments().parse_args()
    args.asked = asked(args.task, args.set)
    with burnish_running(args, model="smollm2"):
        result = asyncio.run(run(args))
    before, after = result["evals"][0], result["evals"][-1]
    print(
        f"{args.mode}: {result['calls']} calls, {result['rewards_posted']} rewards posted, {result['rewards_never_sent']} never sent, "
        f"{result['call_errors']} calls and {result['reward_errors']} rewards failed; {result['steps']} training steps; "
        f"held-out {args.policy}@{before['step']} {before['right']:.3f} -> {args.policy}@{after['step']} {after['right']:.3f} "
        f"(gain {result['gain']:+.3f}) in {result['wall_s']}s; summary in {args.out}",
        flush=True,
    )
    with args.out.open("a") as out:
        out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
