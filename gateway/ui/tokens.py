"""Each sampled token's text, for the token view: asked of vLLM, which holds the tokenizer.

The gateway records token ids, not their text, and never loads a tokenizer (it imports no
model code). vLLM's ``/detokenize`` turns ids into text; asked for one id at a time, it gives
each token's own piece. Pieces are kept per (model, id) in a bounded map on the app, so a
page asks only for ids it has not seen: a vocabulary is a few ten thousand entries, and a
page of a known model soon asks for none. A piece that is part of a character (byte-level
BPE splits some characters over tokens) shows as U+FFFD, as it would in any detokenizer.

If no replica answers, the view shows the ids instead: the page never fails for it.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from burnish_server.gateway.upstream.client import Upstream

log = logging.getLogger("burnish.gateway")

MAX_PIECES = 200_000  # (model, id) pieces kept; beyond it the oldest half goes
AT_ONCE = 32  # requests to vLLM in flight for one page
TIMEOUT_S = 5.0
_HEADERS = [(b"content-type", b"application/json")]


class _Detokenized(msgspec.Struct):
    prompt: str


class TokenTexts:
    """Each token id's text, per model, as vLLM detokenizes it: asked once, kept."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, int], str] = {}

    async def texts(self, upstream: Upstream, model: str, ids: list[int]) -> list[str] | None:
        """Each id's text, or None if vLLM could not say (down, or it does not know the model)."""
        missing = list(dict.fromkeys(i for i in ids if (model, i) not in self.known))
        found = next((r.url for r in upstream.replicas.order(None, model) if r.healthy), None)
        if missing and found is None:
            return None
        replica = found or ""
        gate = asyncio.Semaphore(AT_ONCE)

        async def one(token: int) -> None:
            async with gate:
                body = msgspec.json.encode({"model": model, "tokens": [token]})
                # One attempt, on the health-check pool with its short time-out: a page never
                # waits out the proxy's retries for a replica that is down.
                response = await upstream.request("POST", replica, "/detokenize", body, _HEADERS, timeout=TIMEOUT_S)
                try:
                    data = await response.aread()
                finally:
                    await response.aclose()
                if response.status_code != 200:
                    raise LookupError(f"/detokenize answered {response.status_code}: {data[:200]!r}")
                self.known[(model, token)] = msgspec.json.decode(data, type=_Detokenized).prompt

        try:
            await asyncio.gather(*(one(t) for t in missing))
        except Exception as exc:  # any failure: the view falls back to ids
            log.info("token texts for %s not available: %s", model, exc)
            return None
        if len(self.known) > MAX_PIECES:
            for stale in list(self.known)[: MAX_PIECES // 2]:
                del self.known[stale]
        return [self.known.get((model, i), f"<{i}>") for i in ids]
