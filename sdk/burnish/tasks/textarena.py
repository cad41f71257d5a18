"""TextArena's single-player games as environments: several turns each, scored by the game.

    env = TextArena("GuessTheNumber-v0", {"max_number": 50})

TextArena (``pip install 'burnish-sdk[textarena]'``) runs its games in process, offline. An
episode is one game from a seed: the game's messages are the user turns, the policy's replies
its moves, and the whole conversation is one trajectory (each call extends the last, so the
trainer merges them into one sequence). The reward is the game's own at its end: 1 for a win,
part of it for a near miss where the game gives one (GuessTheNumber: how close the last guess
was), 0 for a game left unfinished within ``max_moves``. Train games come from seeds 0, 1, 2, ...;
held-out ones from ``HELD_OUT_SEED`` on.

Games that need NLTK's word lists (Wordle, Hangman, WordLadder) download them on first use
and so do not run offline; the number and board games do (GuessTheNumber, Mastermind,
LightsOut, FrozenLake, Minesweeper).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from burnish._api import Score
from burnish.tasks.environment import Chat, TaskError

HELD_OUT_SEED = 1_000_000
# Held-out games a version is scored on.
HELD_OUT = 64
TRAIN_GAMES = 1_000_000
# A bound on the moves of one game, whatever the game's own limit, so an episode always ends.
MAX_MOVES = 30


def guess_by_halves(messages: list[dict[str, str]]) -> str:
    """GuessTheNumber played well: halve the range the hints leave. A demonstrator, for
    ``worked_examples``: it reads the conversation so far and answers the next move."""
    low, high = (int(n) for n in re.findall(r"between (\d+) and (\d+)", messages[0]["content"])[0])
    for move, hint in zip(messages[1::2], messages[2::2]):
        guess = int(re.findall(r"\[(\d+)\]", move["content"])[0])
        if "higher" in hint["content"]:
            low = guess + 1
        elif "lower" in hint["content"]:
            high = guess - 1
    return f"[{(low + high) // 2}]"


# Games the adapter can play itself, to show a teacher how a game goes (the teach lever).
DEMONSTRATORS: dict[str, Callable[[list[dict[str, str]]], str]] = {"GuessTheNumber-v0": guess_by_halves}


class TextArena:
    """One TextArena single-player game; ``config``: the game's own settings (its keyword
    arguments, say ``max_number``, ``max_turns``); ``system``: a system prompt, none by default."""

    def __init__(
        self, game: str, config: Mapping[str, Any] | None = None, *, held_out: int = HELD_OUT, system: str | None = None, max_moves: int = MAX_MOVES
    ) -> None:
        try:
            import textarena
        except ImportError as exc:  # the extra is not installed
            raise ImportError("textarena is not installed: pip install 'burnish-sdk[textarena]'") from exc
        self._ta = textarena
        self.name, self.config, self.system, self.max_moves = game, dict(config or {}), system, max_moves
        try:
            self.make(0)  # an unknown game or setting fails here, before any call
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise TaskError(f"TextArena cannot make {game!r} with the settings {self.config}: {exc}") from None
        self._split = (range(TRAIN_GAMES), range(HELD_OUT_SEED, HELD_OUT_SEED + held_out))

    def split(self) -> tuple[Sequence[Any], Sequence[Any]]:
        return self._split

    def make(self, seed: int) -> Any:
        # "-raw": the game without TextArena's wrappers, which would resend the whole history as
        # one message each turn; the conversation carries it instead. reset() seeds Python's
        # global random and draws the game: nothing awaits between the two, so concurrent
        # episodes on one event loop each get their seed's game.
        game = self._ta.make(f"{self.name}-raw", **self.config)
        game.reset(num_players=1, seed=seed)
        return game

    def worked_examples(self, count: int) -> list[dict[str, str]]:
        """``count`` whole games from the end of the train seeds' range (never held out), played
        by the game's demonstrator (``DEMONSTRATORS``), as user and assistant turns."""
        demonstrate = DEMONSTRATORS.get(self.name)
        if demonstrate is None:
            raise ValueError(f"no demonstrator for {self.name}: worked examples are known for {', '.join(DEMONSTRATORS)}")
        turns: list[dict[str, str]] = []
        for i in range(count):
            game, played, done = self.make(TRAIN_GAMES - 1 - i), [], False
            while not done and len(played) < 2 * self.max_moves:
                _, seen = game.get_observation()
                played.append({"role": "user", "content": "\n".join(text for source, text, _ in seen if source == self._ta.GAME_ID)})
                played.append({"role": "assistant", "content": demonstrate(played)})
                done, _ = game.step(played[-1]["content"])
            turns += played
        return turns

    async def play(self, chat: Chat, problem: Any) -> Score:
        game = self.make(int(problem))
        messages: list[dict[str, str]] = [{"role": "system", "content": self.system}] if self.system else []
        done, moves = False, 0
        while not done and moves < self.max_moves:
            _, seen = game.get_observation()
            # The game's own messages since the last move; the echo of the move itself is left out.
            messages.append({"role": "user", "content": "\n".join(text for source, text, _ in seen if source == self._ta.GAME_ID)})
            reply = await chat(messages)
            messages.append({"role": "assistant", "content": reply})
            done, _ = game.step(reply)
            moves += 1
        rewards, info = game.close()
        won = float(rewards[0]) if done and rewards else 0.0
        return Score(won, {"moves": float(moves)})
