"""Teaching a format GRPO never finds: on-policy distillation from the model itself, shown examples.

    python examples/distill.py                              # distill (starts `burnish up`, SmolLM2, CPU)
    python examples/distill.py --objective grpo             # GRPO alone, the same budget
    python examples/distill.py --objective grpo+distill     # both, weighted 1 and 1
    python examples/distill.py --compare distill.log grpo.log --plot compare.png   # runs' output, one plot

The task is examples/sweep.py's ``larger``: "Which is larger, 47 or 52? Reply with only the
larger number." SmolLM2-135M answers in a sentence ("52 is the larger number."): the bare
number it is asked for is what it never samples, so GRPO's rewards for it never differ and
nothing teaches it. The same model shown three worked examples first, as earlier user and
assistant turns, answers with a bare number. That model is the teacher: the policy's base with
its adapter off and those turns before each conversation (``train.teacher.context``), scoring
every token the policy samples; the policy learns to answer so without them.

Held-out score: ``form``, the share of held-out questions (greedy, pinned versions, never
trained on) answered with one of the two numbers and nothing else. ``exact`` is the share
answered with the larger one alone. The train reward (GRPO's) is the sweep's: 0.7 for naming
the larger and not the other, up to 0.3 for brevity.

SmolLM2 does sometimes write the bare number at temperature 1, so distillation on the sampled
token alone can find it. ``--task arrow`` is a house style it never writes: the same question without the
instruction, answered ``=> 52`` as the teacher's worked examples answer. Three routes reach
what the student never samples (docs/objectives.md, "Distillation beyond the sampled token"):

    python examples/distill.py --task arrow --count 320              # the form's share in the base's samples, and the teacher's
    python examples/distill.py --task arrow                          # the teacher's top 16 and a tail at each sampled position
    python examples/distill.py --task arrow --top-k 0                # the sampled token alone
    python examples/distill.py --task arrow --objective teacher-sft  # the teacher writes each round's answers; SFT on them
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path

from arithmetic import Task, loop_arguments  # noqa: I001  (examples/ is run as a folder of scripts)
from digits import burnish_running, gateway_arguments
from sweep import LARGER

from burnish import AsyncClient
from burnish.tasks import Curve, train

# Worked examples for the teacher, outside the task's numbers (two digits): nothing held out leaks in.
EXAMPLES = ((318, 142), (205, 610), (733, 459))
OBJECTIVES = {
    "grpo": "grpo",
    "distill": "distill",
    "grpo+distill": {"grpo": 1.0, "distill": 1.0},
    "teacher-sft": "sft",  # the teacher answers each round's prompts (teacher-answers); SFT on those
}
BARE = re.compile(r"\s*(\d+)\.?\s*")
ARROW = re.compile(r"\s*=>\s*(\d+)\s*")


def form(text: str, pair: tuple[int, int]) -> float:
    """1 if the reply is one of the two numbers and nothing else (a trailing period allowed)."""
    found = BARE.fullmatch(text)
    return float(found is not None and int(found.group(1)) in pair)


def arrow(text: str, pair: tuple[int, ...]) -> float:
    """1 if the reply is ``=> n``, n one of ``pair``, and nothing else."""
    found = ARROW.fullmatch(text)
    return float(found is not None and int(found.group(1)) in pair)


TASKS = {
    "larger": Task(**{**LARGER.__dict__, "right": form}),
    "arrow": Task(
        **{
            **LARGER.__dict__,
            "name": "arrow",
            "prompt": lambda p: f"Which is larger, {p[0]} or {p[1]}?",
            "right": arrow,
            "exact": lambda text, p: arrow(text, (max(p),)),
            "shaped": lambda text, p: 0.5 * arrow(text, p) + 0.5 * LARGER.right(text, p),
        }
    ),
}
ANSWER = {"larger": str, "arrow": lambda n: f"=> {n}"}  # a worked example's answer, in the task's form


def teacher(task: Task) -> dict:
    turns = []
    for a, b in EXAMPLES:
        turns += [{"role": "user", "content": task.prompt((a, b))}, {"role": "assistant", "content": ANSWER[task.name](max(a, b))}]
    return {"context": turns}


async def count(client: AsyncClient, task: Task, n: int, policy: str) -> None:
    """Before training: the form's share in ``n`` answers of the base at temperature 1, and in the
    teacher's greedy answers (the base shown the worked examples), over the train questions."""
    questions, _ = task.split()
    gate = asyncio.Semaphore(16)

    async def ask(messages: list[dict], temperature: float, seed: int) -> str:
        async with gate:
            reply = (
                await client.trajectory()
                .async_openai(max_retries=0)
                .chat.completions.create(model=f"{policy}@0", messages=messages, temperature=temperature, max_tokens=task.max_tokens, seed=seed)
            )
        return reply.choices[0].message.content or ""

    picked = [questions[i % len(questions)] for i in range(n)]
    base = await asyncio.gather(*(ask([{"role": "user", "content": task.prompt(q)}], 1.0, i) for i, q in enumerate(picked)))
    shown = teacher(task)["context"]
    taught = await asyncio.gather(*(ask([*shown, {"role": "user", "content": task.prompt(q)}], 0.0, 0) for q in questions[:64]))
    print(f"base at temperature 1: {sum(task.right(t, q) for t, q in zip(base, picked)):.0f} of {n} in the form; e.g. {base[:3]}")
    print(f"teacher, greedy: {sum(task.right(t, q) for t, q in zip(taught, questions)):.0f} of {len(taught)} in the form; e.g. {taught[:3]}")


