"""The load generator used where wrk cannot be had (see harness.Load), in its own process.

    python bench/pyload.py URL CONNECTIONS SECONDS TAG BODY [API_KEY]

Prints one line, ``WRKJSON {...}``, in the shape the wrk script's ``done()`` prints.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def _python_load(url: str, conns: int, duration: float, tag: str, body: str, api_key: str | None = None) -> None:
    """``conns`` workers, each with its own keep-alive connection, as wrk has.

    aiohttp where it is installed (it keeps up with the gateway at c=64; httpx does not);
    otherwise httpx with one client per worker (a shared httpx pool scans all its
    connections on every request).
    """
    lat: list[float] = []
    errors = non2xx = counter = 0
    data = body.encode()
    start = time.perf_counter()
    deadline = start + duration
    try:
        import aiohttp

        def client():  # noqa: ANN202
            return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=10))

        async def post(c, headers):  # noqa: ANN001, ANN202
            async with c.post(url, data=data, headers=headers) as r:
                await r.read()  # the whole body, every event of a stream
                return r.status

        failures: tuple = (aiohttp.ClientError, asyncio.TimeoutError)
    except ImportError:
        import httpx

        def client():  # noqa: ANN202
            return httpx.AsyncClient(limits=httpx.Limits(max_connections=1), timeout=10)

        async def post(c, headers):  # noqa: ANN001, ANN202
            async with c.stream("POST", url, content=data, headers=headers) as r:
                await r.aread()
                return r.status_code

        failures = (httpx.HTTPError,)

    async def worker() -> None:
        nonlocal counter, errors, non2xx
        async with client() as c:
            while time.perf_counter() < deadline:
                counter += 1
                t0 = time.perf_counter()
                try:
                    headers = {"content-type": "application/json", "x-trajectory-id": f"{tag}-{counter}"}
                    if api_key:
                        headers["authorization"] = f"Bearer {api_key}"
                    status = await post(c, headers)
                    lat.append(time.perf_counter() - t0)
                    non2xx += status >= 400
                except failures:
                    errors += 1

    await asyncio.gather(*(worker() for _ in range(conns)))
    elapsed = time.perf_counter() - start
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0.0  # noqa: E731
    result = {
        "requests": len(lat),
        "duration_s": elapsed,
        "errors": errors,
        "non2xx": non2xx,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "mean_ms": sum(lat) / len(lat) * 1000 if lat else 0.0,
        "max_ms": lat[-1] * 1000 if lat else 0.0,
    }
    print("WRKJSON " + json.dumps(result))


if __name__ == "__main__":
    _url, _conns, _duration, _tag, _body = sys.argv[1:6]
    _key = sys.argv[6] if len(sys.argv) > 6 else None
    try:
        from uvloop import run as _run
    except ImportError:
        _run = asyncio.run
    _run(_python_load(_url, int(_conns), float(_duration), _tag, _body, _key))
