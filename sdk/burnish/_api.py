"""What the sync and async clients share: the gateway's routes, its errors, trajectory keys.

Every call of the API is written once here, as a method that builds a ``Call`` and hands
it to ``self._send``. The sync client's ``_send`` returns the answer; the async client's
returns an awaitable of it. So ``client.pause("agent")`` and ``await aclient.pause("agent")``
are one definition.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

GROUP_HEADER, TRAJECTORY_HEADER, GROUP_SIZE_HEADER, EVAL_HEADER = "X-Group-Id", "X-Trajectory-Id", "X-Group-Size", "X-Eval"


class BurnishError(Exception):
    """An error answer from the gateway, with its status and the fields of its error body."""

    def __init__(self, status: int, message: str, code: str | None = None, type: str | None = None, param: str | None = None) -> None:
        super().__init__(f"{status} {code or ''}: {message}".replace(" :", ":"))
        self.status, self.message, self.code, self.type, self.param = status, message, code, type, param


class MissingAdminToken(ValueError):
    """A call that needs the admin token (an admin endpoint) was made by a client given none.
    A ValueError, as it was before it had a name of its own."""


class StepTimeout(TimeoutError):
    """``wait_for_step`` gave up: the policy did not reach the step in time."""


def keep_waiting(exc: Exception) -> bool:
    """For ``wait_for_step``: a gateway restarting or relaying an upstream hiccup is waited out."""
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, BurnishError) and exc.status >= 500)


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class Score:
    """What an agent run on one task earned: the reward posted, and named components beside it."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)


def as_score(result: float | Score) -> Score:
    """An agent's result for ``run_held_out``: a bare number is a reward with no components."""
    return result if isinstance(result, Score) else Score(float(result))


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    json: Any = None
    admin: bool = False
    params: dict[str, Any] | None = None


# A 503 with Retry-After says the gateway changed nothing and will take the request shortly (its
# store restarting, a disk being freed, vLLM coming back): sent again, up to this many times,
# waiting as it says, at most RETRY_WAIT_MAX_S each time.
RETRIES = 5
RETRY_WAIT_MAX_S = 10.0


def retry_after(status: int, headers: httpx.Headers, attempt: int) -> float | None:
    """Seconds to wait before sending again, or None: not a retryable answer, or tries used up."""
    if status != 503 or attempt >= RETRIES or "retry-after" not in headers:
        return None
    try:
        return min(max(float(headers["retry-after"]), 0.0), RETRY_WAIT_MAX_S)
    except ValueError:  # an HTTP date: wait the longest
        return RETRY_WAIT_MAX_S


def answer(status: int, body: bytes, parsed: Any) -> Any:
    """The JSON of a 2xx answer; anything else raised as a BurnishError with the gateway's message."""
    if status < 400:
        return parsed()
    try:
        error = parsed()["error"]
        raise BurnishError(status, error.get("message", ""), error.get("code"), error.get("type"), error.get("param"))
    except (ValueError, KeyError, TypeError, AttributeError):  # not the gateway's error shape
        raise BurnishError(status, body[:500].decode(errors="replace")) from None


