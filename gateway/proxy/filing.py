"""Where a call is filed: which trajectory (and group) it belongs to, and whether it is held out.

Precedence: the URL prefix ``/g/{group}/t/{trajectory}/v1`` or ``/t/{trajectory}/v1``
(for clients that can set only a base URL), then the headers ``X-Trajectory-Id``,
``X-Group-Id`` and ``X-Group-Size``, then a coding CLI's own session id (``session-id``,
the Codex CLI's; ``X-Claude-Code-Session-Id``, Claude Code's), so that a CLI's session is one
trajectory without any setting (a session id off the ids' rule is not a key). A call with no
trajectory id becomes a one-call trajectory with a generated id. Ids follow ``core/platform/ids.py``;
a project's caller's ids are stored under its project (``forward.py``), so two projects'
sessions never meet.

A call is marked for evaluation (held out: recorded and rewarded, never trained on) by the
``/eval`` URL prefix in front of any of those (``/eval/v1``, ``/eval/t/{trajectory}/v1``,
``/eval/g/{group}/t/{trajectory}/v1``) or by ``X-Eval: true``. Marking only ever adds:
``X-Eval: false`` is the same as no header, and the store never clears a mark.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from burnish_server.core.platform.errors import Invalid
from burnish_server.core.platform.ids import check_id, new_trajectory_id

MAX_GROUP_SIZE = 100_000

TRAJECTORY_HEADER = "x-trajectory-id"
GROUP_HEADER = "x-group-id"
GROUP_SIZE_HEADER = "x-group-size"
EVAL_HEADER = "x-eval"
FILING_HEADERS = frozenset({TRAJECTORY_HEADER, GROUP_HEADER, GROUP_SIZE_HEADER, EVAL_HEADER})
# The coding CLIs' session ids, in order: a trajectory's id when none other is given. They
# are read, and still forwarded upstream (they are the client's, not the gateway's).
SESSION_HEADERS = ("session-id", "x-claude-code-session-id")
_EVAL_VALUES = {"true": True, "1": True, "false": False, "0": False}
_SIZE = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True, slots=True)
class Filing:
    trajectory_id: str
    group_id: str | None = None
    group_size: int | None = None
    # Held out for evaluation: recorded and rewarded, never trained on.
    eval: bool = False


_FILING_HEADER_NAMES = frozenset(h.encode() for h in (*FILING_HEADERS, *SESSION_HEADERS))


def filing_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The filing headers (and the CLIs' session ids) from an ASGI scope's raw headers (names are lower-case there)."""
    return {k.decode(): v.decode("latin-1") for k, v in raw if k in _FILING_HEADER_NAMES}


def _session(headers: Mapping[str, str]) -> str | None:
    """A coding CLI's session id, where it fits the ids' rule."""
    for name in SESSION_HEADERS:
        if (value := headers.get(name)) is not None:
            try:
                return check_id(value, "trajectory_id")
            except Invalid:
                return None
    return None


def resolve(path_params: Mapping[str, str], headers: Mapping[str, str], *, eval_path: bool = False) -> Filing:
    trajectory = path_params.get("trajectory_id")
    group = path_params.get("group_id")
    if trajectory is None:
        trajectory = headers.get(TRAJECTORY_HEADER)
        if group is None:
            group = headers.get(GROUP_HEADER)
    size_text = headers.get(GROUP_SIZE_HEADER)

    if group is not None:
        check_id(group, "group_id")
    size = None
    if size_text is not None:
        if group is None:
            raise Invalid("X-Group-Size needs a group (X-Group-Id or the /g/{group}/t/{trajectory} prefix)", "invalid_group_size", "X-Group-Size")
        # ASCII digits only: str.isdigit() also takes "²" and "٣", which int() refuses or reads.
        if not _SIZE.fullmatch(size_text) or not 1 <= int(size_text) <= MAX_GROUP_SIZE:
            raise Invalid(f"X-Group-Size must be an integer from 1 to {MAX_GROUP_SIZE}", "invalid_group_size", "X-Group-Size")
        size = int(size_text)
    held_out = eval_path
    if (eval_text := headers.get(EVAL_HEADER)) is not None:
        marked = _EVAL_VALUES.get(eval_text.strip().lower())
        if marked is None:  # a typo must not silently train on what was meant to be held out
            raise Invalid("X-Eval must be true, false, 1 or 0", "invalid_eval", "X-Eval")
        held_out = held_out or marked
    if trajectory is None:
        trajectory = _session(headers)
    if trajectory is None:
        return Filing(new_trajectory_id(), group, size, held_out)
    return Filing(check_id(trajectory, "trajectory_id"), group, size, held_out)
