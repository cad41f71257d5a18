"""The rule by which a trajectory's calls merge into one sequence.

``Continuity`` says, call by call, whether a call's prompt extends its trajectory so far:
the trainer merges on it (``trainer/sequences.py``) and the trajectory view shows it
(``store/reads.py``), so the two never disagree about where a trajectory splits.
"""

from __future__ import annotations


def starts_with(ids: list[int], prefix: list[int]) -> bool:
    """Whether ``ids`` begin with every id of ``prefix``, in order."""
    return len(ids) >= len(prefix) and ids[: len(prefix)] == prefix


class Continuity:
    """One trajectory's calls, walked in order: does each call's prompt extend what came before?

    "What came before" is the previous single-choice call's prompt and completion, which is
    exactly the sequence the trainer has built so far. A call whose prompt starts with it
    extends the trajectory, and trains as part of the same sequence; one whose prompt does
    not (a chat template that drops earlier reasoning, an agent that rewrote its history, a
    reply re-tokenised differently) is a split: a new sequence starts there. The first
    single-choice call extends the empty history. A call with several choices (or none) is
    neither: each choice is its own sample of the prompt, never merged, and the history
    stays as it was. So does a call the trainer does not train (no prompt or completion ids).
    """

    def __init__(self) -> None:
        self.history: list[int] = []  # the previous single-choice call's prompt + completion
        self.splits = 0  # single-choice calls that did not extend the history

    def extends(self, prompt: list[int] | None, completions: list[list[int]] | None) -> bool | None:
        """Walk one call; True if its prompt extends the trajectory so far, False at a split,
        None for a call that is not merged (no ids, or not exactly one choice)."""
        if prompt is None or completions is None or len(completions) != 1:
            return None
        extends = starts_with(prompt, self.history)
        self.splits += not extends
        self.history = prompt + completions[0]
        return extends