class Routes:
    """The gateway's API, one method per route. ``_send`` is the client's."""

    def _send(self, call: Call) -> Any:
        raise NotImplementedError

    # ---- trajectories and groups (/v1) ----------------------------------------------

    def get_trajectory(self, trajectory_id: str) -> Any:
        """A trajectory: its calls in order and its reward history."""
        return self._send(Call("GET", f"/v1/trajectories/{trajectory_id}"))

    def get_group(self, group_id: str) -> Any:
        return self._send(Call("GET", f"/v1/groups/{group_id}"))

    def reward(self, trajectory_id: str, value: float, **components: float) -> Any:
        """Post a trajectory's reward (finite numbers; components are kept by name)."""
        if not all(math.isfinite(v) for v in (value, *components.values())):
            raise ValueError("rewards and their components must be finite numbers")
        return self._send(Call("POST", f"/v1/trajectories/{trajectory_id}/reward", {"reward": value, "components": components}))

    def reward_call(self, trajectory_id: str, index: int, value: float, **components: float) -> Any:
        """Post a reward for one call of a trajectory (credit per turn): the ``index``-th call in
        its order, from 0; -1 is the last."""
        if not all(math.isfinite(v) for v in (value, *components.values())):
            raise ValueError("rewards and their components must be finite numbers")
        return self._send(Call("POST", f"/v1/trajectories/{trajectory_id}/calls/{int(index)}/reward", {"reward": value, "components": components}))

    def close_group(self, group_id: str) -> Any:
        return self._send(Call("POST", f"/v1/groups/{group_id}/close"))

    def demonstrate(self, policy: str, conversations: list[Any]) -> Any:
        """Post conversations for ``policy`` to imitate (supervised fine-tuning, where its
        objective has ``sft``): each a list of chat messages ending with the assistant's, or
        ``{"messages": [...], "tools": [...]}``. At most 1,000 a call; their ids come back."""
        data = [c if isinstance(c, dict) else {"messages": list(c)} for c in conversations]
        return self._send(Call("POST", "/v1/demonstrations", {"policy": policy, "data": data}))

    def ruler(self, group_id: str, rubric: str | None = None, **judge: Any) -> Any:
        """Score the group's trajectories with an LLM judge (judge_model, combine); the judge's endpoint is the gateway's setting."""
        body = {k: v for k, v in {"rubric": rubric, **judge}.items() if v is not None}
        return self._send(Call("POST", f"/v1/groups/{group_id}/ruler", body))

    def models(self) -> Any:
        """/v1/models: the policies (with the step each serves), then the upstream's models."""
        return self._send(Call("GET", "/v1/models"))

    # ---- the admin API ---------------------------------------------------------------

    def create_policy(self, name: str, base_model: str, **fields: Any) -> Any:
        """Fields: model_path, lora, train, ruler, promotion (dicts of settings), paused."""
        return self._send(Call("POST", "/admin/policies", {"name": name, "base_model": base_model, **fields}, admin=True))

    def policies(self) -> Any:
        return self._send(Call("GET", "/admin/policies", admin=True))

    def status(self, policy: str) -> Any:
        """Step served, head, the candidate on trial and its test, groups ready and open, the
        last step's metrics, load errors."""
        return self._send(Call("GET", f"/admin/policies/{policy}", admin=True))

    def update_policy(self, policy: str, **fields: Any) -> Any:
        """Change settings: lora, train, ruler and promotion dicts are merged key by key."""
        return self._send(Call("PATCH", f"/admin/policies/{policy}", fields, admin=True))

    def teacher_answers(self, policy: str, model: str | None = None, limit: int = 100, max_tokens: int = 512) -> Any:
        """Have ``model`` answer the policy's ``limit`` newest distinct prompts (greedy), each
        answer recorded as a demonstration for the policy to imitate; ``model`` None: the
        policy's own teacher (``train.teacher``), shown its context."""
        body: dict[str, Any] = {"limit": limit, "max_tokens": max_tokens} | ({"model": model} if model is not None else {})
        return self._send(Call("POST", f"/admin/policies/{policy}/teacher-answers", body, admin=True))

    def pause(self, policy: str) -> Any:
        return self._send(Call("POST", f"/admin/policies/{policy}/pause", admin=True))

    def resume(self, policy: str) -> Any:
        return self._send(Call("POST", f"/admin/policies/{policy}/resume", admin=True))

    def train_now(self, policy: str) -> Any:
        """Train on the ready groups now, even fewer than groups_per_step."""
        return self._send(Call("POST", f"/admin/policies/{policy}/train", admin=True))

    def rollback(self, policy: str, step: int) -> Any:
        """Serve (and train on from) an earlier step; 0 is the base model."""
        return self._send(Call("POST", f"/admin/policies/{policy}/rollback", {"step": step}, admin=True))

    def promote(self, policy: str) -> Any:
        """Serve the candidate on trial to every trajectory now (409 ``no_candidate`` if none)."""
        return self._send(Call("POST", f"/admin/policies/{policy}/promote", admin=True))

    def reject(self, policy: str) -> Any:
        """End the candidate's trial; the served version keeps serving."""
        return self._send(Call("POST", f"/admin/policies/{policy}/reject", admin=True))

    def checkpoints(self, policy: str) -> Any:
        return self._send(Call("GET", f"/admin/policies/{policy}/checkpoints", admin=True))

    def metrics(self, policy: str) -> Any:
        """One entry per step: reward mean and std, loss, KL, tokens, seconds per phase, and
        eval_score / eval_trajectories, that version's held-out score (None where none)."""
        return self._send(Call("GET", f"/admin/policies/{policy}/metrics", admin=True))

    def eval_scores(self, policy: str) -> Any:
        """Every version (the base, step 0, first) with its held-out score: ``data`` is a list of
        {step, version, serving, trajectories, score}; score is None where nothing was rewarded."""
        return self._send(Call("GET", f"/admin/policies/{policy}/evals", admin=True))


def comparison(evals: Any, policy: str, base: int, step: int | None) -> dict[str, Any]:
    """``compare``'s answer from an ``eval_scores`` answer: the held-out score at ``base`` and at
    ``step`` (default: the version served now), and how much the second gained over the first."""
    versions = {v["step"]: v for v in evals["data"]}
    if step is None:
        step = next((v["step"] for v in evals["data"] if v["serving"]), 0)

    def at(n: int) -> dict[str, Any]:
        # A version nobody trained or evaluated has no entry: it has no score either.
        return versions.get(n) or {"object": "policy.eval", "step": n, "version": f"{policy}@{n}", "serving": False, "trajectories": 0, "score": None}

    before, now = at(base), at(step)
    delta = None if before["score"] is None or now["score"] is None else now["score"] - before["score"]
    return {"policy": policy, "base": before, "current": now, "delta": delta}


