"""``burnish up``'s plan (cli/up_plan.py): from its options and the facts read beforehand (the
machine, the model, the policy as stored), what it starts and with what. Pure: no process
starts, no file or port is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from burnish_server.cli.up import TINY_MODEL_DEFAULTS
from burnish_server.cli.up_plan import Machine, Served, UpOptions, UpPlan, plan_up, training_note, wanted_policy
from burnish_server.core.learning.defaults import ModelShape, defaults
from burnish_server.core.learning.policies import LoraSettings, Policy
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.process import SERVED_LORA_MODULES, VLLMServer, split_cores
from burnish_server.serving.tool_calling import ToolCalling

DATA = Path("/data")
STORE = ("--data-dir", "/data")
SMOLLM2 = defaults(ModelShape(model_type="llama", hidden_size=576))


def served(model: str = "/data/models/smollm2", name: str | None = "smollm2", port: int = 8000, tiny: bool = False) -> Served:
    """What ``prepare_model`` gives, without reading or converting anything."""
    vllm = VLLMServer(model=model, served_model_name=name, log_path=DATA / "logs" / "vllm.log", port=port)
    return Served(vllm, ToolCalling("hermes", None, "tool calls: hermes"), TINY_MODEL_DEFAULTS if tiny else SMOLLM2)


def machine(ports: tuple[int, ...] = (8000,), cores: int = 2, cpu_build: bool = True, **environ: str) -> Machine:
    return Machine(vllm_ports=ports, cores=tuple(range(cores)), cpu_build=cpu_build, hostname="box", environ={"PATH": "/bin", **environ})


def fleet(plan: UpPlan) -> list[tuple[int, str, str | None, bool]]:
    return [(v.port, v.log_path.name, v.cpu_cores, v.pausable) for v in plan.fleet]


# Each case: the options, the settings' overrides, the facts (machine, model, stored policy's LoRA
# rank: None for the policy as wanted), and the plan's fields it is about.
CASES: list[Any] = [
    pytest.param(
        UpOptions(),
        {},
        machine(),
        served(),
        None,
        {
            "fleet": [(8000, "vllm.log", None, True)],
            "upstream": "http://127.0.0.1:8000",
            "gateway_url": "http://127.0.0.1:8080",
            "gateway_args": ("gateway", "--upstream", "http://127.0.0.1:8000", "--host", "127.0.0.1", "--port", "8080", *STORE),
            "trainer_args": ("trainer", "--upstream", "http://127.0.0.1:8000", "--worker-id", "box-up", *STORE),
            "max_lora_rank": 16,
            "pause_sampling_s": 30.0,
            "logs": DATA / "logs",
            "env": {"PATH": "/bin", "BURNISH_ADMIN_TOKEN": "tok", "BURNISH_MAX_LORA_RANK": "16", "BURNISH_TRAINER_PAUSE_SAMPLING": "30.0"},
        },
        id="defaults: smollm2, one replica, CPU build",
    ),
    pytest.param(
        UpOptions(model="tiny"),
        {},
        machine(),
        served("/data/models/tiny", "tiny", tiny=True),
        None,
        {"fleet": [(8000, "vllm.log", None, True)], "max_lora_rank": 16},
        id="the tiny model: its rank 8 within vLLM's 16",
    ),
    pytest.param(
        UpOptions(model="Qwen/Qwen2.5-0.5B-Instruct"),
        {},
        machine(),
        served("Qwen/Qwen2.5-0.5B-Instruct", None),
        None,
        {"upstream": "http://127.0.0.1:8000", "max_lora_rank": 16},
        id="a hub id, served under its own name",
    ),
    pytest.param(
        UpOptions(replicas=3),
        {},
        machine((8000, 8001, 8003), cores=8),
        served(),
        None,
        {
            "fleet": [(8000, "vllm.log", "0,1", True), (8001, "vllm-1.log", "2,3", True), (8003, "vllm-2.log", "4,5", True)],
            "upstream": "http://127.0.0.1:8000,http://127.0.0.1:8001,http://127.0.0.1:8003",
        },
        id="three replicas on eight cores: each its share, its port and its log",
    ),
    pytest.param(
        UpOptions(replicas=3),
        {},
        machine((8000, 8001, 8002), cores=2),
        served(),
        None,
        {"fleet": [(8000, "vllm.log", None, True), (8001, "vllm-1.log", None, True), (8002, "vllm-2.log", None, True)]},
        id="fewer cores than replicas: vLLM's own choice for each",
    ),
    pytest.param(
        UpOptions(replicas=2),
        {},
        machine((8000, 8001), cores=16, cpu_build=False),
        served(),
        None,
        {"fleet": [(8000, "vllm.log", None, False), (8001, "vllm-1.log", None, False)], "pause_sampling_s": 0.0},
        id="GPU build: no core shares, no pausing",
    ),
    pytest.param(
        UpOptions(vllm_port=9000, replicas=2),
        {"host": "0.0.0.0", "port": 9090, "insecure": True, "database_url": "postgresql://u@db/burnish", "data_dir": "/srv/burnish"},
        machine((9000, 9001), cores=4),
        served(port=9000),
        None,
        {
            "fleet": [(9000, "vllm.log", "0,1", True), (9001, "vllm-1.log", "2,3", True)],
            "gateway_url": "http://0.0.0.0:9090",
            "gateway_args": (
                "gateway",
                "--upstream",
                "http://127.0.0.1:9000,http://127.0.0.1:9001",
                "--host",
                "0.0.0.0",
                "--port",
                "9090",
                "--data-dir",
                "/srv/burnish",
                "--database-url",
                "postgresql://u@db/burnish",
            ),
            "logs": Path("/srv/burnish/logs"),
            "env": {
                "PATH": "/bin",
                "BURNISH_ADMIN_TOKEN": "tok",
                "BURNISH_MAX_LORA_RANK": "16",
                "BURNISH_TRAINER_PAUSE_SAMPLING": "30.0",
                "BURNISH_INSECURE": "true",
            },
        },
        id="custom ports, host and store, insecure",
    ),
    pytest.param(
        UpOptions(),
        {"trainer_pause_sampling": 0},
        machine(BURNISH_TRAINER_PAUSE_SAMPLING="0"),
        served(),
        None,
        {"fleet": [(8000, "vllm.log", None, False)], "pause_sampling_s": 0.0},
        id="BURNISH_TRAINER_PAUSE_SAMPLING=0 on the CPU build: never paused",
    ),
    pytest.param(
        UpOptions(),
        {},
        machine(),
        served(),
        64,
        {"max_lora_rank": 64},
        id="a stored policy of rank 64: vLLM serves it, the gateway is told",
    ),
]


@pytest.mark.parametrize(("options", "overrides", "facts", "model", "stored_rank", "expected"), CASES)
def test_the_plan(options: UpOptions, overrides: dict[str, Any], facts: Machine, model: Served, stored_rank: int | None, expected: dict[str, Any]) -> None:
    settings = Settings.load({}, **{"data_dir": str(DATA), **overrides})
    wanted = wanted_policy(options.policy, model)
    stored = wanted if stored_rank is None else Policy(name=wanted.name, base_model=wanted.base_model, lora=LoraSettings(rank=stored_rank))
    plan = plan_up(settings, options, machine=facts, served=model, policy=stored, admin_token="tok", admin_token_file=None)

    got = {name: fleet(plan) if name == "fleet" else getattr(plan, name) for name in expected}
    assert got == expected
    assert plan.policy == stored and plan.env["BURNISH_MAX_LORA_RANK"] == str(plan.max_lora_rank)
    assert all(v.max_lora_rank == plan.max_lora_rank and v.process is None for v in plan.fleet)
    # The model as prepared is left as it was: the plan's replicas are copies.
    assert model.vllm.cpu_cores is None and not model.vllm.pausable and model.vllm.lora_modules == SERVED_LORA_MODULES


def test_the_policy_wanted_is_the_model_served_with_its_defaults() -> None:
    assert wanted_policy("agent", served()) == Policy(
        name="agent", base_model="smollm2", model_path="/data/models/smollm2", lora=SMOLLM2.lora, train=SMOLLM2.train
    )
    hub = wanted_policy("agent", served("Qwen/Qwen2.5-0.5B-Instruct", None))
    assert (hub.base_model, hub.model_path) == ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")


def test_the_training_note_says_whose_settings_train() -> None:
    wanted = wanted_policy("agent", served())
    assert training_note(wanted, wanted, SMOLLM2) == SMOLLM2.explanation
    other = Policy(name="agent", base_model="smollm2", lora=LoraSettings(rank=64))
    assert training_note(wanted, other, SMOLLM2) == (
        "training settings: the policy's own (agent was made with other settings; PATCH /admin/policies/agent changes them)"
    )


@pytest.mark.parametrize(
    ("cores", "replicas", "cpu_build", "expected"),
    [
        (range(4), 1, True, [None]),
        (range(4), 2, True, ["0,1", "2,3"]),
        (range(5), 2, True, ["0,1", "2,3"]),  # the odd core left to the rest of the machine
        ((2, 3, 6, 7), 2, True, ["2,3", "6,7"]),  # the cores this process may run on
        (range(2), 3, True, [None, None, None]),
        (range(8), 2, False, [None, None]),
    ],
)
def test_each_replica_gets_its_share_of_the_cores(cores: range | tuple[int, ...], replicas: int, cpu_build: bool, expected: list[str | None]) -> None:
    assert split_cores(tuple(cores), replicas, cpu_build) == expected
