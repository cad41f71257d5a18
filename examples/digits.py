"""The toy task: asked "Write some digits.", an agent earns the share of digits in its answer.

    python examples/digits.py                     # starts `burnish up --model tiny` (CPU), trains, stops it
    python examples/digits.py --gateway http://127.0.0.1:8080 --admin-token ...   # against one already up

Each round plays `groups` groups of `size` answers through the gateway with the SDK, posts
their rewards, and waits until the trainer has turned the round's groups into a new
version; then the next round samples from it. It prints the mean reward per round and
writes a PNG plot of it (reward.png). On the embedded tiny model the mean reward rises
from about 0.07 to 0.5-0.75 in 30-40 rounds (a few minutes on two cores).

tests/e2e/test_learning.py runs `play_round` as the proof that the whole loop learns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from burnish import AsyncClient

PROMPT = [{"role": "user", "content": "Write some digits."}]


def digit_share(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


async def play_round(client: AsyncClient, round_no: int, *, groups: int = 2, size: int = 4, policy: str = "agent") -> list[tuple[float, str]]:
    """One round: every answer's reward and the version (X-Policy-Version) that wrote it."""

    async def member(group, g: int, i: int) -> tuple[float, str]:
        t = group.trajectory(f"{group.id}-{i}")
        raw = await t.async_openai(max_retries=0).chat.completions.with_raw_response.create(
            model=policy, messages=PROMPT, temperature=1.0, max_tokens=16,
            # A random model spreads its mass over the whole vocabulary: sample from the top 50
            # (docs/trainer.md). A seed per answer makes a run repeatable given the weights.
            seed=round_no * 1000 + g * 100 + i, extra_body={"top_k": 50},
        )  # fmt: skip
        reward = digit_share(raw.parse().choices[0].message.content or "")
        await t.reward(reward)  # the group closes itself with its last member's reward
        return reward, raw.headers["x-policy-version"]

    sets = [client.group(size=size, id=f"r{round_no}-g{g}-{os.getpid()}") for g in range(groups)]
    return list(await asyncio.gather(*(member(group, g, i) for g, group in enumerate(sets) for i in range(size))))


async def train(client: AsyncClient, rounds: int, groups: int, size: int, play=None, policy: str = "agent", plot: Path | None = None) -> list[float]:
    """Play rounds (``play``: a function like ``play_round``), each time waiting for the trainer."""
    play = play or play_round
    status = await client.status(policy)
    means, trainable, start, per_step = [], 0, status["step"], status["train"]["groups_per_step"]
    for round_no in range(rounds):
        results = await play(client, round_no, groups=groups, size=size, policy=policy)
        rewards = [r for r, _ in results]
        means.append(sum(rewards) / len(rewards))
        # Only groups whose rewards differ are trained (a tie teaches nothing).
        trainable += sum(max(rewards[g * size : (g + 1) * size]) > min(rewards[g * size : (g + 1) * size]) for g in range(groups))
        step = await client.wait_for_step(policy, start + trainable // per_step)
        versions = sorted({v for _, v in results})
        print(f"round {round_no + 1:3d}  mean reward {means[-1]:.3f}  sampled by {', '.join(versions)}  now serving {policy}@{step}", flush=True)
        if plot is not None:
            write_plot(means, plot)
    return means


def write_plot(means: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(means) + 1), means, marker="o", markersize=3)
    ax.set(xlabel="round (one training step each)", ylabel="mean reward", title="digits: reward by round", ylim=(0, 1))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def start_burnish(data_dir: Path, port: int, model: str = "tiny") -> subprocess.Popen:
    """`burnish up` on an embedded model (``tiny``, or ``smollm2``); returns once it says it is up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "burnish_server.cli", "up", "--model", model, "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        print(f"  | {line.rstrip()}", flush=True)
        if "burnish is up" in line:
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("burnish up did not start")


def gateway_arguments(parser: argparse.ArgumentParser, plot: str) -> None:
    """The options every example shares: which gateway, or where to start one, and the plot."""
    parser.add_argument("--gateway", help="a running gateway; default: start `burnish up` here")
    parser.add_argument("--admin-token", default=os.environ.get("BURNISH_ADMIN_TOKEN"))
    parser.add_argument("--data-dir", type=Path, default=Path("burnish-data"), help="for the `burnish up` this starts")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--plot", type=Path, default=Path(plot))


@contextlib.contextmanager
def burnish_running(args: argparse.Namespace, model: str = "tiny") -> Iterator[None]:
    """`burnish up` on ``model`` for the example, unless ``--gateway`` names a running one;
    sets ``args.gateway`` and ``args.admin_token``, and stops what it started."""
    proc = None
    if args.gateway is None:
        proc = start_burnish(args.data_dir, args.port, model)
        args.gateway = f"http://127.0.0.1:{args.port}"
        args.admin_token = args.admin_token or (args.data_dir / "admin-token").read_text().strip()
    try:
        yield
    finally:
        if proc is not None:
            proc.send_signal(2)  # SIGINT: burnish up stops its children cleanly
            proc.wait(timeout=120)


def main(play=None, doc: str = __doc__) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    gateway_arguments(parser, plot="reward.png")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--size", type=int, default=4)
    args = parser.parse_args()

    async def run() -> list[float]:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:  # closes its connections
            return await train(client, args.rounds, args.groups, args.size, play=play, plot=args.plot)

    with burnish_running(args):
        means = asyncio.run(run())
        first, last = sum(means[:5]) / 5, sum(means[-5:]) / 5
        print(f"mean reward: first 5 rounds {first:.3f}, last 5 rounds {last:.3f}; plot in {args.plot}")


if __name__ == "__main__":
    main()