def trial_step(status: Any, step: int | None) -> int:
    """The version a held-out run goes to: ``step``, else the policy's candidate on trial."""
    if step is not None:
        return step
    candidate = status.get("candidate")
    if candidate is None:
        raise ValueError(f"policy {status.get('name')!r} has no candidate on trial: name the step to run against")
    return int(candidate["step"])


def trial_report(status: Any, policy: str, step: int, scores: list[Score]) -> dict[str, Any]:
    """What a held-out run reports: the run's own rewards (and the mean of each component the
    agent gave every task), and the candidate's test as the gateway now sees it (the served
    version's held-out trajectories against the candidate's)."""
    candidate = status.get("candidate") or {}
    mean = sum(s.reward for s in scores) / len(scores) if scores else None
    names = set.intersection(*(set(s.components) for s in scores)) if scores else set()
    return {
        "policy": policy,
        "step": step,
        "trajectories": len(scores),
        "mean": mean,
        "components": {name: sum(s.components[name] for s in scores) / len(scores) for name in sorted(names)},
        "test": candidate.get("test") if candidate.get("step") == step else None,
    }


def served_step(models: Any, policy: str) -> int | None:
    """The step a /v1/models answer says the policy serves (None: no such policy)."""
    return next((m.get("step", 0) for m in models.get("data", []) if m.get("id") == policy and m.get("owned_by") == "burnish"), None)


class OpenAIClients:
    """One ``openai.OpenAI`` and one ``openai.AsyncOpenAI`` per SDK client, made on first use.

    A trajectory's client is a copy (``with_options``) with its keys as default headers, which
    shares the connection pool: calls reuse connections across trajectories, and the SDK client's
    close closes them. A client per trajectory was left for the garbage collector, and
    AsyncOpenAI's finalizer closes its sockets from whichever thread collects it: on a thread
    running another event loop (a server in the same process), from the wrong loop, which
    asyncio does not support.
    """

    def __init__(self, base_url: str, api_key: str, *, asynchronous: bool) -> None:
        self._kwargs = {"base_url": f"{base_url}/v1", "api_key": api_key}
        self._asynchronous = asynchronous  # only an async SDK client can close an AsyncOpenAI
        self._sync: Any = None
        self._async: Any = None

    def sync(self) -> Any:
        if self._sync is None:
            import openai

            self._sync = openai.OpenAI(**self._kwargs)
        return self._sync

    def async_(self) -> Any:
        if not self._asynchronous:
            raise TypeError("async_openai() needs burnish.AsyncClient: a sync Client could not close it")
        if self._async is None:
            import openai

            self._async = openai.AsyncOpenAI(**self._kwargs)
        return self._async

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()

    async def aclose(self) -> None:
        self.close()
        if self._async is not None:
            await self._async.close()


_Keys = TypeVar("_Keys", bound="TrajectoryKeys")


class TrajectoryKeys:
    """A trajectory's identity on the gateway, and the ways to attach calls to it."""

    def __init__(self, gateway: str, clients: OpenAIClients, trajectory_id: str, group_id: str | None, group_size: int | None, eval: bool = False) -> None:
        self._gateway, self._clients = gateway, clients
        self.id, self.group_id, self.group_size = trajectory_id, group_id, group_size
        # Held out for evaluation: recorded and rewarded, never trained on.
        self.eval = eval
        self._entered: list[Any] = []  # context variable tokens, one per `with` entered

    @property
    def base_url(self) -> str:
        """The OpenAI base URL with the keys in its path, for frameworks that take only a URL
        (under ``/eval`` for a held-out trajectory)."""
        prefix = f"/g/{self.group_id}/t/{self.id}" if self.group_id else f"/t/{self.id}"
        return f"{self._gateway}{'/eval' if self.eval else ''}{prefix}/v1"

    @property
    def headers(self) -> dict[str, str]:
        """The same keys as headers, for clients that can set them (the plain /v1 base URL)."""
        out = {TRAJECTORY_HEADER: self.id}
        if self.group_id:
            out[GROUP_HEADER] = self.group_id
            if self.group_size:
                out[GROUP_SIZE_HEADER] = str(self.group_size)
        if self.eval:
            out[EVAL_HEADER] = "true"
        return out

    def __enter__(self: _Keys) -> _Keys:
        """The trajectory of the moment: calls from ``burnish.http_client()`` land in it (burnish/current.py)."""
        from burnish.current import CURRENT

        self._entered.append(CURRENT.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        from burnish.current import CURRENT

        CURRENT.reset(self._entered.pop())

    async def __aenter__(self: _Keys) -> _Keys:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def _with_keys(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**kwargs, "default_headers": {**self.headers, **(kwargs.get("default_headers") or {})}}

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` whose every call lands in this trajectory. It shares the SDK
        client's connections and is closed with it; ``kwargs`` go to ``with_options``."""
        return self._clients.sync().with_options(**self._with_keys(kwargs))

    def async_openai(self, **kwargs: Any) -> Any:
        """The same, as an ``openai.AsyncOpenAI`` (from an ``AsyncClient`` only)."""
        return self._clients.async_().with_options(**self._with_keys(kwargs))
