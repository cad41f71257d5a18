"""What the runner knows of a task suite: an ``Environment``, and the ``Chat`` it plays through.

An environment is a task suite's problems and its verifier, wrapped in two members:

- ``split()``: the train problems and the held-out ones, the same on every call (a held-out
  problem must never be trained on: draw them from another seed).
- ``play(chat, problem)``: one episode. It asks the model through ``chat`` (once for a
  one-turn task, as often as the game needs for a multi-turn one) and returns the suite's own
  score as a ``Score``.

An environment never sees the gateway, the SDK's clients or the trainer: ``chat`` is all it
is handed, and the calls it makes through it are the trajectory the runner rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from burnish._api import Score

__all__ = ["Chat", "Environment", "Sampling", "Score", "TaskError", "Teachable"]


class TaskError(ValueError):
    """A task a suite cannot make: an unknown name, or settings its generator refuses. The
    message says which, and what the suite has instead."""


@dataclass(frozen=True)
class Sampling:
    """How the model samples in one episode: the runner's train settings, or greedy for held-out."""

    temperature: float
    max_tokens: int
    seed: int | None = None


@dataclass
class Chat:
    """One trajectory's calls, as an environment makes them.

    ``await chat(messages)`` sends the conversation to ``model`` with the episode's sampling and
    returns the reply's text. A suite whose own harness drives an OpenAI client (tools, several
    choices) uses ``client`` and ``model`` directly: its calls land in the same trajectory."""

    client: Any  # an openai.AsyncOpenAI whose calls carry this trajectory's keys
    model: str  # "<policy>" while training, "<policy>@<step>" when held out
    sampling: Sampling
    # A held-out episode (greedy, pinned, never trained on): a suite that shapes its train reward
    # (a share for brevity, say) scores these by its verifier alone.
    held_out: bool = False
    # Turns shown before each conversation, after its system message if it has one: the teach
    # lever's worked examples, placed where the trainer shows them to the teacher.
    context: list[dict[str, Any]] = field(default_factory=list)
    # The policy version that answered each call (the gateway's X-Policy-Version), and its reply.
    versions: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)

    async def __call__(self, messages: list[dict[str, Any]], **options: Any) -> str:
        if self.context:
            head = messages[:1] if messages and messages[0].get("role") == "system" else []
            messages = [*head, *self.context, *messages[len(head) :]]
        s = self.sampling
        raw = await self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=messages, temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed, **options
        )
        self.versions.append(raw.headers.get("x-policy-version", ""))
        self.replies.append(raw.parse().choices[0].message.content or "")
        return self.replies[-1]


class Environment(Protocol):
    """A task suite as the runner plays it (reasoning_gym.py and textarena.py are two)."""

    name: str

    def split(self) -> tuple[Sequence[Any], Sequence[Any]]:
        """(train problems, held-out problems): the same on every call, never overlapping."""
        ...

    async def play(self, chat: Chat, problem: Any) -> Score:
        """One episode through ``chat``, scored by the suite's own verifier."""
        ...


class Teachable(Environment, Protocol):
    """An environment that can show a teacher how its answers look (``burnish.tasks.teach``)."""

    def worked_examples(self, count: int) -> list[dict[str, str]]:
        """``count`` train problems with their answers, as user and assistant turns."""
        ...
