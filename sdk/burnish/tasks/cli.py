"""``burnish-tasks``: a task suite trained or evaluated against a policy, from the shell.

    burnish-tasks train reasoning-gym gcd --set max_value=50 --minutes 20 --plot gcd.png
    burnish-tasks eval reasoning-gym gcd --set max_value=50 --step 0
    burnish-tasks train textarena GuessTheNumber-v0 --minutes 20
    burnish-tasks train my_suite:make_env my-task          # your own adapter (docs/environments.md)

The gateway is ``--gateway`` (default http://127.0.0.1:8080); the admin token is
``--admin-token``, else ``$BURNISH_ADMIN_TOKEN``, else the file ``burnish up`` writes in its
data directory (``--data-dir``, default ./burnish-data).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import httpx

from burnish._api import BurnishError, MissingAdminToken
from burnish.client import AsyncClient
from burnish.tasks.environment import Environment, TaskError, Teachable
from burnish.tasks.runner import EVAL_CONCURRENCY, GROUP_SIZE, MAX_TOKENS, TEMPERATURE, WORKED_EXAMPLES, Schedule, evaluate, teach, teacher_score, train

# The suites that come with the SDK, by the name the command takes.
SUITES = {"reasoning-gym": "burnish.tasks.reasoning_gym:ReasoningGym", "textarena": "burnish.tasks.textarena:TextArena"}


def setting(text: str) -> tuple[str, Any]:
    """``name=value``: the value read as JSON where it is JSON (numbers, lists), else as text."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def load(suite: str, task: str, config: dict[str, Any], options: dict[str, Any]) -> Environment:
    """The environment: ``factory(task, config, **options)``, the factory named by ``suite``
    (one of SUITES, or ``module:callable``)."""
    module, _, name = SUITES.get(suite, suite).partition(":")
    if not name:
        raise SystemExit(f"unknown suite {suite!r}: one of {', '.join(SUITES)}, or module:callable")
    sys.path.insert(0, os.getcwd())  # a user's adapter module beside where they run the command
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise TaskError(f"cannot load the suite {suite!r} ({exc}): name one of {', '.join(SUITES)}, or module:callable importable from here") from None
    env: Environment = factory(task, config, **{k: v for k, v in options.items() if v is not None})
    return env


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="burnish-tasks", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("train", "eval"):
        p = commands.add_parser(command)
        p.add_argument("suite", help=f"one of {', '.join(SUITES)}, or module:callable")
        p.add_argument("task", help="the suite's task: a reasoning-gym dataset name, a TextArena game id")
        p.add_argument("--set", dest="config", type=setting, action="append", default=[], metavar="NAME=VALUE", help="a generator setting")
        p.add_argument("--policy", default="agent")
        p.add_argument("--gateway", default=os.environ.get("BURNISH_GATEWAY", "http://127.0.0.1:8080"))
        p.add_argument("--admin-token", default=os.environ.get("BURNISH_ADMIN_TOKEN"))
        p.add_argument("--data-dir", type=Path, default=Path("burnish-data"), help="where `burnish up` wrote its admin token")
        p.add_argument("--held-out", type=int, help="held-out problems (the suite's default otherwise)")
        p.add_argument("--instruction", help="said after each question (reasoning-gym)")
        p.add_argument("--system", help="a system prompt (reasoning-gym)")
        p.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
        p.add_argument("--out", type=Path, help="write the run's figures here (JSON)")
        if command == "eval":
            p.add_argument("--step", type=int, action="append", help="a version to score (repeatable); default: the one served")
            p.add_argument(
                "--teacher", type=int, nargs="?", const=WORKED_EXAMPLES, metavar="N",
                help=f"also score the teach lever's teacher: the base shown N worked examples (default {WORKED_EXAMPLES})",
            )  # fmt: skip
            continue
        p.add_argument("--binary", action="store_true", default=None, help="train on right or wrong, not part marks (reasoning-gym)")
        p.add_argument("--minutes", type=float, default=20.0, help="minutes of playing and training (evaluation not counted)")
        p.add_argument("--rounds", type=int, help="stop after this many rounds instead")
        p.add_argument("--eval-minutes", type=float, default=10.0, help="held-out every this many minutes")
        p.add_argument("--eval-every", type=int, help="held-out every this many rounds instead")
        p.add_argument("--size", type=int, default=GROUP_SIZE, help="answers per problem (a group)")
        p.add_argument("--groups", type=int, help="groups a round (default: the policy's groups a step)")
        p.add_argument("--temperature", type=float, default=TEMPERATURE)
        p.add_argument("--ahead", type=int, default=0, metavar="N", help="steps to play ahead of the trainer (calls up to N versions stale)")
        p.add_argument("--plot", type=Path, help="draw the curve here (PNG)")
        p.add_argument(
            "--teach", type=int, nargs="?", const=WORKED_EXAMPLES, metavar="N",
            help=f"show the policy's teacher N worked examples (default {WORKED_EXAMPLES}) and add distillation from it to the objective",
        )  # fmt: skip
    return parser


