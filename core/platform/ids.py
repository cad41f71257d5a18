"""Trajectory, group and policy ids, and the name a policy's version is served under.

Ids are 1 to 128 characters from ``A-Z a-z 0-9 _ - . :``, not only dots; that keeps them
safe in a URL path, a header and a file name without escaping. The gateway's path parameters use
``ID_REGEX`` (and so the OpenAPI schema shows it); headers and bodies use ``check_id``.
"""

from __future__ import annotations

import re
import uuid

from burnish_server.core.platform.errors import Invalid

# The lookahead at the end: Python's `$` also matches before a final newline, and msgspec
# (bodies, Litestar's parameters) searches with it; "abc\n" must not pass for "abc".
# The one at the start refuses ids made only of dots: clients normalise "." and ".." out of
# a URL's path, so such a trajectory could never be read or rewarded. (`[.]`, not `\.`:
# gateway/edge/errors.py recognises the pattern in msgspec's messages by its text up to the
# first backslash.)
ID_REGEX = r"^(?![.]+$)[A-Za-z0-9_.:\-]{1,128}$(?!\n)"
ID_PATTERN = re.compile(ID_REGEX)
ID_RULE = "1 to 128 characters from A-Z a-z 0-9 _ - . :, not only dots"


def check_id(value: str, what: str) -> str:
    if not ID_PATTERN.fullmatch(value):
        raise Invalid(f"invalid {what} {value[:140]!r}: use {ID_RULE}", "invalid_id", what)
    return value


def new_trajectory_id() -> str:
    return f"t-{uuid.uuid4().hex}"


def adapter_name(policy: str, step: int) -> str:
    """The name vLLM serves a policy's step under (step 0 is the base model, not an adapter)."""
    return f"{policy}@{step}"
