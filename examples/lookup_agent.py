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

More ways to run it:

    python examples/lookup_agent.py --task choose        # two tools; the question says which one answers
    python examples/lookup_agent.py --objective distill  # no reward: a teacher shown one worked episode
    python examples/lookup_agent.py --count              # before training: the base's answers, and the teacher's

``--task choose`` asks for a word's secret number or its secret colour, with a tool for each
whose name does not say which (``lookup_a``, ``lookup_b``; their descriptions do): the first
call must pick the one the question needs, so what is learned sits in the tool call's own
tokens, which vLLM samples under the tool grammar (docs/trainer.md, "The ratio under a
grammar"). ``--objective distill`` trains on the teacher alone (``train.teacher``: the
policy's base, shown before each conversation one worked episode with its tool call, the
tool's result and the bare answer); the rewards only score.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from digits import burnish_running, gateway_arguments  # noqa: I001  (examples/ is run as a folder of scripts)

from burnish import AsyncClient, Score

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
# --task choose: the question names what is asked; a tool per kind.
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white")
CHOOSE_PROMPT = 'What is the secret {kind} of the word "{word}"? Look it up, then reply with only the {kind}.'
CHOOSE_INSTRUCTIONS = "You answer questions about secret numbers and secret colours. The tools know both for each word."
VALUE = re.compile(r"\d+|[a-z]+")
# The teacher's worked episode (--objective distill), on a word outside WORDS: nothing held out leaks in.
WORKED = ("trumpet", "358")
# Sampling temperature of the train episodes: at 1.0 a 135M model's answers are mostly noise.
TEMPERATURE = 0.7
MAX_TOKENS = 40  # a call closes in about 30 tokens; an answer needs 3


def words() -> tuple[list[str], list[str]]:
    """The words, split once into (train, held out) by a fixed seed."""
    shuffled = list(WORDS)
    random.Random(SPLIT_SEED).shuffle(shuffled)
    return shuffled[HELD_OUT:], shuffled[:HELD_OUT]


# What each tool looks up: the tool's description and its "no secret ..." answer say it.
LOOKS_UP = {"lookup": "number", "lookup_a": "number", "lookup_b": "colour"}


@dataclass(frozen=True)
class Question:
    """One episode's task: the word, what is asked of it, and its secret."""

    word: str
    secret: str  # a number, or with --task choose a colour
    kind: str = ""  # "number" or "colour" with --task choose; "" for the lookup task

    @property
    def tools(self) -> tuple[str, ...]:
        return ("lookup_a", "lookup_b") if self.kind else ("lookup",)

    @property
    def wanted(self) -> str:
        """The tool that answers it."""
        return next(t for t in self.tools if LOOKS_UP[t] == (self.kind or "number"))

    @property
    def prompt(self) -> str:
        return CHOOSE_PROMPT.format(kind=self.kind, word=self.word) if self.kind else PROMPT.format(word=self.word)

    @property
    def instructions(self) -> str:
        return CHOOSE_INSTRUCTIONS if self.kind else INSTRUCTIONS


def question(task: str, word: str, rng: random.Random) -> Question:
    """A fresh secret for ``word``; with ``choose`` a kind too."""
    if task == "lookup":
        return Question(word, str(rng.randint(100, 999)))
    kind = rng.choice(("number", "colour"))
    return Question(word, str(rng.randint(100, 999)) if kind == "number" else rng.choice(COLOURS), kind)


@dataclass
class Episode:
    question: Question
    asked: list[tuple[str, str]]  # the (tool, word) the model called, in order
    answer: str

    @property
    def tool(self) -> float:
        """1 if the first call asked the right tool for the word of the question."""
        return float(bool(self.asked) and self.asked[0] == (self.question.wanted, self.question.word))

    @property
    def found(self) -> float:
        """1 if the answer's last number or colour is the secret."""
        values = [v for v in VALUE.findall(self.answer.lower()) if v.isdigit() or v in COLOURS]
        return float(bool(values) and values[-1] == self.question.secret)

    @property
    def right(self) -> float:
        """1 if the answer is the secret and nothing else, as the question asks."""
        return float(self.answer.strip().removesuffix(".").lower() == self.question.secret)

    @property
    def reward(self) -> float:
        return 0.4 * self.right + 0.4 * self.found + 0.2 * self.tool


def tools(q: Question, asked: list[tuple[str, str]]) -> list:
    """The Agents SDK function tools for ``q``; each call is noted in ``asked``."""
    from agents import function_tool

    def answer(tool: str, word: str) -> str:
        word = word.strip().strip("\"'").lower()
        asked.append((tool, word))
        return q.secret if (tool, word) == (q.wanted, q.word) else f"no secret {LOOKS_UP[tool]} for {word!r}"

    # The tools' own argument is named `word`: the name the model sees.
    def lookup(word: str) -> str:
        return answer("lookup", word)

    def lookup_a(word: str) -> str:
        return answer("lookup_a", word)

    def lookup_b(word: str) -> str:
        return answer("lookup_b", word)

    made = {"lookup": lookup, "lookup_a": lookup_a, "lookup_b": lookup_b}
    return [function_tool(made[name], description_override=f"Look up the secret {LOOKS_UP[name]} of a word.") for name in q.tools]


async def episode(llm, q: Question, *, model: str, temperature: float, seed: int, then: Callable[[Episode], str] | None = None) -> Episode:
    """One run of the agent: the Agents SDK, unchanged but for its client's base URL. ``then``:
    what the user says next, given the episode, sent as the conversation's next turn (its reply
    is not looked at: it is what production traffic sends after an answer)."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner
    from agents.exceptions import AgentsException

    asked: list[tuple[str, str]] = []
    agent = Agent(
        name="secrets",
        instructions=q.instructions,
        model=OpenAIChatCompletionsModel(model, llm),
        tools=tools(q, asked),
        # The first turn must call a tool; the SDK then lets the model choose (reset_tool_choice).
        model_settings=ModelSettings(tool_choice="required", temperature=temperature, max_tokens=MAX_TOKENS, extra_args={"seed": seed}),
    )
    try:
        result = await Runner.run(agent, q.prompt, max_turns=3)
        final = str(result.final_output or "")
    except AgentsException:  # it kept calling tools past max_turns: no answer
        return Episode(q, asked, "")
    played = Episode(q, asked, final)
    if then is not None:
        told = agent.clone(model_settings=ModelSettings(temperature=temperature, max_tokens=MAX_TOKENS, extra_args={"seed": seed}))
        with contextlib.suppress(AgentsException):  # a tool call where a reply was due: the turn was sent all the same
            await Runner.run(told, [*result.to_input_list(), {"role": "user", "content": then(played)}], max_turns=1)
    return played


def next_turn(played: Episode) -> str:
    """What a user says after the agent's answer: thanks where it is what was asked, else what was wanted."""
    q = played.question
    if played.right:
        return "Thanks."
    if played.found:
        return f"Right, but reply with only the {q.kind or 'number'}: {q.secret}"
    return f'No, the secret {q.kind or "number"} of "{q.word}" is {q.secret}. Reply with only the {q.kind or "number"}.'


class LookupTask:
    """The task as an environment of the SDK's runner (burnish.tasks): train problems are words (a
    fresh secret each time one is played), held-out ones fixed questions. examples/production.py
    plays it as traffic."""

    def __init__(self, task: str = "lookup") -> None:
        train_words, held_out = words()
        rng = random.Random(1_000_000)
        self.name, self.task = task, task
        self._split = (train_words, [question(task, word, rng) for word in held_out])
        self._rng = random.Random(0)

    def split(self) -> tuple[list, list]:
        return self._split

    def question(self, problem: str | Question) -> Question:
        return problem if isinstance(problem, Question) else question(self.task, problem, self._rng)

    async def play(self, chat, problem: str | Question) -> Score:
        played = await episode(chat.client, self.question(problem), model=chat.model, temperature=chat.sampling.temperature, seed=chat.sampling.seed or 0)
        chat.replies.append(played.answer)  # the agent's answer, as chat() would keep it
        figures = {"found": played.found, "tool": played.tool}
        return Score(played.right, figures) if chat.held_out else Score(played.reward, {"right": played.right, **figures})


def looked_up(q: Question, call_id: str = "call_0") -> list[dict]:
    """``q`` asked, the right tool called and its answer, as chat messages: an episode up to its answer."""
    call = {"id": call_id, "type": "function", "function": {"name": q.wanted, "arguments": f'{{"word": "{q.word}"}}'}}
    return [
        {"role": "user", "content": q.prompt},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": q.secret},
    ]


def worked_episode(task: str) -> list[dict]:
    """The teacher's context: one episode played right, as chat messages with the tool call and its result."""
    q = Question(*WORKED, "number" if task == "choose" else "")
    return [*looked_up(q, "call_worked"), {"role": "assistant", "content": q.secret}]


async def count(client: AsyncClient, held_out: list[str], *, policy: str, task: str) -> None:
    """Before training (--count): how often the base, greedy, answers a held-out episode's tool
    result as asked, alone and shown the teacher's worked episode first (what the teacher sees)."""
    rng = random.Random(7)
    questions = [question(task, word, rng) for word in held_out]

    async def answer(q: Question, context: list[dict]) -> str:
        # The tools as the Agents SDK offers them to the model.
        offered = [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.params_json_schema}} for t in tools(q, [])]
        messages = [{"role": "system", "content": q.instructions}, *context, *looked_up(q)]
        llm = client.trajectory().async_openai(max_retries=0)
        reply = await llm.chat.completions.create(model=f"{policy}@0", messages=messages, tools=offered, temperature=0, max_tokens=MAX_TOKENS)
        return reply.choices[0].message.content or ""

    for name, context in (("the base", []), ("the teacher (the base shown the worked episode)", worked_episode(task))):
        answers = await asyncio.gather(*(answer(q, context) for q in questions))
        right = sum(int(Episode(q, [], a).right) for q, a in zip(questions, answers))
        print(f"{name}, greedy, after the tool's result: {right} of {len(questions)} answers are the secret alone; e.g. {answers[:3]}", flush=True)


