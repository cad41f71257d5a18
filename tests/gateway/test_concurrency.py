"""500 concurrent streamed requests: each recorded exactly once, in the right trajectory."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import httpx

N_REQUESTS = 500
N_TRAJECTORIES = 100


async def _one(client: httpx.AsyncClient, i: int) -> str:
    trajectory = f"cc-{i % N_TRAJECTORIES}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"req-{i}"}], "stream": True}
    text, done = "", False
    async with client.stream("POST", f"/t/{trajectory}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["x-trajectory-id"] == trajectory
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
            done = done or line == "data: [DONE]"
        assert done
    return text


def test_500_concurrent_streams_recorded_exactly_once(make_gateway, upstream, database_url: str) -> None:
    gw = make_gateway(database_url)

    async def run() -> list[str]:
        limits = httpx.Limits(max_connections=N_REQUESTS, max_keepalive_connections=N_REQUESTS)
        async with httpx.AsyncClient(base_url=gw.url, limits=limits, timeout=120) as client:
            return await asyncio.gather(*(_one(client, i) for i in range(N_REQUESTS)))

    texts = asyncio.run(run())
    assert texts == [f"You said: req-{i} ok" for i in range(N_REQUESTS)]

    with gw.client() as c:
        exported = [json.loads(line) for line in c.get("/v1/trajectories/export").text.splitlines()]
    recorded: dict[str, list[str]] = defaultdict(list)
    for t in exported:
        for call in t["calls"]:
            assert call["status"] == "ok"
            recorded[t["id"]].append(call["request"]["messages"][0]["content"])
            assert call["response"]["choices"][0]["message"]["content"] == f"You said: {call['request']['messages'][0]['content']} ok"
    assert sum(len(v) for v in recorded.values()) == N_REQUESTS
    for k in range(N_TRAJECTORIES):
        assert sorted(recorded[f"cc-{k}"]) == sorted(f"req-{i}" for i in range(k, N_REQUESTS, N_TRAJECTORIES))
