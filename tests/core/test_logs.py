"""Request ids and logs: the id goes back in a header and into log lines; JSON lines parse;
prompts and completions stay out of the logs unless asked for."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from burnish_server.core.platform.logs import JsonFormatter, RequestIdFilter, request_id
from tests.conftest import Gateway
from tests.upstream import Upstream

SECRET = "the-secret-prompt-7731"


def test_request_ids_go_back_in_a_header(gateway: Gateway, upstream: Upstream) -> None:
    with gateway.client() as c:
        given = c.post("/v1/chat/completions", json={"model": "tiny", "messages": []}, headers={"x-request-id": "mine-1"})
        made = c.get("/v1/trajectories/nobody")  # errors carry one too
        bad = c.get("/health", headers={"x-request-id": "not ok/" + "x" * 200})
    assert given.headers["x-request-id"] == "mine-1"
    assert made.status_code == 404 and made.headers["x-request-id"].startswith("req-")
    assert bad.headers["x-request-id"].startswith("req-")  # an unusable id is replaced
    assert len({given.headers["x-request-id"], made.headers["x-request-id"], bad.headers["x-request-id"]}) == 3


@pytest.mark.parametrize("log_bodies", [False, True])
def test_bodies_stay_out_of_logs_unless_asked(make_gateway, upstream: Upstream, caplog: pytest.LogCaptureFixture, log_bodies: bool) -> None:
    gw = make_gateway(log_bodies=log_bodies)
    with caplog.at_level(logging.DEBUG):
        with gw.client() as c:
            r = c.post(
                "/t/logged/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": SECRET}]}, headers={"x-request-id": "rid-9"}
            )
            assert r.status_code == 200
            c.post("/t/logged/v1/chat/completions", json={"model": "tiny"}, headers={"x-fault": "status:500"})  # an upstream error is logged
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert (SECRET in text) is log_bodies


def test_json_lines_carry_the_request_id() -> None:
    record = logging.LogRecord("burnish.gateway", logging.WARNING, __file__, 1, "upstream said %s", ("no",), None)
    token = request_id.set("rid-42")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "upstream said no" and line["request_id"] == "rid-42" and line["level"] == "warning"


def test_the_gateway_logs_json_when_asked(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import logging; from burnish_server.core.platform import logs; logs.configure('info', 'json'); logging.getLogger('burnish.gateway').info('hello %s', 'there')"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    line = json.loads(out.stderr.strip().splitlines()[-1])
    assert (line["message"], line["logger"], line["request_id"]) == ("hello there", "burnish.gateway", "-")
