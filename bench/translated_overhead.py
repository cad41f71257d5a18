"""What serving a policy on the Responses API or Anthropic Messages costs over chat completions.

Run from the repository root (about 3 minutes)::

    .venv/bin/python bench/translated_overhead.py

One upstream (bench/harness.py: a fixed chat completion, or a fixed 8-event stream) and
one recording gateway with the policy ``agent`` on it. The same question goes, in turn, to:

* ``direct``    the upstream's /v1/chat/completions
* ``chat``      the gateway's /v1/chat/completions for the policy (token ids asked for and
                scrubbed: the path every policy call took before)
* ``responses`` the gateway's /v1/responses for the policy: translated to a chat
                completion and back (``core/protocols/translate/responses.py``)
* ``messages``  the gateway's /v1/messages for the policy (``core/protocols/translate/messages.py``)

plain and streamed, at concurrency 1 (p50/p99 over 6 s) and 64 (req/s over 10 s, and the
gateway's CPU per request). Prints a table of what each translated surface adds over the
policy's chat path, writes bench/results/translated_overhead.json. Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import start_gateway  # noqa: E402
from harness import ROOT, Load, OtherLoad, Proc, git_state, install_cleanup, start_upstream  # noqa: E402

ADMIN = "bench-admin"
QUESTION = "Say hello in five words."
BODIES = {
    "direct": ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16}),
    "chat": ("/v1/chat/completions", {"model": "agent", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16}),
    "responses": ("/v1/responses", {"model": "agent", "input": QUESTION, "max_output_tokens": 16}),
    "messages": ("/v1/messages", {"model": "agent", "max_tokens": 16, "messages": [{"role": "user", "content": QUESTION}]}),
}
LAT_SECONDS, LAT_WARMUP = 6.0, 1.0
TPUT_SECONDS, TPUT_WARMUP = 10.0, 2.0
RESULTS = ROOT / "bench" / "results" / "translated_overhead.json"


def body_for(label: str, stream: bool) -> str:
    body = BODIES[label][1]
    return json.dumps({**body, "stream": True} if stream else body, separators=(",", ":"))


def check(url: str, label: str) -> None:
    """Each surface answers whole, plain and streamed, or the figures mean nothing."""
    path = BODIES[label][0]
    with httpx.Client(timeout=10) as client:
        for stream in (False, True):
            r = client.post(url + path, content=body_for(label, stream), headers={"content-type": "application/json"})
            assert r.status_code == 200, (label, stream, r.status_code, r.text[:300])
            assert ("Hello there" in r.text) or ("Hello" in r.text), (label, r.text[:300])


def main() -> int:
    install_cleanup()
    started, other, load = time.time(), OtherLoad(), Load()
    tmp = tempfile.mkdtemp(prefix="burnish-bench-")
    procs: list[Proc] = []
    res: dict = {}
    try:
        upstream = start_upstream()
        procs.append(upstream)
        gateway = start_gateway(upstream.url, True, os.path.join(tmp, "gw"), env={**os.environ, "BURNISH_ADMIN_TOKEN": ADMIN})
        procs.append(gateway)
        r = httpx.post(gateway.url + "/admin/policies", json={"name": "agent", "base_model": "tiny"}, headers={"authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 201, r.text
        time.sleep(1.5)  # the gateway follows the policy table
        print(f"upstream {upstream.url}; gateway {gateway.url}; load generator: {load.tool}; code: {git_state()}", flush=True)
        check(upstream.url, "direct")
        for label in ("chat", "responses", "messages"):
            check(gateway.url, label)
        for stream in (False, True):
            mode = "stream" if stream else "plain"
            for conns, seconds, warmup in ((1, LAT_SECONDS, LAT_WARMUP), (64, TPUT_SECONDS, TPUT_WARMUP)):
                for label, (path, _) in BODIES.items():
                    target = upstream if label == "direct" else gateway
                    out = res.setdefault(label, {}).setdefault(mode, {})[f"c{conns}"] = load.run(
                        target.url, body_for(label, stream), conns, seconds, warmup, server=target, path=path
                    )
                    bad = f"  ERRORS {out['errors']} non-2xx {out['non2xx']}" if out["errors"] or out["non2xx"] else ""
                    print(
                        f"  {label:<10} {mode:<6} c={conns:<3} {out['rps']:8.0f} req/s  p50 {out['p50_ms']:7.3f} ms  p99 {out['p99_ms']:7.3f} ms"
                        f"  cpu {out.get('server_cpu_ms_per_req', 0):.3f} ms/req{bad}",
                        flush=True,
                    )
    finally:
        for proc in reversed(procs):
            proc.stop()
        Proc.stop_all()
    busy = other.share()
    print(f"\nother processes used {busy:.0%} of the machine's CPU during the run" + (" -- WARNING: figures skewed" if busy > 0.05 else ""))

    rows = []
    print("\nAdded over the policy's chat path (ms: p50 at c=1; gateway CPU per request at c=64)")
    print(f"{'surface':<10}{'mode':<7} | {'p50':>7} {'added':>7} | {'req/s':>7} | {'cpu/req':>7} {'added':>7}")
    for mode in ("plain", "stream"):
        base = res["chat"][mode]
        for label in ("chat", "responses", "messages"):
            r1, r64 = res[label][mode]["c1"], res[label][mode]["c64"]
            row = {
                "surface": label,
                "mode": mode,
                "p50_ms": r1["p50_ms"],
                "p99_ms": r1["p99_ms"],
                "added_p50_ms": r1["p50_ms"] - base["c1"]["p50_ms"],
                "added_over_direct_p50_ms": r1["p50_ms"] - res["direct"][mode]["c1"]["p50_ms"],
                "rps_c64": r64["rps"],
                "cpu_ms_per_req": r64.get("server_cpu_ms_per_req"),
                "added_cpu_ms_per_req": (r64.get("server_cpu_ms_per_req") or 0) - (base["c64"].get("server_cpu_ms_per_req") or 0),
            }
            rows.append(row)
            print(
                f"{label:<10}{mode:<7} | {row['p50_ms']:>7.3f} {row['added_p50_ms']:>+7.3f} | {row['rps_c64']:>7.0f} | {row['cpu_ms_per_req'] or 0:>7.3f} {row['added_cpu_ms_per_req']:>+7.3f}"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.time() - started), "machine": platform.machine(), "cpus": os.cpu_count()}
    RESULTS.write_text(json.dumps({"meta": {**meta, "code": git_state(), "load": load.tool, "other_cpu": busy}, "rows": rows, "raw": res}, indent=2))
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
