"""The demo: a real model (SmolLM2-135M-Instruct) gets better at sums it never trained on.

    python examples/arithmetic.py                  # starts `burnish up` (SmolLM2, CPU), trains, stops it
    python examples/arithmetic.py --gateway http://127.0.0.1:8080 --admin-token ...   # against one already up

The task: "What is 13 + 14? Reply with only the number." The base model gets about half of
such sums right, and never answers with only the number: it writes "13 + 14 = 25", often
followed by a paragraph. The sums a + b with a, b in 1..20 are split once, by a fixed seed,
into a train set and a held-out set that the policy never trains on.

Each round plays ``groups`` groups of ``size`` answers to train sums through the gateway
(the SDK files each group's calls together), rewards them, and waits for the trainer's
next version. Every ``eval_every`` rounds, and before the first, the held-out sums are
answered greedily by the version just served, pinned as ``agent@<step>`` and marked for
evaluation: recorded and rewarded, never trained on. The gateway keeps the held-out score
per version (``client.eval_scores``, ``client.compare``); this script prints it and plots
it beside the train reward (arithmetic.png).

Rewards:
- held-out: ``right``, 1 if the reply's last number is the sum (so a reply that rambles on
  past the answer is wrong), else 0; the components also say whether it was ``exact`` (the
  sum and nothing else) and its ``shaped`` train reward.
- train (``shaped``): 0.7 for right, plus up to 0.3 for brevity (each character beyond the
  answer costs a little), as the prompt asks for only the number.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from digits import burnish_running, gateway_arguments  # noqa: I001  (examples/ is run as a folder of scripts)

from burnish import AsyncClient

PROMPT = "What is {a} + {b}? Reply with only the number."
NUMBER = re.compile(r"-?\d+")
SPLIT_SEED = 0
HELD_OUT = 64
# Sampling temperature of the train answers: at 1.0 a 135M model's answers are mostly noise.
TEMPERATURE = 0.7


def sums() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Every a + b with a, b in 1..20, split once into (train, held out) by a fixed seed."""
    pairs = [(a, b) for a in range(1, 21) for b in range(1, 21)]
    random.Random(SPLIT_SEED).shuffle(pairs)
    return pairs[HELD_OUT:], pairs[:HELD_OUT]


def right(text: str, a: int, b: int) -> float:
    """1 if the reply's last number is the sum (a reply that rambles on past it is wrong)."""
    numbers = NUMBER.findall(text)
    return float(bool(numbers) and int(numbers[-1]) == a + b)


def exact(text: str, a: int, b: int) -> float:
    """1 if the reply is the sum and nothing else (a trailing period allowed)."""
    return float(text.strip().removesuffix(".") == str(a + b))


def shaped(text: str, a: int, b: int) -> float:
    """The train reward: mostly being right, and some for brevity, as the prompt asks."""
    extra = max(len(text.strip()) - len(str(a + b)), 0)
    return 0.7 * right(text, a, b) + 0.3 / (1 + extra / 4)


@dataclass(frozen=True)
class Task:
    """A one-turn task with a fixed train/held-out split: all the loop below knows of it.
    examples/sweep.py defines others of different shapes on the same loop."""

    name: str
    split: Callable[[], tuple[list, list]]  # (train, held out), the same on every call
    prompt: Callable[[Any], str]
    right: Callable[[str, Any], float]  # the held-out score
    exact: Callable[[str, Any], float]  # the reply is in the form asked for, and right
    shaped: Callable[[str, Any], float]  # the train reward
    temperature: float = TEMPERATURE
    max_tokens: int = 16
    held_out: str = "right"  # what the held-out score is, for the plot


SUMS = Task(
    "sums", sums, lambda p: PROMPT.format(a=p[0], b=p[1]),
    right=lambda text, p: right(text, *p), exact=lambda text, p: exact(text, *p), shaped=lambda text, p: shaped(text, *p),
)  # fmt: skip


def ask(task: Task, problem: Any) -> list[dict[str, str]]:
    return [{"role": "user", "content": task.prompt(problem)}]


async def play_round(client: AsyncClient, task: Task, round_no: int, problems: list, *, groups: int, size: int, policy: str) -> list[tuple[float, str]]:
    """``groups`` train problems, ``size`` sampled answers each: their rewards and the version that wrote each."""

    async def member(group, problem: Any, i: int) -> tuple[float, str]:
        t = group.trajectory(f"{group.id}-{i}")
        raw = await t.async_openai(max_retries=0).chat.completions.with_raw_response.create(
            model=policy, messages=ask(task, problem), temperature=task.temperature, max_tokens=task.max_tokens, seed=round_no * 1000 + i,
        )  # fmt: skip
        reward = task.shaped(raw.parse().choices[0].message.content or "", problem)
        await t.reward(reward)  # the last member's reward closes the group: it is ready to train
        return reward, raw.headers["x-policy-version"]

    picked = [problems[(round_no * groups + g) % len(problems)] for g in range(groups)]
    sets = [(client.group(size=size, id=f"{task.name}-r{round_no}-g{g}-{os.getpid()}"), problem) for g, problem in enumerate(picked)]
    return list(await asyncio.gather(*(member(group, problem, i) for group, problem in sets for i in range(size))))


