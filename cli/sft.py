"""``burnish sft FILE.jsonl``: post a file of demonstrations for a policy to imitate.

Each line is one conversation in chat format: ``{"messages": [...], "tools": [...]}`` (tools
optional), or the list of messages alone, ending with the assistant's. They go to
``POST /v1/demonstrations`` a thousand at a time; a line that is not JSON stops the command
before anything is posted, naming the line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from burnish_server.core.learning.demonstrations import MAX_DEMONSTRATIONS
from burnish_server.core.platform.errors import BurnishError


class SftFailed(BurnishError, RuntimeError):
    """The file could not be read, or the gateway refused it; the message says what to do."""

    default_code = "sft_failed"


def read(path: Path) -> list[Any]:
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SftFailed(f"{path}:{number}: not JSON ({exc.msg})") from None
        out.append(item if isinstance(item, dict) else {"messages": item})
    if not out:
        raise SftFailed(f"{path}: no demonstrations in it")
    return out


def post(url: str, token: str, policy: str, demonstrations: list[Any]) -> list[str]:
    """Post them; the ids of the trajectories they became, in order."""
    ids: list[str] = []
    for start in range(0, len(demonstrations), MAX_DEMONSTRATIONS):
        batch = demonstrations[start : start + MAX_DEMONSTRATIONS]
        try:
            response = httpx.post(
                url.rstrip("/") + "/v1/demonstrations", json={"policy": policy, "data": batch}, headers={"authorization": f"Bearer {token}"}, timeout=120
            )
        except httpx.TransportError as exc:
            raise SftFailed(f"no gateway answers at {url} ({exc}): is burnish up running? (--url)") from None
        if response.status_code != 201:
            where = f" (lines from {start + 1})" if len(demonstrations) > MAX_DEMONSTRATIONS else ""
            raise SftFailed(f"{url} refused the demonstrations{where}: {response.status_code} {response.text[:500]}; {len(ids)} were posted before")
        ids += response.json()["ids"]
    return ids
