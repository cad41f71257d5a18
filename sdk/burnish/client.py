"""The clients: ``Client`` (sync) and ``AsyncClient``, with their groups and trajectories.

    client = Client("http://127.0.0.1:8080", api_key=..., admin_token=...)
    with client.group(size=4) as group:          # closed on a clean exit
        t = group.trajectory()
        t.openai().chat.completions.create(model="agent", messages=...)
        t.reward(0.8, format=1.0)
    client.wait_for_step("agent", 1)
    with client.group(size=4, eval=True) as held_out:  # recorded and rewarded, never trained on
        ...
    client.compare("agent")                      # held-out score: base (step 0) against the served step
    client.run_held_out("agent", tasks, agent)   # held-out tasks against the candidate on trial (pinned)

The async forms are the same with ``async with`` and ``await``. A 503 with ``Retry-After`` (the
gateway's store or vLLM away for a moment: nothing changed) is sent again as it says, up to
five times; any other error is raised as ``BurnishError``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import httpx

from burnish._api import (
    BurnishError,
    Call,
    MissingAdminToken,
    OpenAIClients,
    Routes,
    Score,
    StepTimeout,
    TrajectoryKeys,
    answer,
    as_score,
    comparison,
    keep_waiting,
    new_id,
    retry_after,
    served_step,
    trial_report,
    trial_step,
)

DEFAULT_TIMEOUT = httpx.Timeout(120.0, connect=10.0)
T = TypeVar("T")


class _Settings:
    def __init__(self, base_url: str, api_key: str | None, admin_token: str | None) -> None:
        # The gateway's root: "http://host:8080" (a trailing /v1 is accepted and dropped).
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        # The gateway's API key: sent by the agents' OpenAI clients and by this client's own calls
        # (rewards, groups, reads). A gateway without keys ignores it; OpenAI's clients need one.
        self.key_given = api_key is not None
        self.api_key = api_key or "burnish"
        self.admin_token = admin_token

    def headers(self, call: Call) -> dict[str, str]:
        if call.admin:  # the admin token, else a key with the admin scope
            token = self.admin_token or (self.api_key if self.key_given else None)
            if not token:
                raise MissingAdminToken(
                    "this call needs the admin token: Client(..., admin_token=...), or an api_key with the admin scope "
                    "(burnish up writes it to <data dir>/admin-token)"
                )
            return {"authorization": f"Bearer {token}"}
        return {"authorization": f"Bearer {self.api_key}"} if self.key_given else {}


# ---- sync ---------------------------------------------------------------------------


class Client(Routes):
    def __init__(self, base_url: str, api_key: str | None = None, admin_token: str | None = None, *, http: httpx.Client | None = None) -> None:
        self._settings = _Settings(base_url, api_key, admin_token)
        self._http = http or httpx.Client(base_url=self._settings.base_url, timeout=DEFAULT_TIMEOUT)
        self._openai = OpenAIClients(self._settings.base_url, self._settings.api_key, asynchronous=False)

    def _send(self, call: Call) -> Any:
        attempt = 0
        while True:
            r = self._http.request(call.method, call.path, json=call.json, params=call.params, headers=self._settings.headers(call))
            if (wait := retry_after(r.status_code, r.headers, attempt)) is None:
                return answer(r.status_code, r.content, r.json)
            attempt += 1
            time.sleep(wait)

    def group(self, size: int | None = None, id: str | None = None, eval: bool = False) -> Group:
        """A new group (an id is made unless given); ``size``: the members expected, after which it closes itself.
        ``eval``: held out for evaluation, its trajectories too: recorded and rewarded, never trained on."""
        return Group(self, id or new_id("g"), size, eval)

    def trajectory(self, id: str | None = None, eval: bool = False) -> Trajectory:
        """A trajectory in no group; ``eval``: held out for evaluation (never trained on)."""
        return Trajectory(self, id or new_id("t"), None, None, eval)

    def compare(self, policy: str, base: int = 0, step: int | None = None) -> dict[str, Any]:
        """Held-out scores side by side: {"policy", "base", "current", "delta"}; base and current are
        ``eval_scores`` entries for step ``base`` (the base model by default) and ``step`` (the served
        version by default); delta is current's score less base's, None unless both have one."""
        return comparison(self.eval_scores(policy), policy, base, step)

    def run_held_out(self, policy: str, tasks: Iterable[T], agent: Callable[[Trajectory, str, T], float | Score], step: int | None = None) -> dict[str, Any]:
        """Run each task as a held-out trajectory pinned to ``step`` (default: the policy's
        candidate on trial), and report. ``agent(trajectory, model, task)`` runs one task with
        ``trajectory.openai()`` and ``model`` (``"<policy>@<step>"``) and returns its reward (a
        number, or a ``Score`` with components), which is posted. Under the ``eval`` promotion
        rule this is the candidate's evidence; the report carries the test as it then stands
        ({"policy", "step", "trajectories", "mean", "components", "test"}). Needs the admin
        token (it reads the policy's status)."""
        step = trial_step(self.status(policy), step)
        scores = []
        for task in tasks:
            trajectory = self.trajectory(eval=True)
            score = as_score(agent(trajectory, f"{policy}@{step}", task))
            trajectory.reward(score.reward, **score.components)
            scores.append(score)
        return trial_report(self.status(policy), policy, step, scores)

    def wait_for_step(self, policy: str, step: int, timeout: float = 600.0, poll: float = 0.5) -> int:
        """Wait until the gateway routes ``policy`` to ``step`` or later (as its /v1/models says,
        so no admin token is needed); returns the step served."""
        deadline = time.monotonic() + timeout
        served = None
        while True:
            try:
                served = served_step(self.models(), policy)
            except (httpx.TransportError, BurnishError) as exc:
                if not keep_waiting(exc):
                    raise
            if served is not None and served >= step:
                return served
            if time.monotonic() > deadline:
                raise StepTimeout(f"{policy} serves step {served}, not {step}, after {timeout:.0f}s")
            time.sleep(poll)

    def close(self) -> None:
        """Close the connections, the trajectories' OpenAI clients' included."""
        self._openai.close()
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Group:
    def __init__(self, client: Client, id: str, size: int | None, eval: bool = False) -> None:
        self.client, self.id, self.size, self.eval = client, id, size, eval

    def trajectory(self, id: str | None = None) -> Trajectory:
        return Trajectory(self.client, id or new_id("t"), self.id, self.size, self.eval)

    def ruler(self, rubric: str | None = None, **judge: Any) -> Any:
        return self.client.ruler(self.id, rubric, **judge)

    def close(self) -> Any:
        return self.client.close_group(self.id)

    def __enter__(self) -> Group:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        # A clean exit closes the group (closing twice is fine); after an error it stays open.
        if exc_type is None:
            self.close()


class Trajectory(TrajectoryKeys):
    def __init__(self, client: Client, id: str, group_id: str | None, group_size: int | None, eval: bool = False) -> None:
        super().__init__(client._settings.base_url, client._openai, id, group_id, group_size, eval)
        self.client = client

    def reward(self, value: float, **components: float) -> Any:
        return self.client.reward(self.id, value, **components)

    def reward_call(self, index: int, value: float, **components: float) -> Any:
        """Reward one of this trajectory's calls: ``index`` from 0 in call order; -1, the last."""
        return self.client.reward_call(self.id, index, value, **components)

    def get(self) -> Any:
        return self.client.get_trajectory(self.id)


# ---- async --------------------------------------------------------------------------


class AsyncClient(Routes):
    def __init__(self, base_url: str, api_key: str | None = None, admin_token: str | None = None, *, http: httpx.AsyncClient | None = None) -> None:
        self._settings = _Settings(base_url, api_key, admin_token)
        self._http = http or httpx.AsyncClient(base_url=self._settings.base_url, timeout=DEFAULT_TIMEOUT)
        self._openai = OpenAIClients(self._settings.base_url, self._settings.api_key, asynchronous=True)

    async def _send(self, call: Call) -> Any:
        attempt = 0
        while True:
            r = await self._http.request(call.method, call.path, json=call.json, params=call.params, headers=self._settings.headers(call))
            if (wait := retry_after(r.status_code, r.headers, attempt)) is None:
                return answer(r.status_code, r.content, r.json)
            attempt += 1
            await asyncio.sleep(wait)

    def group(self, size: int | None = None, id: str | None = None, eval: bool = False) -> AsyncGroup:
        return AsyncGroup(self, id or new_id("g"), size, eval)

    def trajectory(self, id: str | None = None, eval: bool = False) -> AsyncTrajectory:
        return AsyncTrajectory(self, id or new_id("t"), None, None, eval)

    async def compare(self, policy: str, base: int = 0, step: int | None = None) -> dict[str, Any]:
        return comparison(await self.eval_scores(policy), policy, base, step)

    async def run_held_out(
        self,
        policy: str,
        tasks: Iterable[T],
        agent: Callable[[AsyncTrajectory, str, T], Awaitable[float | Score]],
        step: int | None = None,
        concurrency: int = 1,
    ) -> dict[str, Any]:
        """``Client.run_held_out``; ``agent`` is a coroutine function, and up to ``concurrency``
        tasks run at once (the report is the same whatever the order they finish in)."""
        step = trial_step(await self.status(policy), step)
        gate = asyncio.Semaphore(max(concurrency, 1))

        async def run(task: T) -> Score:
            async with gate:
                trajectory = self.trajectory(eval=True)
                score = as_score(await agent(trajectory, f"{policy}@{step}", task))
                await trajectory.reward(score.reward, **score.components)
                return score

        scores = list(await asyncio.gather(*(run(task) for task in tasks)))
        return trial_report(await self.status(policy), policy, step, scores)

    async def wait_for_step(self, policy: str, step: int, timeout: float = 600.0, poll: float = 0.5) -> int:
        deadline = time.monotonic() + timeout
        served = None
        while True:
            try:
                served = served_step(await self.models(), policy)
            except (httpx.TransportError, BurnishError) as exc:
                if not keep_waiting(exc):
                    raise
            if served is not None and served >= step:
                return served
            if time.monotonic() > deadline:
                raise StepTimeout(f"{policy} serves step {served}, not {step}, after {timeout:.0f}s")
            await asyncio.sleep(poll)

    async def aclose(self) -> None:
        """Close the connections, the trajectories' OpenAI clients' included."""
        await self._openai.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncGroup:
    def __init__(self, client: AsyncClient, id: str, size: int | None, eval: bool = False) -> None:
        self.client, self.id, self.size, self.eval = client, id, size, eval

    def trajectory(self, id: str | None = None) -> AsyncTrajectory:
        return AsyncTrajectory(self.client, id or new_id("t"), self.id, self.size, self.eval)

    async def ruler(self, rubric: str | None = None, **judge: Any) -> Any:
        return await self.client.ruler(self.id, rubric, **judge)

    async def close(self) -> Any:
        return await self.client.close_group(self.id)

    async def __aenter__(self) -> AsyncGroup:
        return self

    async def __aexit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            await self.close()


class AsyncTrajectory(TrajectoryKeys):
    def __init__(self, client: AsyncClient, id: str, group_id: str | None, group_size: int | None, eval: bool = False) -> None:
        super().__init__(client._settings.base_url, client._openai, id, group_id, group_size, eval)
        self.client = client

    async def reward(self, value: float, **components: float) -> Any:
        return await self.client.reward(self.id, value, **components)

    async def reward_call(self, index: int, value: float, **components: float) -> Any:
        """Reward one of this trajectory's calls: ``index`` from 0 in call order; -1, the last."""
        return await self.client.reward_call(self.id, index, value, **components)

    async def get(self) -> Any:
        return await self.client.get_trajectory(self.id)
