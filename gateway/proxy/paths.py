"""The proxy's paths, in one place: which surface a path names, and the ids in its prefix.

    [/eval][/g/{group}/t/{trajectory}|/t/{trajectory}]/v1/{surface}

``/t/{trajectory}`` and ``/g/{group}/t/{trajectory}`` file a call under a trajectory (and a
group) for clients that can set only a base URL (``filing.py`` has the rest of the rule);
``/eval`` in front of any of them marks the call held out for evaluation. ``PREFIXES`` gives
the routes Litestar documents and serves (``routes/proxy.py``); ``proxy_route`` reads a path
the same way for the gateway's entry point (``gateway/edge/entry.py``), which serves the
proxy's calls before Litestar's routing.
"""

from __future__ import annotations

from burnish_server.core.protocols.surfaces import SURFACES, Surface

# The path prefix that marks a call for evaluation, in front of the other prefixes.
EVAL_PREFIX = "/eval"
# /v1/..., /t/{trajectory}/v1/... and /g/{group}/t/{trajectory}/v1/...; each also under /eval.
FILING_PREFIXES = ("", "/t/{trajectory_id:str}", "/g/{group_id:str}/t/{trajectory_id:str}")
PREFIXES = FILING_PREFIXES + tuple(EVAL_PREFIX + prefix for prefix in FILING_PREFIXES)


def is_eval_path(path: str) -> bool:
    """Whether a request's path carries the evaluation prefix (``/eval/...``)."""
    return path.startswith(EVAL_PREFIX + "/")


_ROUTES = {f"v1/{surface.path}": surface for surface in SURFACES}
_EVAL = EVAL_PREFIX + "/"
_NO_PARAMS: dict[str, str] = {}


def proxy_route(path: str) -> tuple[Surface, dict[str, str]] | None:
    """The surface a path names, with the ids in its prefix; None for any other path.

    The grammar is ``PREFIXES``' (each id one non-empty path segment), read by hand: the entry
    point asks it of every request, and this costs less than Litestar's router or a regex."""
    if path.startswith(_EVAL):
        path = path[len(EVAL_PREFIX) :]
    params = _NO_PARAMS
    if path.startswith("/g/"):
        group, _, path = path[3:].partition("/")
        if not group or not path.startswith("t/"):
            return None
        params = {"group_id": group}
        path = "/" + path
    if path.startswith("/t/"):
        trajectory, _, path = path[3:].partition("/")
        if not trajectory:
            return None
        params = {**params, "trajectory_id": trajectory}
        path = "/" + path
    surface = _ROUTES.get(path[1:]) if path.startswith("/") else None
    return None if surface is None else (surface, params)
