"""The `burnish` command as a user runs it: a real process, settings from flags and environment."""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from tests.servers import free_port

BURNISH = [sys.executable, "-m", "burnish_server.cli"]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("gateway did not become healthy")


def test_gateway_command_serves_records_and_stops(upstream_server, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "BURNISH_DATA_DIR": str(tmp_path / "data"), "BURNISH_PORT": "1"}  # the flag beats the environment
    proc = subprocess.Popen([*BURNISH, "gateway", "--upstream", upstream_server[1] + "/v1", "--port", str(port)], env=env, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        client = openai.OpenAI(base_url=url + "/t/cli-1/v1", api_key="k")
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "You said: hi ok"
        # An idle connection outlives the clients' own expiry (5 s in httpx): at uvicorn's 5 s,
        # a client reusing it just as the gateway closed it got a ReadError.
        # http.client reads whole responses (headers and body may arrive in separate segments) and
        # raises RemoteDisconnected, never reconnecting, when the server closed the connection.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            for pause in (0, 5.5):
                time.sleep(pause)
                conn.request("GET", "/health")
                response = conn.getresponse()
                assert (response.status, response.read()) == (200, b'{"status":"ok"}')
        finally:
            conn.close()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    assert (tmp_path / "data" / "burnish.db").exists()
    # A second start finds the schema in place and the call still there.
    proc = subprocess.Popen([*BURNISH, "gateway", "--upstream", upstream_server[1], "--port", str(port)], env=env, stderr=subprocess.PIPE)
    try:
        wait_healthy(url, proc)
        assert httpx.get(url + "/v1/trajectories/cli-1").json()["call_count"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_several_workers_share_the_port_and_record_every_call(upstream_server, database_url: str, tmp_path: Path) -> None:
    """`burnish gateway --workers 2`: two processes on one port, one store (SQLite or PostgreSQL)."""
    port = free_port()
    env = {**os.environ, "BURNISH_DATA_DIR": str(tmp_path / "data")}
    cmd = [*BURNISH, "gateway", "--workers", "2", "--upstream", upstream_server[1], "--port", str(port), "--database-url", database_url]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=60)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) >= 2  # the workers (and multiprocessing's helper, where it runs one)

        async def calls() -> list[int]:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
                answers = await asyncio.gather(*(client.post(f"/t/w-{i}/v1/chat/completions", json=body) for i in range(60)))
            return [r.status_code for r in answers]

        assert asyncio.run(calls()) == [200] * 60
        with httpx.Client(base_url=url) as client:
            assert all(client.get(f"/v1/trajectories/w-{i}").json()["call_count"] == 1 for i in range(60))
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def test_db_upgrade_command(database_url: str) -> None:
    out = subprocess.run([*BURNISH, "db", "upgrade", "--database-url", database_url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "database at head" in out.stdout


def test_bad_setting_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, "BURNISH_MAX_BODY_BYTES": "lots", "BURNISH_DATA_DIR": str(tmp_path)}
    out = subprocess.run([*BURNISH, "gateway"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "max_body_bytes" in out.stderr


def test_status_says_where_each_policy_stands(make_gateway, upstream, tmp_path: Path) -> None:
    """`burnish status`: what a user would curl the admin API for, in a few lines, with the
    token burnish up keeps in the data directory."""
    from tests.conftest import ADMIN_TOKEN

    gw = make_gateway()
    gw.create_policy("agent", base_model="tiny")
    chat = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}
    with gw.client() as c:
        for name, rewards in (("apart", (0.0, 1.0)), ("tie", (1.0, 1.0))):
            for i, r in enumerate(rewards):
                assert c.post(f"/g/{name}/t/{name}-{i}/v1/chat/completions", json=chat, headers={"x-group-size": "2"}).status_code == 200
                assert c.post(f"/v1/trajectories/{name}-{i}/reward", json={"reward": r}).status_code == 200
        assert c.post("/g/open/t/open-0/v1/chat/completions", json=chat).status_code == 200
    data = tmp_path / "status-data"
    data.mkdir()
    (data / "admin-token").write_text(ADMIN_TOKEN)
    env = {**os.environ, "BURNISH_DATA_DIR": str(data)}
    out = subprocess.run([*BURNISH, "status", "--url", gw.url], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "agent: serving agent@0 (base tiny)"
    assert "groups: 1 open, 2 closed (1 ready to train), 0 trained, 0 held out; a step takes 2" in out.stdout
    assert "no step yet" in out.stdout and "health: ok" in out.stdout
    one = subprocess.run([*BURNISH, "status", "agent", "--json", "--url", gw.url, "--token", ADMIN_TOKEN], capture_output=True, text=True, timeout=60)
    assert one.returncode == 0 and '"groups_ready":1' in one.stdout
    refused = subprocess.run([*BURNISH, "status", "--url", gw.url, "--token", "wrong"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "refused the admin token (401)" in refused.stderr
    away = subprocess.run([*BURNISH, "status", "--url", f"http://127.0.0.1:{free_port()}"], env=env, capture_output=True, text=True, timeout=60)
    assert away.returncode == 1 and "is burnish up running?" in away.stderr


def test_bad_input_to_each_command_is_one_line_with_the_fix(make_gateway, tmp_path: Path) -> None:
    """Every command answers bad input with one line saying what to do and a non-zero exit,
    never a traceback: a store that does not answer, a policy or a version that does not
    exist, a port out of range, a file that is not JSON Lines."""
    from tests.conftest import ADMIN_TOKEN

    gw = make_gateway()
    gw.create_policy("agent")
    (tmp_path / "bad.jsonl").write_text('{"messages": [\n')
    away = f"postgresql://127.0.0.1:{free_port()}/test"
    cases = {
        ("keys", "list", "--database-url", away): "is the database up and its URL right? (--database-url, BURNISH_DATABASE_URL)",
        ("db", "prune", "--database-url", away): "is the database up and its URL right?",
        ("status", "nosuch", "--url", gw.url, "--token", ADMIN_TOKEN): "no policy 'nosuch' at",
        ("export", "nosuch", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data")): "no policy 'nosuch'",
        ("gateway", "--port", "99999"): "99999 is not in the range 1<=x<=65535",
        ("sft", str(tmp_path / "bad.jsonl"), "--url", gw.url, "--token", ADMIN_TOKEN): "bad.jsonl:1: not JSON",
    }
    for args, fix in cases.items():
        out = subprocess.run([*BURNISH, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "Traceback" not in out.stderr, (args, out.stderr)
        assert fix in out.stderr and out.stderr.strip().splitlines()[-1].startswith("Error: "), (args, out.stderr)
