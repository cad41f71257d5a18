"""A group's answers trained as one row: their shared prompt once, then each answer.

GRPO samples several answers to one prompt, and a forward pass costs every token it is given:
on reasoning-gym's knights_knaves (a question of about 200 tokens, answers of about 20, eight
a group) nine tenths of a step's tokens were the same prompt eight times. Sequences whose tokens
before the first trained one are the same (a group's members, each starting from the task's
prompt) are laid out in one row: the prompt once, then each one's rest. A 4-D attention mask
lets each rest attend to the prompt and to itself alone, and its position ids continue from
the prompt's end, so every token's hidden state is the one it has in its own sequence
(``SharedBase.sharing_is_faithful`` checks that at load). The token that first follows the
prompt in each rest is predicted from the prompt's last position, which the rests share.

Only the untrained prompt is shared: from its first trained token on, each sequence is its own.

A shared row is longer than each of its sequences, and attention's cost grows with a row's
length squared (the mask is dense), where the matmuls' grows with its tokens. A sequence joins
a row only where that costs less than a row of its own (``cost``): a group of short answers
to a long prompt always shares; long answers to a short prompt (an agent's session) do not.
"""

from __future__ import annotations

from dataclasses import dataclass

from burnish_server.trainer.sequences import Sequence

Item = tuple[Sequence, float]  # a sequence and its advantage


@dataclass(frozen=True)
class Row:
    """One row of a micro-batch: a sequence alone (``prefix`` 0), or sequences that all begin
    with the same ``prefix`` tokens, laid out as the first whole, then each other's tokens after
    the prefix."""

    items: list[Item]
    prefix: int = 0

    def spans(self, max_len: int) -> list[tuple[int, int]]:
        """Each item's tokens in the row, as (first, end) of its own sequence (cut at ``max_len``)."""
        return [(self.prefix if i else 0, min(len(seq.tokens), max_len)) for i, (seq, _) in enumerate(self.items)]

    def length(self, max_len: int) -> int:
        return sum(end - first for first, end in self.spans(max_len))


def prompt(seq: Sequence, max_len: int) -> tuple[int, ...]:
    """The sequence's tokens before its first trained one: what it may share."""
    trained = seq.trained()[:max_len]
    first = next((i for i, m in enumerate(trained) if m), len(trained))
    return tuple(seq.tokens[:first])


def break_even(hidden_size: int, intermediate_size: int) -> float:
    """The row length at which a token's attention costs what its matmuls do, a layer's forward:
    4 d T FLOPs (scores and values over T keys) against 2 (4 d^2 + 3 d f) (the four attention
    projections and a gated MLP's three)."""
    return (8 * hidden_size + 6 * intermediate_size) / 4


def cost(tokens: int, even: float) -> float:
    """A row's forward cost, in tokens' matmuls: its tokens, and its attention over them."""
    return tokens + tokens * tokens / even


def shared_rows(items: list[Item], max_len: int, limit: int, even: float) -> list[Row]:
    """``items`` as rows: those with the same prompt together, in rows of at most ``limit``
    tokens (the micro-batch's size: a row is never split), each joining a row only where that
    costs less than a row of its own (``cost``, ``even`` the model's ``break_even``); an item
    that shares its prompt with no other is a row alone."""
    by_prompt: dict[tuple[int, ...], list[Item]] = {}
    for item in items:
        by_prompt.setdefault(prompt(item[0], max_len), []).append(item)
    rows: list[Row] = []

    def close(row: list[Item], shared: tuple[int, ...]) -> None:
        rows.extend([Row(row, len(shared))] if len(row) > 1 and shared else [Row([item]) for item in row])

    for shared, members in by_prompt.items():
        row: list[Item] = []
        length = 0
        for item in members:
            whole = min(len(item[0].tokens), max_len)
            rest = whole - len(shared)
            if row and (length + rest > limit or cost(length + rest, even) > cost(length, even) + cost(whole, even)):
                close(row, shared)
                row, length = [], 0
            length += rest if row else rest + len(shared)
            row.append(item)
        close(row, shared)
    return rows
