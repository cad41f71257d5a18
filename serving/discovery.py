"""Where the vLLM replicas are: ``BURNISH_UPSTREAM``'s list, or every address a name resolves to
(``BURNISH_UPSTREAM_DISCOVER``: a Kubernetes headless Service, a scaled Compose service). The
lookup is I/O, so it lives here and not in the domain (``core/platform/replicas.py`` holds the
rule that picks one replica for a call); the gateway and the trainer both ask it."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from burnish_server.core.platform.replicas import base_url, parse_upstreams
from burnish_server.core.platform.settings import Settings


def discover(service: str) -> tuple[str, ...]:
    """The replicas behind ``service`` (``http://name:port``): one URL per address the name
    resolves to, in a stable order. A Kubernetes headless Service (or a Compose service
    scaled to several containers) resolves to one address per pod; an empty answer is
    ``OSError``, like a failed lookup."""
    split = urlsplit(base_url(service))
    if split.scheme not in ("http", "https") or not split.hostname:
        raise ValueError(f"upstream_discover must be http(s)://name:port, not {service!r}")
    port = split.port or (443 if split.scheme == "https" else 80)
    infos = socket.getaddrinfo(split.hostname, port, type=socket.SOCK_STREAM)
    hosts = sorted({str(info[4][0]) for info in infos})
    if not hosts:
        raise OSError(f"{split.hostname} resolves to no address")
    path = split.path.rstrip("/")
    return tuple(f"{split.scheme}://{f'[{h}]' if ':' in h else h}:{port}{path}" for h in hosts)


def upstreams(settings: Settings) -> tuple[str, ...]:
    """The replicas' base URLs: ``upstream``'s list, or what ``upstream_discover`` resolves to now."""
    return discover(settings.upstream_discover) if settings.upstream_discover else parse_upstreams(settings.upstream)
