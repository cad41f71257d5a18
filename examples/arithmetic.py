"""The demo: a real model (SmolLM2-135M-Instruct) gets better at sums it never trained on.

    python examples/arithmetic.py                  # starts `burnish up` (SmolLM2, CPU), trains, stops it
    python examples/arithmetic.py --gateway http://127.0.0.1:8080 --admin-token ...   # against one already up

The task: "What is 13 + 14? Reply with only the number." The base model gets about half of
such sums right, and never answers with only the number: it writes "13 + 14 = 25", often
followed by a paragraph. The sums a + b with a, b in 1..20 are split once, by a fixed seed,
into a train set and a held-out set that the policy never trains on.

The loop is the SDK's task runner (``burnish.tasks``, docs/environments.md), the sums its
environment: each round plays ``groups`` groups of ``size`` answers to train sums through the
gateway (the SDK files each group's calls together), rewards them, and waits for the
trainer's next version. Every ``eval_every`` rounds, and before the first, the held-out sums
are answered greedily by the version just served, pinned as ``agent@<step>`` and marked for
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
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from digits import burnish_running, gateway_arguments  # noqa: I001  (examples/ is run as a folder of scripts)

from burnish import AsyncClient, Score
from burnish.tasks import Chat, Curve, Schedule, train

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
    """A one-turn task with a fixed train/held-out split, as the SDK's runner plays it
    (burnish.tasks: an environment). examples/sweep.py defines others of different shapes."""

    name: str
    split: Callable[[], tuple[list, list]]  # (train, held out), the same on every call
    prompt: Callable[[Any], str]
    right: Callable[[str, Any], float]  # the held-out score
    exact: Callable[[str, Any], float]  # the reply is in the form asked for, and right
    shaped: Callable[[str, Any], float]  # the train reward
    temperature: float = TEMPERATURE
    max_tokens: int = 16

    async def play(self, chat: Chat, problem: Any) -> Score:
        text = await chat([{"role": "user", "content": self.prompt(problem)}])
        if chat.held_out:
            return Score(self.right(text, problem), {"exact": self.exact(text, problem), "shaped": self.shaped(text, problem)})
        return Score(self.shaped(text, problem))

    def schedule(self, rounds: int, groups: int, size: int, eval_every: int) -> Schedule:
        return Schedule(rounds=rounds, eval_every=eval_every, groups=groups, size=size, temperature=self.temperature, max_tokens=self.max_tokens)


SUMS = Task(
    "sums", sums, lambda p: PROMPT.format(a=p[0], b=p[1]),
    right=lambda text, p: right(text, *p), exact=lambda text, p: exact(text, *p), shaped=lambda text, p: shaped(text, *p),
)  # fmt: skip


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

    async def run() -> Curve:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:
            schedule = SUMS.schedule(args.rounds, args.groups, args.size, args.eval_every)
            curve = await train(client, SUMS, args.policy, schedule, plot=args.plot)
            print("base against now:", await client.compare(args.policy))
            return curve

    started = time.monotonic()
    with burnish_running(args, model="smollm2"):
        curve = asyncio.run(run())
        first, last = curve.evals[0], curve.evals[-1]
        print(
            f"held-out score: {args.policy}@{first.step} {first.score:.3f} -> {args.policy}@{last.step} {last.score:.3f} "
            f"in {time.monotonic() - started:.0f}s; plot in {args.plot}"
        )


if __name__ == "__main__":
    main()
