"""The runner: a task suite played against a policy through the gateway, as any agent is.

Each round plays ``groups`` train problems, ``size`` sampled answers each, as one group per
problem (the SDK files each group's calls together); the suite's score is posted as each
member's reward, and the last reward closes the group, ready to train. The runner then waits
for the trainer's next version, so every round samples from the newest one. Before the first
round, and as the schedule says, the held-out problems are played greedily by the version
just served, pinned as ``<policy>@<step>`` and marked for evaluation: recorded and rewarded,
never trained on (``AsyncClient.run_held_out``). The gateway keeps that score per version.

The runner only sends calls, posts rewards and reads the policy's status: it never reaches
into the trainer. What it changes of training it changes through the admin API, as a user
would.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from burnish._api import Score, StepTimeout
from burnish.client import AsyncClient, AsyncTrajectory
from burnish.tasks.environment import Chat, Environment, Sampling, Teachable

# Answers sampled per problem: a group GRPO compares.
GROUP_SIZE = 8
# The train answers' temperature: at 1.0 a 135M model's answers are mostly noise.
TEMPERATURE = 0.7
# Tokens an answer may take, train and held out alike (a reply cut short scores as written).
MAX_TOKENS = 64
# Held-out episodes played at once (vLLM batches them).
EVAL_CONCURRENCY = 64
# Held-out replies an evaluation keeps (the first problems'): what a score is made of.
EVAL_REPLIES = 8
SHOWN_REPLIES, REPLY_CHARS = 3, 40  # of them, printed with each score
# How long to wait for the trainer's next version before reading where it stands.
STEP_WAIT = 600.0
# The teach lever: worked examples shown to the teacher, and the objective it sets.
WORKED_EXAMPLES = 3
TEACH_OBJECTIVE = {"grpo": 1.0, "distill": 1.0}


@dataclass(frozen=True)
class Schedule:
    """How long to train, when to evaluate, and how the train answers are sampled.

    The run ends after ``rounds`` rounds or ``minutes`` minutes of playing and training,
    whichever comes first (evaluation is not counted); held-out every ``eval_every`` rounds or
    ``eval_minutes`` minutes, and always before the first round and after the last."""

    rounds: int | None = None
    minutes: float | None = None
    eval_every: int | None = None
    eval_minutes: float | None = None
    groups: int | None = None  # groups a round; None: the policy's groups_per_step (one step a round)
    # Steps the runner may play ahead of the trainer: 0 waits for each round's step (every call
    # sampled by the newest version); N keeps sampling while the trainer catches up, as agents in
    # production do, so calls reach the trainer up to N versions stale.
    ahead: int = 0
    size: int = GROUP_SIZE
    temperature: float = TEMPERATURE
    max_tokens: int = MAX_TOKENS
    eval_concurrency: int = EVAL_CONCURRENCY

    def __post_init__(self) -> None:
        if self.rounds is None and self.minutes is None:
            raise ValueError("a schedule needs rounds or minutes")


@dataclass(frozen=True)
class Eval:
    """One held-out evaluation: after ``round`` rounds and ``minutes`` of training, the version
    ``step`` scored ``score`` (the mean reward), with each component's mean, and the first
    problems' replies with their scores (a rise may be the answer's form, not the answers)."""

    round: int
    minutes: float
    step: int
    score: float
    components: dict[str, float] = field(default_factory=dict)
    replies: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Curve:
    """What a run leaves: each round's mean train reward and each held-out evaluation."""

    task: str
    policy: str
    round_reward: list[float] = field(default_factory=list)
    evals: list[Eval] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


async def play_round(
    client: AsyncClient, env: Environment, problems: Sequence[Any], round_no: int, *, groups: int, policy: str, schedule: Schedule
) -> list[tuple[float, str]]:
    """``groups`` train problems, ``schedule.size`` episodes each: their rewards, and the version
    that answered each episode's last call."""
    size = schedule.size

    async def member(group: Any, problem: Any, i: int) -> tuple[float, str]:
        t = group.trajectory(f"{group.id}-{i}")
        chat = Chat(t.async_openai(max_retries=0), policy, Sampling(schedule.temperature, schedule.max_tokens, seed=round_no * 1000 + i))
        score = await env.play(chat, problem)
        await t.reward(score.reward, **score.components)  # the last member's reward closes the group: it is ready to train
        return score.reward, chat.versions[-1] if chat.versions else ""

    picked = [problems[(round_no * groups + g) % len(problems)] for g in range(groups)]
    sets = [(client.group(size=size, id=f"{env.name}-r{round_no}-g{g}-{os.getpid()}-{time.time_ns() % 10**9}"), p) for g, p in enumerate(picked)]
    return list(await asyncio.gather(*(member(group, problem, i) for group, problem in sets for i in range(size))))


