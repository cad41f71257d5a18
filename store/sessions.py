"""The dashboard's sessions in the store (``core/platform/sessions.py``): made at sign-in, read on every
dashboard request by whichever gateway serves it, deleted at sign-out or by an admin.

Every read is by a unique column (the secret's hash, the public id) or bounded by what it
returns (the live sessions, for an admin's list). Sessions past their lifetime are swept at
each sign-in, through the index on ``expires_at``, so the table holds the last lifetime's
sign-ins at most.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from burnish_server.core.api.views import SessionView
from burnish_server.core.platform.access import ApiKey
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import NotFound
from burnish_server.core.platform.sessions import UiSession, new_session_id
from burnish_server.store.keys import to_key
from burnish_server.store.models import ApiKeyRow, UiSessionRow, iso


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; they were written in UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def to_session(row: Any) -> UiSession:
    return UiSession(
        id=row.id,
        key_id=row.key_id,
        project=row.project,
        admin_fingerprint=row.admin_fingerprint,
        created_at=_aware(row.created_at),
        last_seen_at=_aware(row.last_seen_at),
        idle_s=row.idle_s,
        expires_at=_aware(row.expires_at),
    )


def session_view(session: UiSession, status: str) -> SessionView:
    return SessionView(
        id=session.id,
        key_id=session.key_id,
        project=session.project,
        created_at=iso(session.created_at),
        last_seen_at=iso(session.last_seen_at),
        idle_until=iso(session.idle_until),
        expires_at=iso(session.expires_at),
        status=status,
    )


def create_session(
    conn: Connection, *, secret_hash: str, key_id: str | None, project: str, admin_fingerprint: str | None, idle_s: float, lifetime_s: float
) -> UiSession:
    now = utcnow()
    conn.execute(delete(UiSessionRow).where(UiSessionRow.expires_at <= now))
    session_id = new_session_id()
    conn.execute(
        insert(UiSessionRow).values(
            id=session_id,
            secret_hash=secret_hash,
            key_id=key_id,
            project=project,
            admin_fingerprint=admin_fingerprint,
            created_at=now,
            last_seen_at=now,
            idle_s=idle_s,
            expires_at=now + timedelta(seconds=lifetime_s),
        )
    )
    return get_session(conn, session_id)


def find_session(conn: Connection, secret_hash: str) -> tuple[UiSession, ApiKey | None] | None:
    """The session whose secret hashes to ``secret_hash``, and its key as the store has it now
    (None for the admin token's): a key revoked through any gateway ends its sessions at once."""
    row = conn.execute(select(UiSessionRow).where(UiSessionRow.secret_hash == secret_hash)).first()
    if row is None:
        return None
    key = None
    if row.key_id is not None:
        key_row = conn.execute(select(ApiKeyRow).where(ApiKeyRow.id == row.key_id)).first()
        key = to_key(key_row) if key_row is not None else None
    return to_session(row), key


def get_session(conn: Connection, session_id: str) -> UiSession:
    row = conn.execute(select(UiSessionRow).where(UiSessionRow.id == session_id)).first()
    if row is None:
        raise NotFound(f"no dashboard session {session_id!r}", "session_not_found", "session_id")
    return to_session(row)


def touch_session(conn: Connection, session_id: str, now: datetime, seen_before: datetime) -> None:
    """Record a page view, unless another request (on any gateway) did since ``seen_before``."""
    conn.execute(update(UiSessionRow).where(UiSessionRow.id == session_id, UiSessionRow.last_seen_at < seen_before).values(last_seen_at=now))


def end_session(conn: Connection, secret_hash: str) -> bool:
    """Sign-out: whether there was such a session."""
    return bool(conn.execute(delete(UiSessionRow).where(UiSessionRow.secret_hash == secret_hash)).rowcount)


def end_session_by_id(conn: Connection, session_id: str) -> UiSession:
    """An admin ends a session; 404 if there is none by that id (ended already, or never made)."""
    session = get_session(conn, session_id)
    conn.execute(delete(UiSessionRow).where(UiSessionRow.id == session_id))
    return session


def live_sessions(conn: Connection, now: datetime) -> list[tuple[UiSession, ApiKey | None]]:
    """Every session not past its lifetime, oldest first, each with its key (None for the admin token's)."""
    sessions = [to_session(row) for row in conn.execute(select(UiSessionRow).where(UiSessionRow.expires_at > now).order_by(UiSessionRow.pk))]
    key_ids = {s.key_id for s in sessions if s.key_id is not None}
    keys = {row.id: to_key(row) for row in conn.execute(select(ApiKeyRow).where(ApiKeyRow.id.in_(sorted(key_ids))))} if key_ids else {}
    return [(s, keys.get(s.key_id) if s.key_id is not None else None) for s in sessions]
