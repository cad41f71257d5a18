"""Token ids packed for the store: how a recorded call keeps its ids and logprobs.

Ids and logprobs are stored as packed little-endian arrays: int32 ids, float32 logprobs.
A million-token trajectory is 4 MB here instead of ~7 MB of JSON text, and unpacking is
a single memcpy.
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