async def evaluate(
    client: AsyncClient, env: Environment, held_out: Sequence[Any], policy: str, step: int, schedule: Schedule
) -> tuple[float, dict[str, float], list[tuple[str, float]]]:
    """The held-out problems played greedily by ``policy@step`` (pinned): the mean score, each
    component's mean, and the first ``EVAL_REPLIES`` problems' last replies with their scores."""
    kept: dict[int, tuple[str, float]] = {}

    async def agent(trajectory: AsyncTrajectory, model: str, numbered: tuple[int, Any]) -> Score:
        index, problem = numbered
        chat = Chat(trajectory.async_openai(max_retries=0), model, Sampling(0.0, schedule.max_tokens), held_out=True)
        score = await env.play(chat, problem)
        if index < EVAL_REPLIES:
            kept[index] = (chat.replies[-1] if chat.replies else "", score.reward)
        return score

    report = await client.run_held_out(policy, list(enumerate(held_out)), agent, step=step, concurrency=schedule.eval_concurrency)
    return float(report["mean"] or 0.0), report["components"], [kept[i] for i in sorted(kept)]


async def teach(client: AsyncClient, policy: str, env: Teachable, examples: int = WORKED_EXAMPLES) -> dict[str, Any]:
    """Pull the teach lever, for a task whose answer form the base never writes: the policy's
    teacher becomes its own base shown ``examples`` worked examples from the suite's train
    problems (never held-out ones), and the objective GRPO plus distillation from that teacher
    (docs/objectives.md). Through the admin API, as a user would; the
    policy's status after."""
    teacher = {"context": env.worked_examples(examples)}
    return dict(await client.update_policy(policy, train={"objective": TEACH_OBJECTIVE, "teacher": teacher}))


async def teacher_score(
    client: AsyncClient, env: Teachable, policy: str = "agent", examples: int = WORKED_EXAMPLES, schedule: Schedule = Schedule(rounds=0)
) -> tuple[float, list[tuple[str, float]]]:
    """What the teach lever's teacher knows, before pulling it: the held-out problems played
    greedily by the policy's base (``<policy>@0``) shown the ``examples`` worked examples that
    ``teach`` shows it. The mean score and the first ``EVAL_REPLIES`` replies. The calls are
    recorded but neither marked held-out nor rewarded, so no version's held-out score changes.
    The lever can teach the form, and past it only what this teacher gets right: pull it where
    this beats the base's own held-out score."""
    context, (_, held_out) = env.worked_examples(examples), env.split()
    gate = asyncio.Semaphore(schedule.eval_concurrency)

    async def answer(problem: Any) -> tuple[str, float]:
        async with gate:
            chat = Chat(client.trajectory().async_openai(max_retries=0), f"{policy}@0", Sampling(0.0, schedule.max_tokens), held_out=True, context=context)
            score = await env.play(chat, problem)
            return (chat.replies[-1] if chat.replies else "", score.reward)

    played = await asyncio.gather(*(answer(p) for p in held_out))
    return sum(r for _, r in played) / max(len(played), 1), played[:EVAL_REPLIES]


def trains_every_group(status: dict[str, Any]) -> bool:
    """On GRPO alone only groups whose rewards differ train (a tie teaches nothing); with SFT,
    or a teacher that teaches every call, every group does: the gateway says which
    (``ties_train``). A gateway from before it said is read by the objective."""
    if "ties_train" in status:
        return bool(status["ties_train"])
    objective = status["train"].get("objective", "grpo")
    if isinstance(objective, dict):
        return bool(objective.get("sft") or objective.get("distill"))
    return objective != "grpo"


