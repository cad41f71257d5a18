"""The SDK (sdk/burnish) against a real gateway and the deterministic upstream: every public
call, sync and async, and its error path. Training through the SDK, against vLLM and the
trainer, is the learning test (tests/e2e/test_learning.py runs examples/digits.py).
"""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from burnish import AsyncClient, BurnishError, Client, StepTimeout
from tests.conftest import ADMIN_TOKEN, Gateway, set_served_step
from tests.judge import Judge, scores
from tests.upstream import Upstream

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def gw(make_gateway, upstream: Upstream, judge: Judge, judge_server: tuple[Judge, str]) -> Gateway:
    judge.script = [scores(lambda t: 0.5)]
    return make_gateway(judge_base_url=judge_server[1], judge_model="judge")


def test_groups_trajectories_and_rewards(gw: Gateway, upstream: Upstream) -> None:
    client = Client(gw.url + "/v1", api_key="agent-key")  # a trailing /v1 is accepted
    with client.group(size=2) as group:
        first, second = group.trajectory(), group.trajectory("mine-2")
        reply = first.openai().chat.completions.create(model="tiny", messages=HI)
        assert reply.choices[0].message.content
        assert upstream.requests[-1]["headers"]["authorization"] == "Bearer agent-key"
        # A framework that takes only a base URL: the keys ride in the path.
        assert second.base_url == f"{gw.url}/g/{group.id}/t/mine-2/v1"
        assert httpx.post(second.base_url + "/chat/completions", json={"model": "tiny", "messages": HI}).status_code == 200
        first.openai().chat.completions.create(model="tiny", messages=HI)
        assert [c["reward"] for c in first.reward_call(-1, 0.5, tool=1.0)["calls"]] == [None, 0.5]  # credit per turn
        assert first.reward(0.25, format=1.0)["group_closed"] is False
        assert second.reward(0.75)["group_closed"] is True  # size 2: the second reward closes it
    got = first.get()
    assert (got["group_id"], got["reward"], got["reward_components"], len(got["calls"])) == (group.id, 0.25, {"format": 1.0}, 2)
    assert [(r["call"], r["reward"]) for r in got["rewards"]] == [(1, 0.5), (None, 0.25)]
    assert [m["id"] for m in client.get_group(group.id)["members"]] == [first.id, "mine-2"]
    alone = client.trajectory()
    alone.openai().chat.completions.create(model="tiny", messages=HI)
    assert client.get_trajectory(alone.id)["group_id"] is None
    assert [m["id"] for m in client.models()["data"]] == ["tiny"]


def test_a_group_left_by_an_error_stays_open_and_a_clean_one_closes(gw: Gateway) -> None:
    client = Client(gw.url)
    with pytest.raises(RuntimeError), client.group() as failed:
        failed.trajectory().openai().chat.completions.create(model="tiny", messages=HI)
        raise RuntimeError("the agent crashed")
    assert client.get_group(failed.id)["closed_at"] is None
    with client.group() as done:
        done.trajectory().openai().chat.completions.create(model="tiny", messages=HI)
    assert client.get_group(done.id)["close_reason"] == "closed"


def test_ruler_through_the_sdk(gw: Gateway) -> None:
    client = Client(gw.url)
    with client.group() as group:
        for _ in range(2):
            group.trajectory().openai().chat.completions.create(model="tiny", messages=HI)
        out = group.ruler(rubric="Be brief.")
    assert [s["score"] for s in out["scores"]] == [0.5, 0.5]


def test_gateway_errors_are_exceptions_with_its_message(gw: Gateway) -> None:
    client = Client(gw.url, admin_token=ADMIN_TOKEN)
    with pytest.raises(BurnishError) as caught:
        client.reward("nobody", 1.0)
    assert (caught.value.status, caught.value.code) == (404, "trajectory_not_found") and "nobody" in caught.value.message
    with pytest.raises(ValueError, match="finite"):
        client.reward("nobody", math.inf)  # refused before it is sent
    with pytest.raises(BurnishError) as caught:
        client.reward("nobody", 1.0, **{"x" * 65: 1.0})
    assert (caught.value.status, caught.value.code) == (400, "invalid_reward")
    with pytest.raises(BurnishError) as caught:
        client.get_group("no-such-group")
    assert caught.value.code == "group_not_found"
    with pytest.raises(ValueError, match="admin token"):
        Client(gw.url).status("agent")
    with pytest.raises(BurnishError) as caught:
        Client(gw.url, admin_token="wrong").policies()
    assert (caught.value.status, caught.value.code) == (401, "invalid_admin_token")
    with pytest.raises(BurnishError) as caught:
        client.ruler("no-such-group")
    assert caught.value.code == "group_not_found"


