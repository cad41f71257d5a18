"""The dashboard's sessions: what a sign-in leaves in the browser, and when it ends.

Signing in (``gateway/ui/auth.py``) checks a credential once, as the API would, and makes a
session: a random secret goes into the browser's cookie, and the store keeps the secret's
SHA-256 with who signed in (a key's id, or the admin token), the project, and the session's
terms. The cookie's value is neither the credential nor made from it: a copy of the cookie
is worth one session, which ends

- after ``idle_s`` without a page view (``BURNISH_UI_SESSION_IDLE``), or ``lifetime`` after
  the sign-in however it is used (``BURNISH_UI_SESSION_LIFETIME``): the figures the gateway
  had at the sign-in, kept with the session, so that gateways sharing a store agree;
- at sign-out, or when an admin ends it (its row is deleted);
- when its key is revoked or expires (checked on every request);
- for a session signed in with the admin token, when the gateway's admin token is no longer
  that one: the session keeps a fingerprint of the token (``admin_fingerprint``).

A session has a public id (``ses_`` and 16 hex digits) by which an admin lists and ends it;
the secret itself appears only in the browser's cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

import msgspec

from burnish_server.core.platform.access import ApiKey

SESSION_ID_PREFIX = "ses_"
SESSION_ID_REGEX = r"^ses_[0-9a-f]{16}$(?!\n)"
# What ``new_secret`` makes: 32 random bytes, URL-safe base64 without padding. A cookie of any
# other shape is refused before the store is asked.
_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")
# PBKDF2 rounds for the admin token's fingerprint (below).
_FINGERPRINT_ROUNDS = 200_000
_FINGERPRINT_SALT = b"burnish dashboard session: admin token"


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def new_session_id() -> str:
    return SESSION_ID_PREFIX + secrets.token_hex(8)


def is_secret(value: str) -> bool:
    return bool(_SECRET.fullmatch(value))


def admin_fingerprint(token: str) -> str:
    """What an admin session keeps of the admin token it was made with: enough to tell whether
    the token changed since, and slow to compute (about 0.1 s) so that a copy of the store does
    not let anyone test guesses of an operator-chosen token quickly, as a plain SHA-256 would.
    A gateway computes it once for its own token (``gateway/access/sessions.py``); the salt is fixed
    because every session of one token must carry the same value."""
    return hashlib.pbkdf2_hmac("sha256", token.encode("utf-8", "surrogatepass"), _FINGERPRINT_SALT, _FINGERPRINT_ROUNDS).hex()


class UiSession(msgspec.Struct, frozen=True, kw_only=True):
    """A session as the store keeps it (never its secret)."""

    id: str
    # The key it was signed in with; None: the admin token.
    key_id: str | None
    project: str
    # For the admin token's sessions: ``admin_fingerprint`` of the token then.
    admin_fingerprint: str | None
    created_at: datetime
    # The last page view, written at most about once a minute (``gateway/access/sessions.py``).
    last_seen_at: datetime
    idle_s: float
    expires_at: datetime

    @property
    def idle_until(self) -> datetime:
        return self.last_seen_at + timedelta(seconds=self.idle_s)

    def ended(self, now: datetime) -> str | None:
        """None while the session's own terms hold, else why not ("expired", "idle")."""
        if now >= self.expires_at:
            return "expired"
        if now >= self.idle_until:
            return "idle"
        return None


def refusal(session: UiSession, key: ApiKey | None, now: datetime, admin_fingerprint_now: str | None) -> str | None:
    """None if ``session`` lets its holder in now, else why not: "expired" or "idle" (its own
    terms), "key_revoked", "key_expired" or "key_missing" (its key, as the store has it now), or
    "admin_token_changed" (``admin_fingerprint_now``: the gateway's own token's, None without one)."""
    if why := session.ended(now):
        return why
    if session.key_id is None:
        same = admin_fingerprint_now is not None and session.admin_fingerprint is not None
        return None if same and hmac.compare_digest(session.admin_fingerprint or "", admin_fingerprint_now or "") else "admin_token_changed"
    if key is None:
        return "key_missing"
    if why := key.usable(now):
        return f"key_{why}"
    return None
