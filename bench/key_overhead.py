"""What checking API keys costs the gateway: a closed gateway (keys on) against an open one.

Run from the repository root (about 1.5 minutes)::

    .venv/bin/python bench/key_overhead.py

One upstream (bench/harness.py: a fixed chat completion) and two recording gateways side by
side, each in its own process on its own fresh SQLite store: ``open`` has never had a key
(the embedded default), ``keys`` has one (made with ``burnish keys create``) and so checks
it on every call. Every request to both carries ``Authorization: Bearer <that key>`` (the
open gateway ignores it), so the bytes on the wire are the same. The two take turns on each
case: c=1 for 6 s (p50, p99) and c=64 for 10 s (req/s and the gateway's CPU per request).

Prints what keys add (ratios and differences, keys against open), writes
bench/results/key_overhead.json. Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import start_gateway  # noqa: E402
from harness import PLAIN_BODY, ROOT, VENV_BIN, Load, OtherLoad, git_state, install_cleanup, start_upstream  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "key_overhead.json"
CASES = ((1, 6.0, 1.0), (64, 10.0, 2.0))


def main() -> int:
    install_cleanup()
    started, other = time.time(), OtherLoad()
    open_dir, keys_dir = tempfile.mkdtemp(prefix="bench-open-"), tempfile.mkdtemp(prefix="bench-keys-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURNISH_")}
    made = subprocess.run(
        [str(VENV_BIN / "burnish"), "keys", "create", "--name", "bench", "--project", "bench", "--data-dir", keys_dir],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    key = made.stdout.strip()
    upstream = start_upstream()
    targets = {
        "open": start_gateway(upstream.url, True, open_dir, name="gateway-open", env=env),
        "keys": start_gateway(upstream.url, True, keys_dir, name="gateway-keys", env=env),
    }
    for target in targets.values():
        check_with_key(target.url, key)
    load = Load(api_key=key)
    out: dict = {label: {} for label in targets}
    for conns, seconds, warmup in CASES:
        for label, target in targets.items():
            r = out[label][f"c{conns}"] = load.run(target.url, PLAIN_BODY, conns, seconds, warmup, server=target)
            bad = f"  ERRORS {r['errors']} non-2xx {r['non2xx']}" if r["errors"] or r["non2xx"] else ""
            print(
                f"  {label:<5} c={conns:<3} {r['rps']:8.0f} req/s  p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms"
                f"  cpu {r.get('server_cpu_ms_per_req', 0):.3f} ms/req{bad}",
                flush=True,
            )
    o, k = out["open"], out["keys"]
    summary = {
        "c1_p50_added_ms": round(k["c1"]["p50_ms"] - o["c1"]["p50_ms"], 3),
        "c1_p99_added_ms": round(k["c1"]["p99_ms"] - o["c1"]["p99_ms"], 3),
        "c64_rps_ratio": round(k["c64"]["rps"] / o["c64"]["rps"], 3),
        "c64_cpu_ms_per_req_open": round(o["c64"].get("server_cpu_ms_per_req", 0), 3),
        "c64_cpu_ms_per_req_keys": round(k["c64"].get("server_cpu_ms_per_req", 0), 3),
    }
    print("\nkeys against open:", json.dumps(summary, indent=1))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "git": git_state(),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "load_tool": load.tool,
                "others_cpu_share": other.share(),
                "seconds": round(time.time() - started, 1),
                "results": out,
                "summary": summary,
            },
            indent=1,
        )
    )
    return 0


def check_with_key(url: str, key: str) -> None:
    """A call with the key must be answered (by both), or the figures mean nothing."""
    import httpx

    r = httpx.post(url + "/v1/chat/completions", content=PLAIN_BODY, headers={"content-type": "application/json", "authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200, (r.status_code, r.text[:300])


if __name__ == "__main__":
    raise SystemExit(main())
