"""What GRPO and the teach lever have to learn from on each row of the task table, before any training.

    python examples/task_contrast.py                       # a fresh `burnish up` (SmolLM2), every row, ~15 minutes
    python examples/task_contrast.py --task letter_jumble --temperature 0.3 --temperature 0.7

Two tables, from the base (``agent@0``, pinned):

- **Contrast.** A group teaches GRPO only where its members' scores differ: a group that ties
  is skipped. Each row's first train questions, 16 answers each at each temperature, scored by
  the task's own verifier: the share of groups whose scores differ, as groups of 8 (each
  question's two halves) and of 16, and the mean score. What the runner's temperature and
  group size give GRPO before any training.
- **The teacher.** The teach lever distils from the base shown worked examples
  (``burnish.tasks.teach``). The held-out questions answered greedily by the base alone and by
  that teacher (``burnish.tasks.teacher_score``, as ``burnish-tasks eval --teacher``): a teacher
  that scores no better than the base has nothing to teach but the form.

The calls are recorded as one-call trajectories, never rewarded or marked held-out: nothing
trains, and no version's held-out score changes.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from digits import burnish_running  # noqa: I001  (examples/ is run as a folder of scripts)
from task_table import TABLE

from burnish import AsyncClient
from burnish.tasks.cli import load
from burnish.tasks.environment import Chat, Sampling
from burnish.tasks.runner import MAX_TOKENS, WORKED_EXAMPLES, Schedule, teacher_score

ANSWERS = 16  # a question's answers: two groups of 8, or one of 16
CONCURRENCY = 64


def contrasts(scores: list[float]) -> bool:
    return max(scores) - min(scores) > 1e-9


async def played(client: AsyncClient, env: Any, problems: list[Any], sampling: Sampling, answers: int = 1) -> list[list[float]]:
    """Each problem's ``answers`` scores from the base, seeded 0, 1, ..., each a one-call trajectory."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def answer(problem: Any, i: int) -> float:
        async with gate:
            seeded = Sampling(sampling.temperature, sampling.max_tokens, seed=i)
            chat = Chat(client.trajectory().async_openai(max_retries=0), "agent@0", seeded)
            return float((await env.play(chat, problem)).reward)

    async def group(problem: Any) -> list[float]:
        return list(await asyncio.gather(*(answer(problem, i) for i in range(answers))))

    return list(await asyncio.gather(*(group(p) for p in problems)))


async def survey(gateway: str, tasks: list[str], temperatures: list[float], questions: int) -> list[str]:
    client = AsyncClient(gateway)
    contrast = ["| task | temperature | groups of 8 that differ | groups of 16 | mean score |", "|---|---|---|---|---|"]
    teacher = ["| task | base, greedy | the teacher (the base shown 3 worked examples), greedy |", "|---|---|---|"]
    for row in (r for r in TABLE if r.task in tasks):
        env = load(row.suite, row.task, row.config, {})
        train_set, held_out = env.split()
        budget = row.max_tokens or MAX_TOKENS
        problems = [train_set[i] for i in range(questions)]
        for t in temperatures:
            per = await played(client, env, problems, Sampling(t, budget), ANSWERS)
            of8 = sum(contrasts(s[:8]) + contrasts(s[8:]) for s in per) / (2 * len(per))
            of16 = sum(contrasts(s) for s in per) / len(per)
            mean = sum(map(sum, per)) / (ANSWERS * len(per))
            contrast.append(f"| {row.task} | {t} | {of8:.2f} | {of16:.2f} | {mean:.3f} |")
            print(contrast[-1], flush=True)
        base = await played(client, env, list(held_out), Sampling(0.0, budget))
        shown, _ = await teacher_score(client, env, "agent", WORKED_EXAMPLES, Schedule(rounds=0, max_tokens=budget))  # type: ignore[arg-type]
        teacher.append(f"| {row.task} | {sum(s[0] for s in base) / len(base):.3f} | {shown:.3f} |")
        print(teacher[-1], flush=True)
    await client.aclose()
    return [*contrast, "", *teacher]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", help="a row of the table (repeatable); default: every row")
    parser.add_argument("--temperature", type=float, action="append", help="repeatable; default: 0.5, 0.7 (the runner's) and 1.0")
    parser.add_argument("--questions", type=int, default=12, help="train questions a row, 16 answers each")
    parser.add_argument("--gateway", help="a running `burnish up`; default: start one")
    parser.add_argument("--data-dir", type=Path, default=Path("burnish-data-contrast"))
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    args.admin_token = None
    tasks = args.task or [r.task for r in TABLE]
    with burnish_running(args, model="smollm2"):
        lines = asyncio.run(survey(args.gateway, tasks, args.temperature or [0.5, 0.7, 1.0], args.questions))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