NAMES = {"grpo": "GRPO alone", "distill": "distillation", "grpo+distill": "GRPO + distillation", "teacher-sft": "the teacher's answers (SFT)"}


def label(objective: str, top_k: int) -> str:
    """A run's name in the comparison: its route, and for distillation what the teacher gives."""
    if "distill" not in objective:
        return NAMES[objective]
    return f"{NAMES[objective]}, " + (f"the teacher's top {top_k}" if top_k else "the sampled token")


# What a run prints, read back by --compare: the held-out line before training and after each evaluated round.
BEFORE = re.compile(r"^agent@0 \(before training\) .*: held-out: score ([0-9.]+), exact ([0-9.]+)")
ROUND = re.compile(r"^round +(\d+) .* +(\d+)s +held-out: score ([0-9.]+), exact ([0-9.]+)")


def compare(logs: list[Path], plot: Path) -> None:
    """One plot of several runs' held-out form (solid) and exact answers (dashed) by round,
    from what each printed (``python examples/distill.py ... > run.log``); and a table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for log in logs:
        text = log.read_text().splitlines()
        name = next((line.split(":", 1)[1].strip() for line in text if line.startswith("run:")), log.stem)
        points = [(0, 0, float(m[1]), float(m[2])) for line in text if (m := BEFORE.match(line))]
        points += [(int(m[1]), int(m[2]), float(m[3]), float(m[4])) for line in text if (m := ROUND.match(line))]
        line = ax.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=f"{name}: bare number")[0]
        ax.plot([p[0] for p in points], [p[3] for p in points], linestyle="--", color=line.get_color(), label=f"{name}: bare and right")
        print(f"| {name} | " + " | ".join(f"{form:.3f} / {exact:.3f} ({seconds}s)" for _, seconds, form, exact in points) + " |")
    ax.set(
        xlabel="round (4 groups x 8 answers)",
        ylabel="held-out share (64 questions)",
        title="SmolLM2-135M: 'Reply with only the larger number.'",
        ylim=(0, 1.05),
    )
    ax.legend(loc="center right", fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(plot, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gateway_arguments(parser, plot="distill.png")
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), default="distill")
    parser.add_argument("--task", choices=sorted(TASKS), default="larger")
    parser.add_argument(
        "--top-k", type=int, default=16, help="train.teacher.top_k: the teacher's k likeliest tokens at each sampled position (0: the sampled token alone)"
    )
    parser.add_argument("--count", type=int, metavar="N", help="only count the form in N of the base's samples and in the teacher's answers")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="LOG", help="plot earlier runs' printed output together instead of running")
    loop_arguments(parser)
    parser.set_defaults(rounds=12, eval_every=3)
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.plot)
        return

    task = TASKS[args.task]

    async def run() -> Curve | None:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:
            if args.count:
                await count(client, task, args.count, args.policy)
                return None
            train_settings: dict = {"objective": OBJECTIVES[args.objective]}
            if args.objective != "grpo":
                train_settings["teacher"] = {**teacher(task), "top_k": args.top_k}
            await client.update_policy(args.policy, train=train_settings)
            status = await client.status(args.policy)
            print("objective:", json.dumps(status["train"]["objective"]), flush=True)
            print("run:", label(args.objective, args.top_k), flush=True)

            async def teacher_writes(round_no: int) -> int:
                """The round's questions, answered by the policy's teacher (the base shown the examples): demonstrations."""
                written = await client.teacher_answers(args.policy, limit=args.groups, max_tokens=task.max_tokens)
                return len(written["ids"])

            after = teacher_writes if args.objective == "teacher-sft" else None
            schedule = task.schedule(args.rounds, args.groups, args.size, args.eval_every)
            return await train(client, task, args.policy, schedule, plot=args.plot, after_round=after)

    started = time.monotonic()
    with burnish_running(args, model="smollm2"):
        curve = asyncio.run(run())
    if curve is None:
        return
    print(
        f"{args.objective}: held-out form {' -> '.join(f'{e.score:.3f} (@{e.step})' for e in curve.evals)}; "
        f"exact {curve.evals[0].components['exact']:.3f} -> {curve.evals[-1].components['exact']:.3f}; {time.monotonic() - started:.0f}s"
    )


if __name__ == "__main__":
    main()