async def play_round(client: AsyncClient, round_no: int, train_words: list[str], *, groups: int, size: int, policy: str, task: str) -> list[Episode]:
    """``groups`` train words, ``size`` episodes each (one group per word, its secret, and with
    ``choose`` its kind, drawn per episode)."""
    rng = random.Random(round_no)
    picked = [train_words[(round_no * groups + g) % len(train_words)] for g in range(groups)]

    async def member(group, q: Question, i: int) -> Episode:
        t = group.trajectory(f"{group.id}-{i}")
        played = await episode(t.async_openai(max_retries=0), q, model=policy, temperature=TEMPERATURE, seed=round_no * 1000 + i)
        await t.reward(played.reward, right=played.right, found=played.found, tool=played.tool)  # the last reward closes the group
        return played

    sets = [(client.group(size=size, id=f"lookup-r{round_no}-g{g}-{os.getpid()}"), word) for g, word in enumerate(picked)]
    questions = [[question(task, word, rng) for _ in range(size)] for _, word in sets]
    return list(await asyncio.gather(*(member(group, questions[g][i], i) for g, (group, _) in enumerate(sets) for i in range(size))))


async def evaluate(client: AsyncClient, step: int, held_out: list[str], *, policy: str, task: str) -> tuple[float, float, float]:
    """Every held-out word once, greedy, by ``policy@step`` (pinned), in one eval group: the
    version's held-out score as the gateway keeps it, and the shares that used the tool right
    and that found the secret."""
    group = client.group(id=f"lookup-eval-{policy}-{step}-{os.getpid()}", eval=True)
    rng = random.Random(1_000_000 + step)
    questions = [question(task, word, rng) for word in held_out]

    async def member(i: int, word: str) -> Episode:
        t = group.trajectory(f"{group.id}-{i}")
        played = await episode(t.async_openai(max_retries=0), questions[i], model=f"{policy}@{step}", temperature=0.0, seed=i)
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
    score, tool, found = await evaluate(client, step, held_out, policy=args.policy, task=args.task)
    curve["eval"].append((0, step, score, tool))
    print(
        f"{args.policy}@{step} (before training) on {len(held_out)} held-out words: right {score:.3f}, found {found:.3f}, tool used right {tool:.3f}",
        flush=True,
    )
    trainable = 0
    for round_no in range(args.rounds):
        results = await play_round(client, round_no, train_words, groups=args.groups, size=args.size, policy=args.policy, task=args.task)
        rewards = [e.reward for e in results]
        curve["round_reward"].append(sum(rewards) / len(rewards))
        # GRPO learns from groups whose rewards differ; the teacher from every group.
        tied = [max(rewards[g * args.size : (g + 1) * args.size]) == min(rewards[g * args.size : (g + 1) * args.size]) for g in range(args.groups)]
        trainable += sum(args.objective != "grpo" or not t for t in tied)
        step = await client.wait_for_step(args.policy, status["step"] + trainable // per_step)
        right = sum(e.right for e in results) / len(results)
        line = f"round {round_no + 1:3d}  train reward {curve['round_reward'][-1]:.3f} (right {right:.3f})  now serving {args.policy}@{step}  {time.monotonic() - t0:5.0f}s"
        if (round_no + 1) % args.eval_every == 0 or round_no + 1 == args.rounds:
            score, tool, found = await evaluate(client, step, held_out, policy=args.policy, task=args.task)
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
    parser.add_argument("--task", choices=("lookup", "choose"), default="lookup", help="choose: two tools, the question names which")
    parser.add_argument("--objective", choices=("grpo", "distill"), default="grpo", help="distill: the base shown one worked episode teaches")
    parser.add_argument("--count", action="store_true", help="only count the base's and the teacher's right answers on the held-out words")
    args = parser.parse_args()

    async def run() -> dict[str, list]:
        async with AsyncClient(args.gateway, admin_token=args.admin_token) as client:
            train_settings: dict = {} if args.held_ratio is None else {"held_ratio": args.held_ratio}
            if args.objective == "distill":
                train_settings |= {"objective": "distill", "teacher": {"context": worked_episode(args.task)}}
            if train_settings:
                await client.update_policy(args.policy, train=train_settings)
            if args.count:
                await count(client, words()[1], policy=args.policy, task=args.task)
                return {"eval": []}
            curve = await train(client, args)
            print("base against now:", await client.compare(args.policy))
            print("trainer:", await merge_report(client, args.policy))
            return curve

    started = time.monotonic()
    with burnish_running(args, model="smollm2"):
        curve = asyncio.run(run())
        if args.count:
            return
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