async def evaluate(client: AsyncClient, task: Task, step: int, held_out: list, *, policy: str) -> tuple[float, float]:
    """The held-out problems, greedy, answered by ``policy@step`` (pinned), in one eval group:
    the version's held-out score as the gateway keeps it, and the share of exact answers."""
    group = client.group(id=f"eval-{task.name}-{policy}-{step}-{os.getpid()}", eval=True)
    model = f"{policy}@{step}"

    async def member(i: int, problem: Any) -> float:
        t = group.trajectory(f"{group.id}-{i}")
        reply = await t.async_openai(max_retries=0).chat.completions.create(
            model=model, messages=ask(task, problem), temperature=0.0, max_tokens=task.max_tokens
        )
        text = reply.choices[0].message.content or ""
        await t.reward(task.right(text, problem), exact=task.exact(text, problem), shaped=task.shaped(text, problem))
        return task.exact(text, problem)

    exacts = await asyncio.gather(*(member(i, problem) for i, problem in enumerate(held_out)))
    scores = {entry["step"]: entry for entry in (await client.eval_scores(policy))["data"]}
    return scores[step]["score"], sum(exacts) / len(exacts)


async def train(
    client: AsyncClient,
    rounds: int,
    groups: int,
    size: int,
    eval_every: int,
    policy: str,
    plot: Path | None,
    task: Task = SUMS,
    after_round: Callable[[int], Awaitable[int]] | None = None,
) -> dict[str, list]:
    """``after_round(round_no)``: what to do once a round is played (examples/distill.py has a
    teacher answer its prompts), returning how many more ready groups it made."""
    train_set, held_out = task.split()
    status = await client.status(policy)
    step, per_step = status["step"], status["train"]["groups_per_step"]
    # On GRPO alone only groups whose rewards differ train (a tie teaches nothing); with SFT or
    # distillation in the objective, every group does.
    objective = status["train"].get("objective", "grpo")
    grpo_alone = objective == "grpo" or (isinstance(objective, dict) and not objective.get("sft") and not objective.get("distill"))
    curve: dict[str, list] = {"round_reward": [], "eval": [], "exact": []}
    t0 = time.monotonic()
    base, base_exact = await evaluate(client, task, step, held_out, policy=policy)
    curve["eval"].append((0, step, base))
    curve["exact"].append(base_exact)
    print(f"{policy}@{step} (before training) on {len(held_out)} held-out {task.name}: right {base:.3f}, exact {base_exact:.3f}", flush=True)
    trainable = 0
    for round_no in range(rounds):
        results = await play_round(client, task, round_no, train_set, groups=groups, size=size, policy=policy)
        rewards = [r for r, _ in results]
        curve["round_reward"].append(sum(rewards) / len(rewards))
        trainable += sum(not grpo_alone or max(rewards[g * size : (g + 1) * size]) > min(rewards[g * size : (g + 1) * size]) for g in range(groups))
        if after_round is not None:
            trainable += await after_round(round_no)
        step = await client.wait_for_step(policy, status["step"] + trainable // per_step)
        line = f"round {round_no + 1:3d}  train reward {curve['round_reward'][-1]:.3f}  now serving {policy}@{step}  {time.monotonic() - t0:5.0f}s"
        if (round_no + 1) % eval_every == 0 or round_no + 1 == rounds:
            score, exact_share = await evaluate(client, task, step, held_out, policy=policy)
            curve["eval"].append((round_no + 1, step, score))
            curve["exact"].append(exact_share)
            line += f"  held-out: right {score:.3f}, exact {exact_share:.3f}"
        print(line, flush=True)
        if plot is not None:
            write_plot(curve, plot, **({} if task is SUMS else {"title": f"SmolLM2-135M learning {task.name}", "held_out": task.held_out}))
    return curve


def write_plot(curve: dict[str, list], path: Path, title: str = "SmolLM2-135M learning sums: 'What is a + b?'", held_out: str = "right") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    rounds = range(1, len(curve["round_reward"]) + 1)
    ax.plot(rounds, curve["round_reward"], marker="o", markersize=2, label="train reward (right + brevity)")
    evals = curve["eval"]
    ax.plot([r for r, _, _ in evals], [s for _, _, s in evals], marker="s", label=f"held-out score ({held_out})")
    for r, step, s in evals:
        ax.annotate(f"@{step}", (r, s), textcoords="offset points", xytext=(0, 5), fontsize=7, ha="center")
    ax.set(xlabel="round", ylabel="score", title=title, ylim=(0, 1))
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def loop_arguments(parser: argparse.ArgumentParser) -> None:
    """The loop's options (``train``), shared with examples/sweep.py."""
    parser.add_argument("--policy", default="agent")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gateway_arguments(parser, plot="arithmetic.png")
    loop_arguments(parser)
    args = parser.parse_args()

    async def run() -> dict[str, list]:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:
            curve = await train(client, args.rounds, args.groups, args.size, args.eval_every, args.policy, args.plot)
            print("base against now:", await client.compare(args.policy))
            return curve

    started = time.monotonic()
    with burnish_running(args, model="smollm2"):
        curve = asyncio.run(run())
        (_, first_step, first), (_, last_step, last) = curve["eval"][0], curve["eval"][-1]
        print(
            f"held-out score: {args.policy}@{first_step} {first:.3f} -> {args.policy}@{last_step} {last:.3f} "
            f"in {time.monotonic() - started:.0f}s; plot in {args.plot}"
        )


if __name__ == "__main__":
    main()
