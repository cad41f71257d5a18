"""A multi-turn agent with a tool, written with the OpenAI Agents SDK, gets better at tasks it
never trained on: SmolLM2-135M-Instruct through `burnish up`, on the CPU.

    python examples/lookup_agent.py             # starts `burnish up` (SmolLM2, CPU), trains, stops it
    python examples/lookup_agent.py --gateway http://127.0.0.1:8080 --admin-token ...   # against one already up

The agent is the Agents SDK's ``Agent`` with one function tool, used as the SDK ships it; the
only change is its client's base URL, which files each run under a trajectory of a group:

    "What is the secret number of the word "violin"? ..."
      turn 1  the model must call lookup(word)          (tool_choice "required": a call, any word)
      tool    lookup answers the word's secret number   (a fresh random number each episode)
      turn 2  the model reads it and answers            (the SDK lets it choose: text or another call)

The answer cannot be reached without the tool: each episode draws its own secret. So the skill
is the agent's loop itself: ask for the right word, then report what the tool said, as asked.
The base model asks for the right word, but answers a tool result by writing it back in the
template's tags (``<tool_response>\n737\n</tool_response>``), or the call again, or at
temperature 1 mostly something else. The words are split once, by a fixed seed, into train
words and held-out words; the held-out ones are played only for evaluation, greedily, by the
version pinned as ``agent@<step>``, marked eval: recorded and rewarded, never trained on.

Rewards: held-out, ``right``: 1 if the answer is the secret number and nothing else (a trailing
period allowed), as the question asks. Train: 0.4 for right, 0.4 for an answer whose last
number is the secret (``found``), 0.2 for a first call that asked for the question's word
(``tool``). The output (and lookup_agent.png) gives each evaluated version's held-out score,
the share of held-out episodes that used the tool right and that found the number, and the
trainer's sequences and splits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

from digits import burnish_running, gateway_arguments  # noqa: I001  (examples/ is run as a folder of scripts)

from burnish import AsyncClient

WORDS = (
    "apple anchor arrow badge basket beacon bottle bridge button candle canyon carpet castle cactus chain cherry circle "
    "cloud clover comet copper cotton crystal dagger desert diamond dragon drum eagle ember engine falcon feather forest "
    "fossil garden garlic glacier globe guitar hammer harbor helmet honey island ivory jacket jungle kettle kite ladder "
    "lantern lemon letter lizard magnet maple marble meadow mirror monkey mountain needle ocean onion orange orchid otter "
    "paddle palace panda parrot pebble pencil pepper piano pillow planet pocket pumpkin puzzle rabbit radio river rocket "
    "saddle salmon shadow shell silver spider spoon statue sugar summer tiger tomato tunnel turtle umbrella valley velvet "
    "violin wagon walnut window winter wizard yogurt zebra"
).split()
SPLIT_SEED = 0
HELD_OUT = 32
PROMPT = 'What is the secret number of the word "{word}"? Look it up, then reply with only the number.'
INSTRUCTIONS = "You answer questions about secret numbers. The lookup tool knows the secret number of each word."
NUMBER = re.compile(r"\d+")
# Sampling temperature of the train episodes: at 1.0 a 135M model's answers are mostly noise.
TEMPERATURE = 0.7
MAX_TOKENS = 40  # a call closes in about 30 tokens; an answer needs 3


def words() -> tuple[list[str], list[str]]:
    """The words, split once into (train, held out) by a fixed seed."""
    shuffled = list(WORDS)
    random.Random(SPLIT_SEED).shuffle(shuffled)
    return shuffled[HELD_OUT:], shuffled[:HELD_OUT]


@dataclass
class Episode:
    word: str
    secret: int
    asked: list[str]  # the words the model looked up, in order
    answer: str

    @property
    def tool(self) -> float:
        """1 if the first call asked for the word of the question."""
        return float(bool(self.asked) and self.asked[0].strip().strip("\"'").lower() == self.word)

    @property
    def found(self) -> float:
        """1 if the answer's last number is the secret."""
        numbers = NUMBER.findall(self.answer)
        return float(bool(numbers) and int(numbers[-1]) == self.secret)

    @property
    def right(self) -> float:
        """1 if the answer is the secret and nothing else, as the question asks."""
        return float(self.answer.strip().removesuffix(".") == str(self.secret))

    @property
    def reward(self) -> float:
        return 0.4 * self.right + 0.4 * self.found + 0.2 * self.tool


