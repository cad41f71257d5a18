"""The archive of pruned trajectories: what ``burnish db prune`` writes before it deletes, and
``burnish db restore`` reads back.

One trajectory per record, with everything the store kept of it: its row, its calls, every
reward posted for it or for one of its calls, its group's row (repeated on each member's
record) and its group's RULER verdict. The fields are the tables' columns, named as they are;
bytes (the bodies as they crossed the wire, packed token arrays) are base64, times ISO 8601.
Ids are stored ids: ``<project>/<id>``, or the bare id in the default project
(``core/platform/access.py``). A call keeps the key it had (``pk``) only so that a reward can name it
(``call_pk``): restored, it gets a new one.

A record is a JSON object on one line (``encode``, ``decode``); a file of them is JSON Lines,
gzip-compressed when its name ends in ``.gz``, or Parquet (``cli/db.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec

from burnish_server.core.platform.access import STORED_ID_MAX, is_project, local, project_of
from burnish_server.core.platform.errors import Invalid
from burnish_server.core.platform.ids import ID_PATTERN

FORMAT: Literal["burnish.archive/1"] = "burnish.archive/1"

StoredId = Annotated[str, msgspec.Meta(min_length=1, max_length=STORED_ID_MAX)]


class ArchivedCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pk: int
    endpoint: str
    model: str | None
    policy: str | None
    policy_step: int | None
    upstream_model: str | None
    stream: bool
    status: str
    http_status: int | None
    error: str | None
    request: bytes
    response: bytes | None
    usage: dict[str, Any] | None
    prompt_token_ids: bytes | None
    completion_token_ids: bytes | None
    completion_logprobs: bytes | None
    completion_lengths: bytes | None
    attempts: int
    upstream_first_byte_ms: float | None
    upstream_ms: float | None
    started_at: datetime
    finished_at: datetime
    response_id: str | None
    # What the gateway changed to serve the call (core/protocols/records.py: Adjustments); absent from an
    # archive written before it existed.
    adjustments: dict[str, Any] | None = None


class ArchivedReward(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # The call it rewards, by the call's ``pk`` in this record; null: the trajectory's own reward.
    call_pk: int | None
    reward: float
    components: dict[str, float] | None
    source: str
    explanation: str | None
    created_at: datetime


class ArchivedGroup(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: StoredId
    project: str
    expected_size: int | None
    created_at: datetime
    closed_at: datetime | None
    close_reason: str | None
    policy: str | None
    claimed_by: str | None
    claimed_at: datetime | None
    trained_at: datetime | None
    trained_step: int | None
    ruler_at: datetime | None
    ruler_key: str | None
    ruler_error: str | None
    eval: bool


class ArchivedVerdict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    key: str
    judge: str
    scores: dict[str, Any]
    created_at: datetime


class ArchivedTrajectory(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One line of an archive: a trajectory and everything that hangs on it."""

    format: Literal["burnish.archive/1"] = FORMAT
    id: StoredId
    project: str
    group_id: StoredId | None
    created_at: datetime
    updated_at: datetime
    reward: float | None
    reward_components: dict[str, float] | None
    rewarded_at: datetime | None
    eval: bool
    calls: list[ArchivedCall]
    # The first policy its calls went to, and what followed a lone attempt's answer
    # (store/models.py: Trajectory); absent in older archives.
    policy: str | None = None
    followed: list[dict[str, Any]] | None = None
    rewards: list[ArchivedReward]
    group: ArchivedGroup | None = None
    verdict: ArchivedVerdict | None = None
    # When it was archived.
    archived_at: datetime | None = None


class CorruptArchive(Invalid, ValueError):
    """A record that is not an archived trajectory; the message says why."""

    default_code = "corrupt_archive"


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(ArchivedTrajectory)


def encode(record: ArchivedTrajectory) -> bytes:
    """One record as one line of JSON (no newline inside, none at the end)."""
    return _ENCODER.encode(record)


def decode(line: bytes | str) -> ArchivedTrajectory:
    """A record from one line, checked: CorruptArchive if it is not one."""
    try:
        record = _DECODER.decode(line)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise CorruptArchive(str(exc)) from None
    if why := problem(record):
        raise CorruptArchive(why)
    return record


def _id_ok(stored: str, project: str) -> bool:
    return project_of(stored) == project and bool(ID_PATTERN.fullmatch(local(stored)))


def problem(record: ArchivedTrajectory) -> str | None:
    """Why the record could not have come from a store, if it could not: ids out of their
    project or their pattern, a group that is not the trajectory's, a reward of a call it
    does not have."""
    if not is_project(record.project):
        return f"invalid project {record.project[:80]!r}"
    if not _id_ok(record.id, record.project):
        return f"invalid trajectory id {record.id[:220]!r} for project {record.project!r}"
    if record.group_id is not None and not _id_ok(record.group_id, record.project):
        return f"invalid group id {record.group_id[:220]!r} for project {record.project!r}"
    if (record.group is None) != (record.group_id is None) or (record.group is not None and record.group.id != record.group_id):
        return "its group is not the group it names"
    if record.group is not None and record.group.project != record.project:
        return "its group is in another project"
    if record.verdict is not None and (record.group is None or record.group.ruler_key != record.verdict.key):
        return "its verdict is not its group's"
    pks = [call.pk for call in record.calls]
    if len(set(pks)) != len(pks):
        return "two calls have the same pk"
    known = set(pks)
    if any(r.call_pk is not None and r.call_pk not in known for r in record.rewards):
        return "a reward names a call it does not have"
    return None


def utc(value: datetime) -> datetime:
    """A stored time, aware (SQLite hands back naive datetimes; they were written in UTC)."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)
