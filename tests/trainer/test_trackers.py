"""The trainer's trackers, each the real package writing real files, offline: W&B in offline
mode (its run's ``.wandb`` file), MLflow on a local store (SQLite, and the file store), and
TensorBoard's event files (read back with TensorBoard's own reader). The last test runs the
trainer's loop on a real gateway and store with the tiny model, and finds each recorded
step's metrics and each version's held-out score in every tracker.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from burnish_server.core.learning.promotion import DecisionRecord, Outcome, Sample, compare
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.platform.settings import Settings
from burnish_server.store.database import Database
from burnish_server.store.policies import list_steps
from burnish_server.telemetry.trackers import MLflowTracker, TensorBoardTracker, Trackers, WandbTracker, import_extra, numeric
from burnish_server.telemetry.watchers import Decision, Step
from burnish_server.trainer.worker import TrainerWorker, WorkerSettings
from tests.conftest import Gateway
from tests.servers import free_port
from tests.trainer.test_trainer_recovery import TINY, ready_group


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """W&B offline, everything it writes (runs, its settings, caches) under one folder. For the
    module: W&B reads its variables once a process (at its first run); each test logs to a
    project of its own."""
    folder = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_DIR", str(folder))
        for name, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
            env.setenv(name, str(folder / sub))
        env.delenv("WANDB_API_KEY", raising=False)
        yield folder


# ---- reading back what each tracker wrote ----------------------------------------------------


def wandb_runs(folder: Path, project: str) -> dict[str, list[dict[str, Any]]]:
    """Each offline run's history rows (without W&B's own ``_`` keys) in ``project``, by the run's name.

    An offline run is a ``.wandb`` file, what `wandb sync` uploads. The wandb package has no
    Python reader for it any more (its Go core reads it), so this reads it as the core does:
    a 7-byte header (":W&B", magic, version), then LevelDB's log format (blocks of 32 KiB,
    each record a 7-byte header: checksum, length, type full/first/middle/last) around W&B's
    own protobuf ``Record``s (``wandb.proto``)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B"
        name, in_project, rows, pos, pending = None, False, [], 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            pending += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind not in (1, 4):  # first or middle part of a record
                continue
            record = wandb_internal_pb2.Record.FromString(pending)
            pending = b""
            if record.HasField("run"):
                name, in_project = record.run.display_name, record.run.project == project
            elif record.HasField("history"):
                row = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
                rows.append({k: v for k, v in row.items() if not k.startswith("_")})
        assert name is not None, path
        if in_project:
            assert name not in runs, "one run per policy"
            runs[name] = rows
    return runs


def wandb_series(rows: list[dict[str, Any]], series: str) -> dict[int, dict[str, Any]]:
    """One series' rows by its own step (``<series>/step``)."""
    return {row[f"{series}/step"]: row for row in rows if f"{series}/step" in row}


def mlflow_history(uri: str, experiment: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Each run's metrics by the policy it is tagged with: (step, value) in the order logged."""
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run in client.search_runs([found.experiment_id]):
        policy = run.data.tags["burnish.policy"]
        assert policy not in out, "one run per policy"
        assert run.info.run_name == policy and run.info.status == "FINISHED"
        out[policy] = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] for key in run.data.metrics}
    return out


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """One run's scalars (a policy's subdirectory): (step, value) in the order written."""
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


# ---- the trackers on their own ---------------------------------------------------------------

METRICS = {"loss": 0.125, "reward_mean": 0.5, "tokens": 96.0, "groups": 2, "phase": {"seconds": 1.5, "inner": {"x": 3}}, "note": "text", "none": None}


def recorded(policy: str, step: int, metrics: StepMetrics) -> Step:
    return Step(policy, step, step - 1, [], metrics, datetime.now(UTC))


FLAT = {"train/loss": 0.125, "train/reward_mean": 0.5, "train/tokens": 96.0, "train/groups": 2.0, "train/phase/seconds": 1.5, "train/phase/inner/x": 3.0}
STEP = StepMetrics(loss=0.125, reward_mean=0.5, tokens=96.0, groups=2, seconds=1.5)
# Every figure the step has (core/learning/steps.py); those it has not (None) are left out.
NUMERIC = {f"train/{k}": float(v) for k, v in STEP.figures().items()}
OTHER = {f"train/{k}": float(v) for k, v in StepMetrics(loss=1.0).figures().items()}


def test_numeric_flattens_nested_figures_and_leaves_out_the_rest() -> None:
    assert {f"train/{k}": v for k, v in numeric(METRICS).items()} == FLAT
    assert numeric({"a": True, "b": [1, 2], "c": {"d": None}}) == {"a": 1.0}


