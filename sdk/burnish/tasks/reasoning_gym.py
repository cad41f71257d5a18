"""reasoning-gym's tasks as environments: its generators' questions, scored by its own ``score_answer``.

    env = ReasoningGym("gcd", {"max_value": 50})     # the generator's own settings, as its config names them
    train, held_out = env.split()                      # train from one seed, held out from another

reasoning-gym (``pip install 'burnish-sdk[reasoning-gym]'``) makes each question from a seed
and an index, offline. The train problems come from ``TRAIN_SEED``, endless; the held-out
ones from ``HELD_OUT_SEED``, and a train question that is also held out is skipped, so the
policy never trains on what it is scored on. Each question is asked as one user turn, the
instruction after it; the reply, stripped, is the answer the task's ``score_answer`` grades
(1.0 right, some tasks give part of it for a near answer).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from burnish._api import Score
from burnish.tasks.environment import Chat, TaskError

# Said after every question: a small model left alone writes a paragraph of working.
INSTRUCTION = "Give only the final answer."
TRAIN_SEED = 1
HELD_OUT_SEED = 2
# The held-out questions a task is scored on.
HELD_OUT = 64
# The train questions to draw from, in order; far more than a run plays.
TRAIN_SIZE = 100_000


class Questions(Sequence[dict[str, Any]]):
    """A generator's questions, made on demand, skipping any in ``exclude`` (the held-out ones)."""

    def __init__(self, dataset: Any, exclude: set[str]) -> None:
        self.dataset, self.exclude = dataset, exclude

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        for i in range(index, index + len(self)):
            entry = self.dataset[i % len(self)]
            if entry["question"] not in self.exclude:
                return entry
        raise IndexError("every train question is held out")


def dataset(task: str, config: Mapping[str, Any], seed: int, size: int) -> Any:
    """reasoning-gym's dataset, or a ``TaskError`` that says what it has: the tasks by name, the
    generator's settings and what its own checks said."""
    from reasoning_gym.factory import DATASETS, create_dataset

    if task not in DATASETS:
        near = difflib.get_close_matches(task, DATASETS, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else f"it has {len(DATASETS)}, e.g. {', '.join(sorted(DATASETS)[:6])}"
        raise TaskError(f"reasoning-gym has no task {task!r}: {hint}")
    try:
        return create_dataset(task, seed=seed, size=size, **config)
    except (AssertionError, ValueError, TypeError) as exc:
        settings = ", ".join(f.name for f in dataclasses.fields(DATASETS[task][1]) if f.name not in ("seed", "size"))
        raise TaskError(f"reasoning-gym's {task} refused the settings {dict(config)}: {exc or 'its own check failed'} (its settings: {settings})") from None


class ReasoningGym:
    """One reasoning-gym task. ``config``: the generator's settings (its ``*Config`` fields,
    say ``min_value``); ``instruction``: said after each question; ``system``: a system prompt,
    none by default; ``binary``: train on 1 for a right answer and 0 otherwise, where the task
    would give part marks (held out is always the task's own score)."""

    def __init__(
        self,
        task: str,
        config: Mapping[str, Any] | None = None,
        *,
        held_out: int = HELD_OUT,
        instruction: str = INSTRUCTION,
        system: str | None = None,
        binary: bool = False,
    ) -> None:
        try:
            import reasoning_gym  # noqa: F401  (dataset() imports from it)
        except ImportError as exc:  # the extra is not installed
            raise ImportError("reasoning-gym is not installed: pip install 'burnish-sdk[reasoning-gym]'") from exc
        self.name, self.config = task, dict(config or {})
        self.instruction, self.system, self.binary = instruction, system, binary
        self._held_out = dataset(task, self.config, HELD_OUT_SEED, held_out)
        held = [self._held_out[i] for i in range(held_out)]
        self._train = Questions(dataset(task, self.config, TRAIN_SEED, TRAIN_SIZE), {e["question"] for e in held})
        self._split = (self._train, held)

    def split(self) -> tuple[Sequence[Any], Sequence[Any]]:
        return self._split

    def messages(self, entry: Mapping[str, Any]) -> list[dict[str, str]]:
        question = f"{entry['question']}\n{self.instruction}" if self.instruction else entry["question"]
        return ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": question}]

    def score(self, reply: str, entry: Mapping[str, Any]) -> float:
        """The task's own grade of a reply (0 where the grader cannot read it)."""
        try:
            return float(self._held_out.score_answer(reply.strip(), entry) or 0.0)
        except Exception:  # a grader that trips over a stray reply: that reply is wrong, not the run
            return 0.0

    def worked_examples(self, count: int) -> list[dict[str, str]]:
        """``count`` train questions with the generator's own answers, as earlier user and
        assistant turns: what a teacher is shown (``burnish.tasks.teach``). They come from the
        end of the train seed's range, which a run never reaches, and never from the held-out seed."""
        turns: list[dict[str, str]] = []
        for i in range(count):
            entry = self._train[len(self._train) - 1 - i * 7919]
            turns += [self.messages(entry)[-1], {"role": "assistant", "content": str(entry["answer"])}]
        return turns

    async def play(self, chat: Chat, problem: Any) -> Score:
        score = self.score(await chat(self.messages(problem)), problem)
        if self.binary and not chat.held_out:
            return Score(float(score >= 1.0), {"graded": score})
        return Score(score)
