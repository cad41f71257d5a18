"""API keys in the store: made, listed and revoked by the admin (API or CLI), read by every gateway.

A key's secret is never stored: only its SHA-256 (``core/platform/access.py``). Rows are never
deleted; a revoked key keeps its row, so that "has this gateway ever had keys" (which
decides whether it may run open) never turns back to no.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from burnish_server.core.api.views import KeyView, NewKeyView
from burnish_server.core.platform.access import SHOWN_PREFIX, ApiKey, Limits, hash_secret, new_key_id, new_secret
from burnish_server.core.platform.clock import utcnow
from burnish_server.core.platform.errors import NotFound
from burnish_server.store.models import ApiKeyRow, GatewayRow, UiSessionRow, iso


def _aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; they were written in UTC.
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def to_key(row: Any) -> ApiKey:
    return ApiKey(
        id=row.id,
        name=row.name,
        project=row.project,
        scopes=frozenset(row.scopes),
        secret_hash=row.secret_hash,
        prefix=row.prefix,
        limits=Limits(rpm_limit=row.rpm_limit, max_parallel_requests=row.max_parallel_requests),
        created_at=_aware(row.created_at) or utcnow(),
        expires_at=_aware(row.expires_at),
        revoked_at=_aware(row.revoked_at),
    )


def key_view(key: ApiKey, now: datetime | None = None) -> KeyView:
    return KeyView(
        id=key.id,
        name=key.name,
        project=key.project,
        scopes=sorted(key.scopes),
        prefix=key.prefix,
        rpm_limit=key.limits.rpm_limit,
        max_parallel_requests=key.limits.max_parallel_requests,
        created_at=iso(key.created_at),
        expires_at=iso(key.expires_at),
        revoked_at=iso(key.revoked_at),
        status=key.usable(now or utcnow()) or "active",
    )


def create_key(conn: Connection, *, name: str, project: str, scopes: list[str], limits: Limits, expires_in_s: float | None = None) -> NewKeyView:
    """Make a key; the answer is the only place its secret ever appears."""
    secret, key_id, now = new_secret(), new_key_id(), utcnow()
    conn.execute(
        insert(ApiKeyRow).values(
            id=key_id,
            name=name,
            project=project,
            scopes=sorted(set(scopes)),
            secret_hash=hash_secret(secret),
            prefix=secret[:SHOWN_PREFIX],
            rpm_limit=limits.rpm_limit,
            max_parallel_requests=limits.max_parallel_requests,
            created_at=now,
            expires_at=now + timedelta(seconds=expires_in_s) if expires_in_s is not None else None,
        )
    )
    return NewKeyView(**msgspec.structs.asdict(key_view(get_key(conn, key_id), now)), secret=secret)


def load_keys(conn: Connection) -> list[ApiKey]:
    return [to_key(row) for row in conn.execute(select(ApiKeyRow).order_by(ApiKeyRow.pk))]


def find_key(conn: Connection, secret_hash: str) -> ApiKey | None:
    row = conn.execute(select(ApiKeyRow).where(ApiKeyRow.secret_hash == secret_hash)).first()
    return to_key(row) if row is not None else None


def get_key(conn: Connection, key_id: str) -> ApiKey:
    row = conn.execute(select(ApiKeyRow).where(ApiKeyRow.id == key_id)).first()
    if row is None:
        raise NotFound(f"no API key {key_id!r}", "key_not_found", "key_id")
    return to_key(row)


def revoke_key(conn: Connection, key_id: str) -> ApiKey:
    """Revoke a key (again is a no-op: the first revocation's time stays), and end its dashboard
    sessions (store/sessions.py; every gateway refuses them anyway, since each request reads the key)."""
    get_key(conn, key_id)
    conn.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None)).values(revoked_at=utcnow()))
    conn.execute(delete(UiSessionRow).where(UiSessionRow.key_id == key_id))
    return get_key(conn, key_id)


def heartbeat(conn: Connection, gateway_id: str, alive_s: float) -> int:
    """Say this gateway is up; how many gateways were seen in the last ``alive_s`` seconds (itself included)."""
    now = utcnow()
    updated = conn.execute(update(GatewayRow).where(GatewayRow.id == gateway_id).values(seen_at=now)).rowcount
    if not updated:
        conn.execute(insert(GatewayRow).values(id=gateway_id, started_at=now, seen_at=now))
    # Long gone gateways are forgotten, so the table stays as small as the fleet.
    conn.execute(delete(GatewayRow).where(GatewayRow.seen_at < now - timedelta(seconds=alive_s * 100)))
    return int(conn.execute(select(func.count()).select_from(GatewayRow).where(GatewayRow.seen_at >= now - timedelta(seconds=alive_s))).scalar() or 1)


def leave(conn: Connection, gateway_id: str) -> None:
    conn.execute(delete(GatewayRow).where(GatewayRow.id == gateway_id))