def test_every_tracker_gets_steps_held_out_scores_and_decisions(tmp_path: Path, wandb_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MLflow's file store is refused unless asked for (MLflow recommends a database): both here.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    sqlite_uri, file_uri = f"sqlite:///{tmp_path / 'mlflow.db'}", (tmp_path / "mlruns").as_uri()
    trackers = Trackers(
        [WandbTracker("each-tracker"), MLflowTracker(sqlite_uri, "exp"), MLflowTracker(file_uri, "exp"), TensorBoardTracker(str(tmp_path / "tb"))]
    )
    test = compare(Sample(8, 0.5, 0.04), Sample(8, 0.75, 0.04), margin=0.05, confidence=0.95, min_n=4)
    record = DecisionRecord(decision=Outcome.PROMOTED, by="test", reason=test.reason, test=test)
    trackers.step(recorded("agent", 1, STEP))
    trackers.step(recorded("agent", 2, msgspec.structs.replace(STEP, loss=0.0625)))
    # A version's held-out score comes after later steps, and again when it changes.
    trackers.held_out("agent", 2, 0.75, 8)
    trackers.held_out("agent", 0, 0.25, 4)
    trackers.held_out("agent", 0, 0.5, 6)
    trackers.decision(Decision("agent", 2, record))
    trackers.step(recorded("other", 1, StepMetrics(loss=1.0)))  # another policy: a run of its own
    trackers.close()
    assert not trackers.thread.is_alive()

    promotion = {"promotion/promoted": 1.0, "promotion/test/margin": 0.05, "promotion/test/confidence": 0.95}
    promotion |= {
        f"promotion/test/{side}/{k}": v for side, s in (("served", test.served), ("candidate", test.candidate)) for k, v in msgspec.to_builtins(s).items()
    }
    promotion |= {f"promotion/test/{k}": getattr(test, k) for k in ("difference", "lower", "upper", "degrees_of_freedom")}
    assert test.decision == "promote" and all(isinstance(v, float | int) for v in promotion.values())

    # W&B: a run per policy; each series on its own step.
    runs = wandb_runs(wandb_dir, "each-tracker")
    assert set(runs) == {"agent", "other"}
    train = wandb_series(runs["agent"], "train")
    assert train == {1: {"train/step": 1, **NUMERIC}, 2: {"train/step": 2, **NUMERIC, "train/loss": 0.0625}}
    assert [(row["eval/step"], row["eval/score"], row["eval/trajectories"]) for row in runs["agent"] if "eval/step" in row] == [
        (2, 0.75, 8),
        (0, 0.25, 4),
        (0, 0.5, 6),
    ]
    assert wandb_series(runs["agent"], "promotion") == {2: {"promotion/step": 2, **promotion}}
    assert runs["other"] == [{"train/step": 1, **OTHER}]

    # MLflow, on either store: a run per policy, each value at its step.
    for uri in (sqlite_uri, file_uri):
        history = mlflow_history(uri, "exp")
        assert set(history) == {"agent", "other"}
        agent = history["agent"]
        assert {key: values for key, values in agent.items() if key.startswith("train/")} == {
            key: [(1, value), (2, 0.0625 if key == "train/loss" else value)] for key, value in NUMERIC.items()
        }
        assert agent["eval/score"] == [(2, 0.75), (0, 0.25), (0, 0.5)] and agent["eval/trajectories"] == [(2, 8.0), (0, 4.0), (0, 6.0)]
        assert {key: values for key, values in agent.items() if key.startswith("promotion/")} == {key: [(2, value)] for key, value in promotion.items()}
        assert history["other"] == {key: [(1, value)] for key, value in OTHER.items()}

    # TensorBoard: a subdirectory per policy; values as float32, as TensorBoard keeps them.
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["agent", "other"]
    scalars = tensorboard_scalars(tmp_path / "tb" / "agent")
    assert scalars["train/loss"] == [(1, 0.125), (2, 0.0625)]
    assert scalars["train/seconds"] == [(1, 1.5), (2, 1.5)]
    assert scalars["eval/score"] == [(2, 0.75), (0, 0.25), (0, 0.5)]
    assert {key: values for key, values in scalars.items() if key.startswith("promotion/")} == {
        key: [(2, pytest.approx(value, rel=1e-6))] for key, value in promotion.items()
    }
    assert tensorboard_scalars(tmp_path / "tb" / "other") == {key: [(1, value)] for key, value in OTHER.items()}


def test_a_restarted_trainer_goes_on_in_the_policys_mlflow_run(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for step in (1, 2):  # two trainer processes, one after the other
        trackers = Trackers([MLflowTracker(uri, "burnish")])
        trackers.step(recorded("agent", step, StepMetrics(loss=1.0 / step)))
        trackers.close()
    history = mlflow_history(uri, "burnish")
    assert set(history) == {"agent"} and history["agent"]["train/loss"] == [(1, 1.0), (2, 0.5)]


def test_a_failing_tracker_is_a_warning_and_the_others_still_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # An MLflow server that is not there (a closed port), without MLflow's minutes of retries.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    trackers = Trackers([MLflowTracker(f"http://127.0.0.1:{free_port()}", "burnish"), TensorBoardTracker(str(tmp_path / "tb"))])
    with caplog.at_level(logging.WARNING, logger="burnish.trackers"):
        trackers.step(recorded("agent", 1, StepMetrics(loss=0.5)))
        trackers.held_out("agent", 0, 0.25, 4)
        trackers.close()
    failed = [r.getMessage() for r in caplog.records if r.name == "burnish.trackers"]
    assert len(failed) == 2 and all(m.startswith("MLflow: logging agent@") for m in failed), failed
    scalars = tensorboard_scalars(tmp_path / "tb" / "agent")
    assert (scalars["train/loss"], scalars["eval/score"], scalars["eval/trajectories"]) == ([(1, 0.5)], [(0, 0.25)], [(0, 4.0)])


def test_no_tracker_is_on_unless_configured_and_a_missing_package_names_its_extra(tmp_path: Path) -> None:
    assert Trackers.from_settings(Settings.load({})) is None
    with pytest.raises(ImportError, match=r"BURNISH_WANDB_PROJECT is set, but burnish_absent is not installed: from the checkout, pip install '\.\[wandb\]'"):
        import_extra("burnish_absent", "wandb", "BURNISH_WANDB_PROJECT")
    settings = Settings.load({"BURNISH_TENSORBOARD_DIR": str(tmp_path / "tb"), "BURNISH_MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"})
    trackers = Trackers.from_settings(settings)
    assert trackers is not None and [t.name for t in trackers.trackers] == ["MLflow", "TensorBoard"]
    trackers.close()


# ---- the trainer's loop -------------------------------------------------------------------------


async def held_out(gw: Gateway, trajectory: str, reward: float) -> None:
    """A held-out trajectory of the policy (the /eval prefix), answered by its served version and rewarded."""
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        r = await client.post(f"/eval/t/{trajectory}/v1/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": "held out"}]})
        assert r.status_code == 200
        assert (await client.post(f"/v1/trajectories/{trajectory}/reward", json={"reward": reward})).status_code == 200