def teachable(env: Environment, suite: str, option: str) -> Teachable:
    """``env``, where it can show a teacher worked examples (the teach lever)."""
    if not hasattr(env, "worked_examples"):
        raise SystemExit(f"{suite} cannot show worked examples: {option} needs an environment with worked_examples()")
    return cast(Teachable, env)


def admin_token(args: argparse.Namespace) -> str | None:
    if args.admin_token:
        return str(args.admin_token)
    path = args.data_dir / "admin-token"
    return path.read_text().strip() if path.exists() else None


async def run(args: argparse.Namespace) -> Any:
    options = {"held_out": args.held_out, "instruction": args.instruction, "system": args.system, "binary": getattr(args, "binary", None)}
    env = load(args.suite, args.task, dict(args.config), options)
    async with AsyncClient(args.gateway, admin_token=admin_token(args)) as client:
        if args.command == "train":
            rounds_given = args.rounds is not None
            schedule = Schedule(
                rounds=args.rounds, minutes=None if rounds_given else args.minutes,
                eval_every=args.eval_every, eval_minutes=None if args.eval_every else args.eval_minutes,
                groups=args.groups, ahead=args.ahead, size=args.size, temperature=args.temperature, max_tokens=args.max_tokens,
            )  # fmt: skip
            if args.teach:
                await teach(client, args.policy, teachable(env, args.suite, "--teach"), args.teach)
            curve = await train(client, env, args.policy, schedule, plot=args.plot)
            first, last = curve.evals[0], curve.evals[-1]
            print(f"{env.name}: held-out {first.score:.3f} (@{first.step}) -> {last.score:.3f} (@{last.step}) in {last.minutes:.1f} min of training")
            return json.loads(curve.to_json())
        steps = args.step or [(await client.status(args.policy))["step"]]
        _, held_out = env.split()
        schedule = Schedule(rounds=0, max_tokens=args.max_tokens, eval_concurrency=EVAL_CONCURRENCY)
        scores = {}
        for step in steps:
            score, components, replies = await evaluate(client, env, held_out, args.policy, step, schedule)
            print(f"{env.name} {args.policy}@{step}: held-out {score:.3f} on {len(held_out)}" + "".join(f", {k} {v:.3f}" for k, v in components.items()))
            scores[step] = {"score": score, "components": components, "replies": replies}
        figures = {"task": env.name, "policy": args.policy, "held_out": len(held_out), "scores": scores}
        if args.teacher:
            score, replies = await teacher_score(client, teachable(env, args.suite, "--teacher"), args.policy, args.teacher, schedule)
            print(f"{env.name} the teacher ({args.policy}@0 shown {args.teacher} worked examples): held-out {score:.3f} on {len(held_out)}")
            figures["teacher"] = {"score": score, "examples": args.teacher, "replies": replies}
        return figures


def failure(exc: Exception, args: argparse.Namespace) -> str:
    """One line for what stopped the command, with the fix."""
    if isinstance(exc, httpx.TransportError):
        return f"no gateway answers at {args.gateway} ({type(exc).__name__}): start one with `burnish up`, or name yours with --gateway"
    if isinstance(exc, BurnishError) and exc.status in (401, 403):
        return f"the gateway refused the admin token ({exc.message}): pass --admin-token, set BURNISH_ADMIN_TOKEN, or point --data-dir at burnish up's"
    if isinstance(exc, BurnishError) and exc.code == "policy_not_found":
        return f"{exc.message}: `burnish status` lists the policies; name one with --policy"
    if isinstance(exc, BurnishError):
        return f"the gateway answered {exc.status}: {exc.message}"
    if isinstance(exc, MissingAdminToken):
        return f"no admin token: pass --admin-token, set BURNISH_ADMIN_TOKEN, or point --data-dir at the folder burnish up wrote admin-token in (looked in {args.data_dir})"
    return str(exc)


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    try:
        figures = asyncio.run(run(args))
    except (TaskError, MissingAdminToken, BurnishError, httpx.TransportError, ImportError) as exc:
        sys.exit(f"burnish-tasks: {failure(exc, args)}")
    if args.out is not None:
        args.out.write_text(json.dumps({"suite": args.suite, "config": dict(args.config), **figures}, indent=1))


if __name__ == "__main__":
    main()
