"""The gateway's configured secrets, masked in what it relays or records of others' words.

An upstream that refuses the gateway's key may quote it (``Incorrect API key provided:
Bearer sk-...``); relayed, that answer would hand the key to the client, and recorded, to
anyone who can read the export. ``Redactor`` replaces every configured secret (the upstream
key, the judge key, the admin token, Langfuse's secret key) in an upstream's error answers,
plain or streamed, before they are relayed or recorded. Successful answers are not scanned:
the upstream never sees the admin or judge secrets, and echoing its own key in a completion
is not something a model server does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from burnish_server.core.platform.settings import Settings

MASK = b"[redacted]"
# Shorter secrets are not masked: replacing every occurrence of a 3-letter token would garble
# the message around it, and such a token protects nothing anyway.
MIN_SECRET_CHARS = 8


class Redactor:
    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[bytes] = set()
        for secret in secrets:
            if len(secret) >= MIN_SECRET_CHARS:
                forms.add(secret.encode())
                forms.add(msgspec.json.encode(secret)[1:-1])  # as it appears inside a JSON string
        # Longest first: a secret that contains another is masked whole.
        self.forms = sorted(forms, key=len, reverse=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        return cls((settings.upstream_api_key, settings.judge_api_key, settings.admin_token, settings.langfuse_secret_key))

    def __call__(self, data: bytes) -> bytes:
        for form in self.forms:
            if form in data:
                data = data.replace(form, MASK)
        return data

    def text(self, text: str) -> str:
        return self(text.encode()).decode() if self.forms else text