def test_admin_helpers(gw: Gateway) -> None:
    client = Client(gw.url, admin_token=ADMIN_TOKEN)
    created = client.create_policy("agent", "tiny", lora={"rank": 8}, train={"learning_rate": 5e-3})
    assert created["lora"]["rank"] == 8 and created["step"] == 0
    assert [p["name"] for p in client.policies()["data"]] == ["agent"]
    assert client.update_policy("agent", train={"kl_coef": 0.01})["train"]["kl_coef"] == 0.01
    assert client.pause("agent")["paused"] is True
    assert client.resume("agent")["paused"] is False
    assert client.status("agent")["served_version"] == "agent@0"
    assert client.checkpoints("agent")["data"] == [] and client.metrics("agent")["data"] == []
    assert client.rollback("agent", 0)["head"] == 0
    for call, code in ((lambda: client.train_now("agent"), "no_ready_groups"), (lambda: client.rollback("agent", 4), "checkpoint_not_found"),
                       (lambda: client.create_policy("agent", "tiny"), "policy_exists"), (lambda: client.status("ghost"), "policy_not_found")):  # fmt: skip
        with pytest.raises(BurnishError) as caught:
            call()
        assert caught.value.code == code
    for call in (client.pause, client.resume, client.checkpoints, client.metrics, lambda name: client.update_policy(name, paused=True)):
        with pytest.raises(BurnishError) as caught:
            call("ghost")
        assert (caught.value.status, caught.value.code) == (404, "policy_not_found")
    with pytest.raises(BurnishError) as caught:
        client.update_policy("agent", train={"learning_rate": -1})
    assert caught.value.code == "invalid_train" and "learning_rate" in caught.value.message
    with Client(gw.url) as scoped:  # a client closes its connections on leaving the block
        assert scoped.trajectory().headers["X-Trajectory-Id"].startswith("t-")


def test_wait_for_step(gw: Gateway) -> None:
    admin, plain = Client(gw.url, admin_token=ADMIN_TOKEN), Client(gw.url)
    admin.create_policy("agent", "tiny")
    set_served_step(gw, 2)
    assert admin.wait_for_step("agent", 2, timeout=5) == 2
    assert plain.wait_for_step("agent", 1, timeout=5) == 2  # no admin token needed
    with pytest.raises(StepTimeout):
        plain.wait_for_step("agent", 3, timeout=0.3, poll=0.1)


def test_the_async_client(gw: Gateway, upstream: Upstream) -> None:
    async def main() -> None:
        async with AsyncClient(gw.url, admin_token=ADMIN_TOKEN) as client:
            await client.create_policy("agent", "tiny")
            async with client.group(size=2) as group:
                members = [group.trajectory() for _ in range(2)]
                for t in members:
                    await t.async_openai().chat.completions.create(model="agent", messages=HI)
                    assert str(t.openai().base_url) == gw.url + "/v1/"  # the sync form exists on both
                await members[0].reward(1.0)
                out = await group.ruler()
                assert len(out["scores"]) == 2
            assert (await members[1].get())["reward"] == 0.5  # RULER set it
            assert (await client.get_group(group.id))["close_reason"] == "ruler"
            lone = client.trajectory()
            await lone.async_openai().chat.completions.create(model="tiny", messages=HI)
            assert (await client.get_trajectory(lone.id))["calls"][0]["model"] == "tiny"
            assert (await lone.reward_call(0, -0.5))["calls"][0]["reward"] == -0.5
            assert await client.wait_for_step("agent", 0, timeout=5) == 0
            with pytest.raises(StepTimeout):
                await client.wait_for_step("agent", 1, timeout=0.3, poll=0.1)
            with pytest.raises(BurnishError) as caught:
                await client.close_group("ghost")
            assert caught.value.code == "group_not_found"
            assert (await client.status("agent"))["groups_ready"] == 0
            for call in (client.pause, client.resume, client.checkpoints, client.metrics):
                await call("agent")
            assert [p["name"] for p in (await client.policies())["data"]] == ["agent"]
            await client.update_policy("agent", paused=False)
            await client.rollback("agent", 0)
            with pytest.raises(BurnishError):
                await client.train_now("agent")
            assert (await client.models())["data"][0]["id"] == "agent"

    asyncio.run(main())


