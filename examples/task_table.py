"""What `burnish up`'s defaults learn on tasks no one here wrote: reasoning-gym, scored by its own verifiers.

    python examples/task_table.py --task products           # one row: a fresh `burnish up` (SmolLM2, CPU), 20 minutes
    python examples/task_table.py                           # every row, one after another (hours; keep the machine quiet)
    python examples/task_table.py --task products --teach   # the teach lever: the teacher shown worked examples
    python examples/task_table.py --task products --set tis_cap=2 --label tis2   # a policy setting changed for the run
    python examples/task_table.py --task GuessTheNumber-v0 --teach   # beside the table: a TextArena game, taught
    python examples/task_table.py --table                   # the table, from the runs written so far
    BURNISH_TRAINER_PROMPT_SHARING=off python examples/task_table.py --task ransom_note   # the trainer as the first rows had it

Each row is one reasoning-gym task at a difficulty (its generator's own settings, below) where
SmolLM2-135M's base scores between 0.05 and 0.6 on 64 held-out questions, greedy: fixed by
a survey of the base before any training (docs/notes/learning-runs.md). A row's run starts
`burnish up` on the embedded default in a fresh data directory, changes nothing unless
``--set`` or ``--teach`` says so, and runs the SDK's task runner (``burnish.tasks``) for
``--minutes`` of playing and training, the held-out score taken before, and every
``--eval-minutes``. Each run's figures go to ``runs/<task>[-<label>].json``: the curve, the
steps and groups trained, and the policy's health at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from digits import burnish_running  # noqa: I001  (examples/ is run as a folder of scripts)

from burnish import AsyncClient
from burnish.tasks import Schedule, teach, train
from burnish.tasks.cli import load, setting
from burnish.tasks.runner import GROUP_SIZE, MAX_TOKENS, TEMPERATURE


@dataclass(frozen=True)
class Row:
    task: str
    shape: str
    config: dict[str, Any]
    suite: str = "reasoning-gym"
    max_tokens: int = MAX_TOKENS


# Fixed from a survey of the base (70 task settings, docs/notes/learning-runs.md) before any run:
# each task's settings put the base's held-out score in 0.05-0.6. The base's scores in that survey:
# products 0.109, spell_backward 0.089, word_sorting 0.055, syllogism 0.079, letter_jumble 0.188,
# knights_knaves 0.148, calendar_arithmetic 0.422, ransom_note 0.516, course_schedule 0.562,
# mahjong_puzzle 0.297.
TABLE = (
    Row("products", "arithmetic", {"min_digits": 1, "max_digits": 1}),
    Row("spell_backward", "string edit", {"min_word_len": 3, "max_word_len": 3}),
    Row("word_sorting", "sorting", {"min_words": 2, "max_words": 2, "min_word_length": 3, "max_word_length": 4}),
    Row("syllogism", "logic", {"allow_some": False, "allow_some_not": False}),
    Row(
        "letter_jumble",
        "string edit",
        {"min_words": 1, "max_words": 1, "min_word_len": 3, "max_word_len": 4, "min_corruption_level": 0.1, "max_corruption_level": 0.3},
    ),
    Row("knights_knaves", "logic", {}),
    Row("calendar_arithmetic", "arithmetic (a rule)", {"tasks": ["is_leap_year"]}),
    Row("ransom_note", "counting", {}),
    Row("course_schedule", "multi-step (a graph)", {}),
    Row("mahjong_puzzle", "multi-step (a state over rounds)", {}),
)
# Beside the table: a multi-turn game (TextArena), whose moves are short.
GAMES = (Row("GuessTheNumber-v0", "multi-turn game", {}, suite="textarena", max_tokens=16),)


def run_row(args: argparse.Namespace, row: Row) -> dict[str, Any]:
    name = row.task + (f"-{args.label}" if args.label else "")
    args.data_dir = args.runs / "data" / name
    shutil.rmtree(args.data_dir, ignore_errors=True)
    args.gateway, args.admin_token = None, None
    env = load(row.suite, row.task, row.config, {})

    async def run() -> dict[str, Any]:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:
            if args.set:
                await client.update_policy(args.policy, train=dict(args.set))
            if args.teach:
                await teach(client, args.policy, env, args.teach)  # type: ignore[arg-type]
            schedule = Schedule(
                minutes=args.minutes, eval_minutes=args.eval_minutes, ahead=args.ahead, size=args.size,
                temperature=args.temperature, max_tokens=args.max_tokens or row.max_tokens,
            )  # fmt: skip
            curve = await train(client, env, args.policy, schedule, plot=args.runs / f"{name}.png")
            status = await client.status(args.policy)
            metrics = (await client.metrics(args.policy))["data"]
            return {
                "task": row.task, "shape": row.shape, "config": row.config, "label": args.label, "teach": args.teach, "set": dict(args.set), "ahead": args.ahead,
                "size": args.size, "temperature": args.temperature, "max_tokens": schedule.max_tokens,
                "curve": json.loads(curve.to_json()), "steps": status["step"], "groups_trained": status["groups_trained"],
                "health": status["health"], "train": status["train"], "metrics": metrics,
                "prompt_sharing": os.environ.get("BURNISH_TRAINER_PROMPT_SHARING", "auto"),
            }  # fmt: skip

    started = time.monotonic()
    with burnish_running(args, model="smollm2"):
        figures = asyncio.run(run())
    figures["wall_s"] = round(time.monotonic() - started)
    (args.runs / f"{name}.json").write_text(json.dumps(figures, indent=1))
    shutil.rmtree(args.data_dir, ignore_errors=True)  # its models and database: a gigabyte a run
    return figures


def table(runs: Path) -> str:
    """The runs written so far, one line each: held-out before, after 10 and after 20 minutes."""
    lines = ["| task | shape | settings | run | base | 10 min | 20 min | steps | groups | health |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(runs.glob("*.json")):
        r = json.loads(path.read_text())
        evals = r["curve"]["evals"]
        at = [next((f"{e['score']:.3f} (@{e['step']})" for e in evals if e["minutes"] >= m), "-") for m in (10, 20)]
        run = r["label"] or ("teach" if r["teach"] else "defaults")
        warning = (r["health"] or {}).get("warning") or "ok"
        settings = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        lines.append(
            f"| {r['task']} | {r['shape']} | {settings} | {run} | {evals[0]['score']:.3f} | {at[0]} | {at[1]} | {r['steps']} | {r['groups_trained']} | {warning} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", help="a row of the table (repeatable); default: every row")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--eval-minutes", type=float, default=10.0)
    parser.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE", help="a train setting of the policy")
    parser.add_argument("--teach", type=int, nargs="?", const=3, metavar="N", help="the teacher shown N worked examples (3), GRPO + distillation")
    parser.add_argument("--ahead", type=int, default=0, help="steps the runner plays ahead of the trainer (stale calls)")
    parser.add_argument("--size", type=int, default=GROUP_SIZE, help="answers a question (the runner's group size)")
    parser.add_argument("--temperature", type=float, default=TEMPERATURE, help="of the train answers")
    parser.add_argument("--max-tokens", type=int, help="an answer's budget (default: the row's)")
    parser.add_argument("--label", help="names this run's files beside the defaults' (with --set)")
    parser.add_argument("--table", action="store_true", help="print the table of the runs so far and stop")
    parser.add_argument("--again", action="store_true", help="run a row again even where its figures are written")
    parser.add_argument("--policy", default="agent")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    args.runs.mkdir(exist_ok=True)
    if args.teach and not args.label:
        args.label = "teach"
    if not args.table:
        rows = list(TABLE) if args.task is None else [r for r in (*TABLE, *GAMES) if r.task in args.task]
        if args.task and len(rows) != len(args.task):
            raise SystemExit(f"unknown task: one of {', '.join(r.task for r in (*TABLE, *GAMES))}")
        for row in rows:
            if (args.runs / f"{row.task}{f'-{args.label}' if args.label else ''}.json").exists() and not args.again:
                print(f"{row.task}: measured already (--again to measure it again)", flush=True)
                continue
            figures = run_row(args, row)
            points = [f"{e['score']:.3f} (@{e['step']}, {e['minutes']:.0f} min)" for e in figures["curve"]["evals"]]
            print(f"{row.task}: {' -> '.join(points)}", flush=True)
    print(table(args.runs))


if __name__ == "__main__":
    main()
