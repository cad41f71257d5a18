"""Calls from clients built once, filed under the trajectory of the moment.

An agent whose model client is built once (a LangGraph graph, a LangChain chain, an OpenAI
client made at import) cannot be given each trajectory's base URL or headers. Build it with
``burnish.http_client()`` instead (or ``async_http_client()``): every request it sends carries
the keys of the trajectory entered around it with ``with trajectory:``, and none outside one.

    llm = ChatOpenAI(model="agent", base_url=f"{URL}/v1", api_key="unused", http_client=burnish.http_client())
    graph = create_react_agent(llm, tools)          # built once
    with client.group(size=4) as group:
        for _ in range(4):
            with group.trajectory() as t:           # every call of this run lands in t
                answer = graph.invoke({"messages": [("user", task)]})
            t.reward(grade(answer))

The trajectory of the moment is a context variable, so it follows the code into the threads
and tasks that frameworks start with the context copied (LangChain's and LangGraph's do), and
two trajectories run side by side in two tasks never mix.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from burnish._api import TrajectoryKeys

CURRENT: ContextVar[TrajectoryKeys | None] = ContextVar("burnish_trajectory", default=None)


def _attach(request: httpx.Request) -> None:
    keys = CURRENT.get()
    if keys is not None:
        request.headers.update(keys.headers)


async def _attach_async(request: httpx.Request) -> None:
    _attach(request)


def http_client(**kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` for a model client built once (``http_client=`` of openai.OpenAI,
    anthropic.Anthropic, ChatOpenAI): each request carries the current trajectory's keys."""
    hooks = kwargs.pop("event_hooks", {})
    return httpx.Client(event_hooks={**hooks, "request": [*hooks.get("request", []), _attach]}, **kwargs)


def async_http_client(**kwargs: Any) -> httpx.AsyncClient:
    """The same for async clients (``http_async_client=`` of ChatOpenAI, AsyncOpenAI's ``http_client=``)."""
    hooks = kwargs.pop("event_hooks", {})
    return httpx.AsyncClient(event_hooks={**hooks, "request": [*hooks.get("request", []), _attach_async]}, **kwargs)
