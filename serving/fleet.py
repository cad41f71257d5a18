"""vLLM's replicas as the trainer sees them: one ``VLLMAdapters`` per replica, driven in parallel.

The replicas are ``BURNISH_UPSTREAM``'s list, or what ``upstream_discover`` resolves to
(re-resolved at most every ``upstream_discover_every`` seconds; a failed lookup keeps the
last list). ``each`` runs a function on every replica at once and returns, per replica,
its result or its error, so that one slow or dead replica neither serialises nor fails the
others. A replica that cannot be reached (``httpx.TransportError``) is *unreachable*: it
does not count among the healthy replicas, and is caught up when it comes back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx

from burnish_server.core.platform.settings import Settings
from burnish_server.serving.adapters import VLLMAdapters
from burnish_server.serving.discovery import upstreams

log = logging.getLogger("burnish.serving")
T = TypeVar("T")

UNREACHABLE = (httpx.TransportError,)


class Fleet:
    def __init__(self, settings: Settings, *, timeout_s: float = 120.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.clients: dict[str, VLLMAdapters] = {}
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="burnish-fleet")
        self._urls: tuple[str, ...] = ()
        self._resolved_at = float("-inf")

    def urls(self) -> tuple[str, ...]:
        s = self.settings
        if not s.upstream_discover:
            return upstreams(s)
        if time.monotonic() - self._resolved_at >= s.upstream_discover_every or not self._urls:
            try:
                urls = upstreams(s)
            except OSError as exc:
                log.warning("upstream_discover: %s; keeping the %d replicas known", exc, len(self._urls))
            else:
                if urls != self._urls:
                    log.info("replicas now: %s", ", ".join(urls))
                    for gone in set(self.clients) - set(urls):  # a pod that left does not come back under its address
                        self.clients.pop(gone).close()
                self._urls, self._resolved_at = urls, time.monotonic()
        return self._urls

    def client(self, url: str) -> VLLMAdapters:
        if url not in self.clients:
            self.clients[url] = VLLMAdapters(url, api_key=self.settings.upstream_api_key, timeout_s=self.timeout_s)
        return self.clients[url]

    def each(self, fn: Callable[[VLLMAdapters], T]) -> dict[str, T | Exception]:
        """``fn`` on every replica at once: its result, or the exception it raised, by URL."""
        futures = {url: self.pool.submit(fn, self.client(url)) for url in self.urls()}
        out: dict[str, T | Exception] = {}
        for url, future in futures.items():
            try:
                out[url] = future.result()
            except Exception as exc:
                out[url] = exc
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for client in self.clients.values():
            client.close()