def test_trajectories_share_the_clients_openai_connections_and_close_with_it(gw: Gateway, upstream: Upstream) -> None:
    # A client per trajectory, left for the garbage collector, used to be closed from whichever
    # thread collected it: from a thread running another event loop, on the wrong loop.
    async def main() -> None:
        client = AsyncClient(gw.url)
        first, second = client.trajectory(), client.group(size=2).trajectory()
        llms = [first.async_openai(), second.async_openai(max_retries=0), second.openai()]
        for llm in llms[:2]:
            await llm.chat.completions.create(model="tiny", messages=HI)
        llms[2].chat.completions.create(model="tiny", messages=HI)
        assert [len((await client.get_trajectory(t.id))["calls"]) for t in (first, second)] == [1, 2]
        assert llms[1].max_retries == 0 and not any(llm.is_closed() for llm in llms)
        await client.aclose()
        assert all(llm.is_closed() for llm in llms)

    asyncio.run(main())
    with Client(gw.url) as client:
        llm = client.trajectory().openai()
        with pytest.raises(TypeError, match="AsyncClient"):
            client.trajectory().async_openai()
    assert llm.is_closed()


def test_clients_built_once_file_each_call_under_the_trajectory_entered(gw: Gateway) -> None:
    """A model client built once (an OpenAI client, a LangChain chain, as a LangGraph graph
    holds one) with burnish.http_client(): each call lands in the trajectory of the moment,
    and a call outside any trajectory carries no keys of one."""
    import openai
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    import burnish

    client = Client(gw.url)
    llm = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", http_client=burnish.http_client())
    chain = ChatPromptTemplate.from_messages([("user", "{question}")]) | ChatOpenAI(
        model="tiny", base_url=f"{gw.url}/v1", api_key="unused", http_client=burnish.http_client(), max_retries=0
    )
    with client.group(size=2) as group:
        for _ in range(2):
            with group.trajectory() as t:
                llm.chat.completions.create(model="tiny", messages=HI)
                chain.invoke({"question": "hi"})
            t.reward(1.0)
    assert [m["call_count"] for m in client.get_group(group.id)["members"]] == [2, 2]
    outside = llm.chat.completions.with_raw_response.create(model="tiny", messages=HI)
    assert client.get_trajectory(outside.headers["x-trajectory-id"])["group_id"] is None  # a one-call trajectory of its own


async def test_trajectories_entered_in_concurrent_tasks_never_mix(gw: Gateway) -> None:
    import openai

    import burnish

    client = AsyncClient(gw.url)
    llm = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", http_client=burnish.async_http_client())

    async def run(t: burnish.AsyncTrajectory) -> None:
        async with t:
            for _ in range(3):
                await llm.chat.completions.create(model="tiny", messages=HI)
                await asyncio.sleep(0.01)  # the other task runs between this one's calls

    group = client.group()
    first, second = group.trajectory(), group.trajectory()
    await asyncio.gather(run(first), run(second))
    assert [(await client.get_trajectory(t.id))["call_count"] for t in (first, second)] == [3, 3]
    await client.aclose()


class Away:
    """A gateway whose store is away for the first ``away`` requests: 503 with ``Retry-After``
    (the gateway's own answer then), or without it where ``retry_after`` is None."""

    def __init__(self, away: int, retry_after: str | None = "0") -> None:
        self.away, self.retry_after, self.requests = away, retry_after, 0

    async def __call__(self, scope: dict, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http":
            return
        self.requests += 1
        if self.requests <= self.away:
            status, body = 503, b'{"error": {"message": "the store is unavailable", "type": "api_error", "param": null, "code": "store_unavailable"}}'
            headers = [(b"content-type", b"application/json")] + ([(b"retry-after", self.retry_after.encode())] if self.retry_after else [])
        else:
            status, body, headers = 200, b'{"id": "t1", "object": "trajectory"}', [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_503_with_retry_after_is_sent_again_as_it_says(asynchronous: bool) -> None:
    """The store restarting for a moment: the SDK waits and sends again (up to five times);
    past that, or a 503 that names no time, the error is the caller's."""
    from tests.servers import ServerThread

    def get(app: Away) -> object:
        server = ServerThread(app).start()
        try:
            if asynchronous:
                return asyncio.run(AsyncClient(server.url).get_trajectory("t1"))
            return Client(server.url).get_trajectory("t1")
        finally:
            server.stop()

    back = Away(away=3)
    assert get(back) == {"id": "t1", "object": "trajectory"} and back.requests == 4
    for away in (Away(away=100), Away(away=100, retry_after=None)):
        with pytest.raises(BurnishError) as failed:
            get(away)
        assert (failed.value.status, failed.value.code) == (503, "store_unavailable")
        assert away.requests == (6 if away.retry_after else 1)
