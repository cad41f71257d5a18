"""Screenshots of a running gateway's dashboard, one PNG per page (docs/dashboard.md's come from here).

Run it beside a gateway that has data, for example after `make demo-agent` with the same data
directory started again (`burnish up`), in a browser from Debian's packages (`chromium`,
which `make test` installs)::

    .venv/bin/python examples/dashboard_screenshots.py --gateway http://127.0.0.1:8080 \\
        --admin-token "$(cat burnish-data/admin-token)" --out docs/dashboard

It signs in with the token, then opens the policies, the policy's page, the groups, the
trajectories, the newest trained trajectory with several calls (its tokens loaded from vLLM),
and the base compared with the served version on the held-out tasks.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright


def _trajectory(gateway: str, token: str, policy: str) -> str:
    """The newest trained trajectory of ``policy`` with more than one call."""
    with httpx.Client(base_url=gateway, headers={"authorization": f"Bearer {token}"}, timeout=60) as c:
        page = c.get("/v1/trajectories", params={"eval": "false", "limit": 200}).json()
        for entry in page["data"]:
            if entry.get("call_count", 0) > 1 and entry.get("reward") is not None:
                found = c.get(f"/v1/trajectories/{entry['id']}").json()
                if any(call.get("policy") == policy and call.get("extends_previous") is not None for call in found["calls"]):
                    return str(entry["id"])
    raise SystemExit("no trajectory with several calls yet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument("--admin-token", required=True)
    parser.add_argument("--policy", default="agent")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard"))
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=args.gateway, headers={"authorization": f"Bearer {args.admin_token}"}) as c:
        served = c.get(f"/admin/policies/{args.policy}").json()["step"]
    trajectory = _trajectory(args.gateway, args.admin_token, args.policy)
    pages = {
        "policies": "/ui",
        "policy": f"/ui/policies/{args.policy}",
        "groups": f"/ui/groups?policy={args.policy}",
        "trajectories": "/ui/trajectories?eval=false",
        "trajectory": f"/ui/trajectories/{trajectory}",
        "compare": f"/ui/policies/{args.policy}/compare?a=0&b={served}",
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
        page.goto(args.gateway + "/ui/login")
        page.fill("input[name=token]", args.admin_token)
        page.click("button[type=submit]")
        for name, path in pages.items():
            page.goto(args.gateway + path)
            page.wait_for_load_state("networkidle")  # the token texts, fetched by htmx
            page.screenshot(path=str(args.out / f"{name}.png"), full_page=name not in ("trajectory", "trajectories", "groups"))
            print(f"{name}: {args.out / f'{name}.png'} ({path})")
        browser.close()


if __name__ == "__main__":
    main()
