"""Token ids: packed for the store, and the rule by which a trajectory's calls merge.

Ids and logprobs are stored as packed little-endian arrays: int32 ids, float32 logprobs.
A million-token trajectory is 4 MB here instead of ~7 MB of JSON text, and unpacking is
a single memcpy.

``Continuity`` says, call by call, whether a call's prompt extends its trajectory so far:
the trainer merges on it (``trainer/sequences.py``) and the trajectory view shows it
(``store/reads.py``), so the two never disagree about where a trajectory splits.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_SWAP = sys.byteorder != "little"


def _pack(kind: str, values: Sequence[int] | Sequence[float] | None) -> bytes | None:
    if values is None:
        return None
    packed = array(kind, values)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def _unpack(kind: str, blob: bytes | None) -> list[Any] | None:
    if blob is None:
        return None
    values = array(kind)
    values.frombytes(blob)
    if _SWAP:
        values.byteswap()
    return values.tolist()


def pack_ids(ids: Sequence[int] | None) -> bytes | None:
    return _pack("i", ids)


def unpack_ids(blob: bytes | None) -> list[int] | None:
    return _unpack("i", blob)


def pack_floats(values: Sequence[float] | None) -> bytes | None:
    return _pack("f", values)


def unpack_floats(blob: bytes | None) -> list[float] | None:
    return _unpack("f", blob)


def split(values: list[T] | None, lengths: list[int] | None) -> list[list[T]] | None:
    """Cut the concatenated per-choice arrays back into one list per choice."""
    if values is None or lengths is None:
        return None
    out: list[list[T]] = []
    start = 0
    for n in lengths:
        out.append(values[start : start + n])
        start += n
    return out


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