async def train(
    client: AsyncClient,
    env: Environment,
    policy: str = "agent",
    schedule: Schedule = Schedule(minutes=20, eval_minutes=10),
    *,
    plot: Path | None = None,
    after_round: Callable[[int], Awaitable[int]] | None = None,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Curve:
    """Train ``policy`` on ``env`` through the gateway; the curve, also drawn to ``plot``.

    ``after_round(round_no)``: what to do once a round is played (examples/distill.py has a
    teacher answer its prompts), returning how many more ready groups it made."""
    train_set, held_out = env.split()
    status = await client.status(policy)
    first_step, per_step = status["step"], status["train"]["groups_per_step"]
    groups = schedule.groups or per_step
    every_group = trains_every_group(status)
    curve = Curve(env.name, policy)
    started, evaluating = time.monotonic(), 0.0

    def minutes() -> float:
        return (time.monotonic() - started - evaluating) / 60

    def done(round_no: int) -> bool:
        return (schedule.rounds is not None and round_no >= schedule.rounds) or (schedule.minutes is not None and minutes() >= schedule.minutes)

    async def held_out_score(round_no: int, step: int) -> str:
        nonlocal evaluating
        t = time.monotonic()
        score, components, replies = await evaluate(client, env, held_out, policy, step, schedule)
        evaluating += time.monotonic() - t
        curve.evals.append(Eval(round_no, round(minutes(), 2), step, score, components, replies))
        return f"held-out: score {score:.3f}" + "".join(f", {k} {v:.3f}" for k, v in components.items())

    def replies() -> str:  # the last evaluation's first replies: what its score is made of
        shown = [f"{json.dumps(text[:REPLY_CHARS])} {score:.2f}" for text, score in curve.evals[-1].replies[:SHOWN_REPLIES]]
        return f"  replies of {policy}@{curve.evals[-1].step}: " + " | ".join(shown)

    log(f"{policy}@{first_step} (before training) on {len(held_out)} held-out {env.name}: {await held_out_score(0, first_step)}")
    log(replies())
    trainable, step, round_no, next_mark = 0, first_step, 0, schedule.eval_minutes
    while not done(round_no):
        results = await play_round(client, env, train_set, round_no, groups=groups, policy=policy, schedule=schedule)
        rewards = [r for r, _ in results]
        curve.round_reward.append(sum(rewards) / len(rewards))
        members = [rewards[g * schedule.size : (g + 1) * schedule.size] for g in range(groups)]
        trainable += sum(every_group or max(m) > min(m) for m in members)
        if after_round is not None:
            trainable += await after_round(round_no)
        round_no += 1
        try:
            step = await client.wait_for_step(policy, first_step + trainable // per_step - schedule.ahead, timeout=STEP_WAIT)
        except StepTimeout as exc:  # a group the trainer could not use: go on from where it stands
            log(f"  {exc}; going on")
            first_step, trainable = (await client.status(policy))["step"], 0
        line = f"round {round_no:3d}  train reward {curve.round_reward[-1]:.3f}  now serving {policy}@{step}  {minutes() * 60:5.0f}s"
        marked = next_mark is not None and minutes() >= next_mark
        if done(round_no) or marked or (schedule.eval_every is not None and round_no % schedule.eval_every == 0):
            while next_mark is not None and minutes() >= next_mark:
                next_mark += schedule.eval_minutes or 0
            line += f"  {await held_out_score(round_no, step)}"
            line += "\n" + replies()
        log(line)
        if plot is not None:
            write_plot(curve, plot)
    return curve


def write_plot(curve: Curve, path: Path, title: str | None = None) -> None:
    """The train reward by round, and the held-out score of each version evaluated (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(range(1, len(curve.round_reward) + 1), curve.round_reward, marker="o", markersize=2, label="train reward")
    ax.plot([e.round for e in curve.evals], [e.score for e in curve.evals], marker="s", label="held-out score")
    for e in curve.evals:
        ax.annotate(f"@{e.step}", (e.round, e.score), textcoords="offset points", xytext=(0, 5), fontsize=7, ha="center")
    ax.set(xlabel="round", ylabel="score", title=title or f"{curve.policy} learning {curve.task}", ylim=(0, 1))
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