async def test_the_trainer_logs_each_step_and_each_changed_held_out_score(make_gateway, upstream, tiny_model: Path, tmp_path: Path, wandb_dir: Path) -> None:
    """The real loop (``run_once``) on a real gateway and store, training the tiny model on what
    the deterministic upstream answered (vLLM's stand-in: it loads no adapter, so the trainer
    records each step and reports the failed load, as it would with vLLM away)."""
    gw = make_gateway()
    gw.create_policy("agent", "tiny", model_path=str(tiny_model), **TINY)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = Settings.load(
        {"BURNISH_WANDB_PROJECT": "trainer-loop", "BURNISH_MLFLOW_TRACKING_URI": mlflow_uri, "BURNISH_TENSORBOARD_DIR": str(tmp_path / "tb")},
        data_dir=gw.settings.data_dir,
        upstream=gw.settings.upstream,
        trackers_eval_every=0,
    )
    worker = TrainerWorker(settings, WorkerSettings(worker_id="trackers-test"))
    try:
        await worker.recover()
        await held_out(gw, "h0", 0.25)
        await held_out(gw, "h1", 0.75)
        for group in "ab":
            await ready_group(gw, group)
        assert await worker.run_once()  # step 1, and the base's held-out score (0.5 over 2)
        assert not await worker.run_once()  # nothing new: nothing logged again
        await held_out(gw, "h2", 1.25)
        for group in "cd":
            await ready_group(gw, group)
        assert await worker.run_once()  # step 2, and the base's score changed (0.75 over 3)
    finally:
        await worker.close()
    # Each step's metrics as the store recorded them.
    db = Database(settings.resolved_database_url)
    try:
        steps = {s.step: s.metrics.figures() for s in await db.read(list_steps, "agent") if isinstance(s.metrics, StepMetrics)}
    finally:
        await db.dispose()
    assert sorted(steps) == [1, 2]
    for figures in steps.values():
        assert {"loss", "reward_mean", "kl", "tokens", "grad_norm", "seconds_step", "groups"} <= set(figures)
    scores = [(0, 0.5, 2.0), (0, 0.75, 3.0)]

    runs = wandb_runs(wandb_dir, "trainer-loop")
    assert set(runs) == {"agent"}
    train = wandb_series(runs["agent"], "train")
    assert sorted(train) == [1, 2]
    for step, figures in steps.items():
        assert {k: train[step][f"train/{k}"] for k in figures} == figures
    assert [(r["eval/step"], r["eval/score"], r["eval/trajectories"]) for r in runs["agent"] if "eval/step" in r] == scores

    mlflow = mlflow_history(mlflow_uri, "burnish")["agent"]
    for key in steps[1]:
        assert mlflow[f"train/{key}"] == [(step, steps[step][key]) for step in (1, 2)]
    assert [(s, v, n) for (s, v), (_, n) in zip(mlflow["eval/score"], mlflow["eval/trajectories"])] == scores

    scalars = tensorboard_scalars(tmp_path / "tb" / "agent")
    assert scalars["train/loss"] == [(step, pytest.approx(steps[step]["loss"], rel=1e-6, abs=1e-12)) for step in (1, 2)]
    assert scalars["train/reward_mean"] == [(step, pytest.approx(steps[step]["reward_mean"], rel=1e-6)) for step in (1, 2)]
    assert [(s, v, n) for (s, v), (_, n) in zip(scalars["eval/score"], scalars["eval/trajectories"])] == scores