async def episode(llm, word: str, secret: int, *, model: str, temperature: float, seed: int) -> Episode:
    """One run of the agent: the Agents SDK, unchanged but for its client's base URL."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
    from agents.exceptions import AgentsException

    asked: list[str] = []
    question_word = word  # the tool's own argument is named `word` too: the name the model sees

    @function_tool
    def lookup(word: str) -> str:
        """Look up the secret number of a word."""
        asked.append(word)
        return str(secret) if word.strip().strip("\"'").lower() == question_word else f"no secret number for {word!r}"

    agent = Agent(
        name="secrets",
        instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model, llm),
        tools=[lookup],
        # The first turn must call a tool; the SDK then lets the model choose (reset_tool_choice).
        model_settings=ModelSettings(tool_choice="required", temperature=temperature, max_tokens=MAX_TOKENS, extra_args={"seed": seed}),
    )
    try:
        result = await Runner.run(agent, PROMPT.format(word=word), max_turns=3)
        answer = str(result.final_output or "")
    except AgentsException:  # it kept calling tools past max_turns: no answer
        answer = ""
    return Episode(word, secret, asked, answer)


async def play_round(client: AsyncClient, round_no: int, train_words: list[str], *, groups: int, size: int, policy: str) -> list[Episode]:
    """``groups`` train words, ``size`` episodes each (one group per word, its secret drawn per episode)."""
    rng = random.Random(round_no)
    picked = [train_words[(round_no * groups + g) % len(train_words)] for g in range(groups)]

    async def member(group, word: str, secret: int, i: int) -> Episode:
        t = group.trajectory(f"{group.id}-{i}")
        played = await episode(t.async_openai(max_retries=0), word, secret, model=policy, temperature=TEMPERATURE, seed=round_no * 1000 + i)
        await t.reward(played.reward, right=played.right, found=played.found, tool=played.tool)  # the last reward closes the group
        return played

    sets = [(client.group(size=size, id=f"lookup-r{round_no}-g{g}-{os.getpid()}"), word) for g, word in enumerate(picked)]
    secrets = [[rng.randint(100, 999) for _ in range(size)] for _ in sets]
    return list(await asyncio.gather(*(member(group, word, secrets[g][i], i) for g, (group, word) in enumerate(sets) for i in range(size))))


async def evaluate(client: AsyncClient, step: int, held_out: list[str], *, policy: str) -> tuple[float, float, float]:
    """Every held-out word once, greedy, by ``policy@step`` (pinned), in one eval group: the
    version's held-out score as the gateway keeps it, and the shares that used the tool right
    and that found the number."""
    group = client.group(id=f"lookup-eval-{policy}-{step}-{os.getpid()}", eval=True)
    rng = random.Random(1_000_000 + step)
    secrets = [rng.randint(100, 999) for _ in held_out]

    async def member(i: int, word: str) -> Episode:
        t = group.trajectory(f"{group.id}-{i}")
        played = await episode(t.async_openai(max_retries=0), word, secrets[i], model=f"{policy}@{step}", temperature=0.0, seed=i)
        await t.reward(played.right, found=played.found, tool=played.tool)
        return played

    played = await asyncio.gather(*(member(i, w) for i, w in enumerate(held_out)))
    scores = {entry["step"]: entry for entry in (await client.eval_scores(policy))["data"]}
    return scores[step]["score"], sum(e.tool for e in played) / len(played), sum(e.found for e in played) / len(played)


async def train(client: AsyncClient, args: argparse.Namespace) -> dict[str, list]:
    train_words, held_out = words()
    status = await client.status(args.policy)
    step, per_step = status["step"], status["train"]["groups_per_step"]
    curve: dict[str, list] = {"round_reward": [], "eval": []}
    t0 = time.monotonic()
    score, tool, found = await evaluate(client, step, held_out, policy=args.policy)
    curve["eval"].append((0, step, score, tool))
    print(
        f"{args.policy}@{step} (before training) on {len(held_out)} held-out words: right {score:.3f}, found {found:.3f}, tool used right {tool:.3f}",
        flush=True,
    )
    trainable = 0
    for round_no in range(args.rounds):
        results = await play_round(client, round_no, train_words, groups=args.groups, size=args.size, policy=args.policy)
        rewards = [e.reward for e in results]
        curve["round_reward"].append(sum(rewards) / len(rewards))
        trainable += sum(max(rewards[g * args.size : (g + 1) * args.size]) > min(rewards[g * args.size : (g + 1) * args.size]) for g in range(args.groups))
        step = await client.wait_for_step(args.policy, status["step"] + trainable // per_step)
        right = sum(e.right for e in results) / len(results)
        line = f"round {round_no + 1:3d}  train reward {curve['round_reward'][-1]:.3f} (right {right:.3f})  now serving {args.policy}@{step}  {time.monotonic() - t0:5.0f}s"
        if (round_no + 1) % args.eval_every == 0 or round_no + 1 == args.rounds:
            score, tool, found = await evaluate(client, step, held_out, policy=args.policy)
            curve["eval"].append((round_no + 1, step, score, tool))
            line += f"  held-out: right {score:.3f}, found {found:.3f}, tool used right {tool:.3f}"
        print(line, flush=True)
        if args.plot is not None:
            write_plot(curve, args.plot)
    return curve


def write_plot(curve: dict[str, list], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(range(1, len(curve["round_reward"]) + 1), curve["round_reward"], marker="o", markersize=2, label="train reward (right, found, tool)")
    evals = curve["eval"]
    ax.plot([r for r, *_ in evals], [s for _, _, s, _ in evals], marker="s", label="held-out score (right: only the number)")
    ax.plot([r for r, *_ in evals], [t for *_, t in evals], marker="^", linestyle=":", label="held-out: tool used right")
    for r, step, s, _ in evals:
        ax.annotate(f"@{step}", (r, s), textcoords="offset points", xytext=(0, 5), fontsize=7, ha="center")
    ax.set(xlabel="round", ylabel="score", title="SmolLM2-135M, an Agents SDK agent with a lookup tool", ylim=(0, 1.05))
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    import agents

    agents.set_tracing_disabled(True)  # the SDK's tracing exports to OpenAI by default
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gateway_arguments(parser, plot="lookup_agent.png")
    parser.add_argument("--policy", default="agent")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument(
        "--held-ratio", choices=("trainer", "recorded"), help="train.held_ratio for the run (docs/trainer.md, the ratio under a grammar); default: the policy's"
    )
    args = parser.parse_args()

    async def run() -> dict[str, list]:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:
            if args.held_ratio is not None:
                await client.update_policy(args.policy, train={"held_ratio": args.held_ratio})
            curve = await train(client, args)
            print("base against now:", await client.compare(args.policy))
            print("trainer:", await merge_report(client, args.policy))
            return curve

    started = time.monotonic()
    with burnish_running(args, model="smollm2"):
        curve = asyncio.run(run())
        (_, first_step, first, _), (_, last_step, last, _) = curve["eval"][0], curve["eval"][-1]
        print(
            f"held-out score: {args.policy}@{first_step} {first:.3f} -> {args.policy}@{last_step} {last:.3f} "
            f"in {time.monotonic() - started:.0f}s; plot in {args.plot}"
        )


async def merge_report(client: AsyncClient, policy: str) -> dict[str, float]:
    """Over every step so far: sequences trained, calls merged into a sequence before them, and splits."""
    history = (await client.metrics(policy))["data"]
    return {key: sum(m.get(key, 0) for m in history) for key in ("sequences", "sequence_splits", "untokenized_calls")}


if __name__ == "__main__":
    main()
