"""SmolLM2's training defaults on one-turn tasks of other shapes than the demo's sums.

    python examples/sweep.py --task larger                     # starts `burnish up` (SmolLM2, CPU)
    python examples/sweep.py --task parity --set learning_rate=1e-3 --set groups_per_step=2
    python examples/sweep.py --task sums --lora 'target_modules=["q_proj", "v_proj"]'   # the demo's task, other LoRA

The defaults `burnish up` gives the embedded model (docs/trainer.md) were first tuned on the
demo's sums. This runs the demo's loop (examples/arithmetic.py: rounds of groups of sampled
answers, a held-out set answered greedily by each pinned version) on another task, with the
policy's settings as `burnish up` leaves them unless ``--set`` changes one, and prints the
held-out score per version and the run's learning health. docs/trainer.md, "Defaults beyond
sums", holds the figures. The tasks, each with a fixed train/held-out split:

- ``larger``: "Which is larger, 47 or 52? Reply with only the larger number." A choice
  between two numbers the prompt gives. The base names the larger one about half the time,
  in a sentence ("52 is the larger number.").
- ``parity``: "Is 633 even or odd? Reply with one word: even or odd." A label of two. The
  base mostly answers "neither even nor odd": a run that collapses onto one label scores 0.5.

Rewards, as in the demo: held-out ``right`` (the reply gives the answer and not the other
choice), ``exact`` (the answer and nothing else), train ``shaped`` (0.7 for right, up to 0.3
for brevity).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time

from arithmetic import HELD_OUT, SPLIT_SEED, SUMS, Task, loop_arguments  # noqa: I001  (examples/ is run as a folder of scripts)
from digits import burnish_running, gateway_arguments

from burnish import AsyncClient
from burnish.tasks import Curve, train
from burnish.tasks.cli import setting

NUMBER = re.compile(r"\d+")
WORD = re.compile(r"[a-z]+")


def _split(problems: list) -> tuple[list, list]:
    random.Random(SPLIT_SEED).shuffle(problems)
    return problems[HELD_OUT:], problems[:HELD_OUT]


def _brevity(text: str, answer: str) -> float:
    return 0.3 / (1 + max(len(text.strip()) - len(answer), 0) / 4)


def _exact(text: str, answer: str) -> float:
    return float(text.strip().removesuffix(".").lower() == answer)


# larger: (a, b), two different numbers in 10..99.
def pairs() -> tuple[list, list]:
    return _split([(a, b) for a in range(10, 100, 3) for b in range(11, 100, 3)])


def larger_right(text: str, pair: tuple[int, int]) -> float:
    named = {int(n) for n in NUMBER.findall(text)}
    return float(max(pair) in named and min(pair) not in named)


LARGER = Task(
    "larger", pairs, lambda p: f"Which is larger, {p[0]} or {p[1]}? Reply with only the larger number.",
    right=larger_right,
    exact=lambda text, p: _exact(text, str(max(p))),
    shaped=lambda text, p: 0.7 * larger_right(text, p) + _brevity(text, str(max(p))),
)  # fmt: skip


# parity: n in 10..999.
def numbers() -> tuple[list, list]:
    return _split(list(range(10, 1000)))


def label(n: int) -> str:
    return "odd" if n % 2 else "even"


def parity_right(text: str, n: int) -> float:
    words = set(WORD.findall(text.lower()))
    return float(label(n) in words and label(n + 1) not in words)


PARITY = Task(
    "parity", numbers, lambda n: f"Is {n} even or odd? Reply with one word: even or odd.",
    right=parity_right,
    exact=lambda text, n: _exact(text, label(n)),
    shaped=lambda text, n: 0.7 * parity_right(text, n) + _brevity(text, label(n)),
)  # fmt: skip

TASKS = {task.name: task for task in (SUMS, LARGER, PARITY)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gateway_arguments(parser, plot="sweep.png")
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--set", type=setting, action="append", default=[], help="a train setting, name=value")
    parser.add_argument("--lora", type=setting, action="append", default=[], help="a LoRA setting, name=value (before the first step)")
    parser.add_argument("--temperature", type=float, help="of the train answers (default: the task's, 0.7)")
    loop_arguments(parser)
    args = parser.parse_args()
    task = TASKS[args.task]
    if args.temperature is not None:
        task = Task(**{**task.__dict__, "temperature": args.temperature})

    async def run() -> Curve:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:
            if args.set or args.lora:
                await client.update_policy(args.policy, **({"train": dict(args.set)} if args.set else {}), **({"lora": dict(args.lora)} if args.lora else {}))
            status = await client.status(args.policy)
            print("train settings:", json.dumps(status["train"]), "lora:", json.dumps(status["lora"]), flush=True)
            curve = await train(client, task, args.policy, task.schedule(args.rounds, args.groups, args.size, args.eval_every), plot=args.plot)
            status = await client.status(args.policy)
            print("health:", json.dumps(status.get("health")), flush=True)
            return curve

    started = time.monotonic()
    with burnish_running(args, model="smollm2"):
        curve = asyncio.run(run())
    rewards = curve.round_reward
    print(
        f"{task.name}: held-out right {' -> '.join(f'{e.score:.3f} (@{e.step})' for e in curve.evals)}; "
        f"exact {curve.evals[0].components['exact']:.3f} -> {curve.evals[-1].components['exact']:.3f}; train reward first 4 rounds "
        f"{sum(rewards[:4]) / 4:.3f}, last 4 {sum(rewards[-4:]) / 4:.3f}; {time.monotonic() - started:.0f}s"
    )


if __name__ == "__main__":
    main()
