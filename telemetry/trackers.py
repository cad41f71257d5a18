"""The trainer's steps, held-out scores and promotion decisions, sent to Weights & Biases,
MLflow and TensorBoard: each on when its setting is set (docs/operations.md).

What is logged, per policy (one W&B run, one MLflow run, one TensorBoard subdirectory each),
against the policy's step:

- ``train/<metric>``: each figure of a recorded step (core/learning/steps.py: StepMetrics);
- ``eval/score`` and ``eval/trajectories``: a version's held-out score and the rewarded eval
  trajectories it is over, at that version's step, each time either changes;
- ``promotion/<decision>`` (1: promoted, rejected or rolled_back) and the test's figures
  (``promotion/test/difference``, ``promotion/test/candidate/mean``, ...), at the step decided.

A version's held-out score comes after later steps were trained (its eval trajectories are
answered and rewarded while training goes on), so the x-axis cannot be "the step logged last".
W&B, whose own step only grows, gets a step metric per series (``train/step``, ``eval/step``,
``promotion/step``, through ``define_metric``); MLflow and TensorBoard take the step with
each value.

How: the trainer only puts an item on a bounded queue; one thread makes every call into the
trackers' packages. So a slow or unreachable tracking server (MLflow's client retries for
minutes) never holds up a step, and each package's objects are used from one thread only.
The packages are imported when their tracker is configured, never otherwise.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgspec

from burnish_server.core.platform.ids import adapter_name
from burnish_server.telemetry.exporter import Exporter
from burnish_server.telemetry.watchers import Decision, Step

if TYPE_CHECKING:
    from burnish_server.core.platform.settings import Settings

log = logging.getLogger("burnish.trackers")

# The series: each its own x-axis, the policy's step (W&B: "<series>/step").
TRAIN, EVAL, PROMOTION = "train", "eval", "promotion"
SERIES = (TRAIN, EVAL, PROMOTION)
# Items waiting for the trackers. A step comes every few seconds at most, so a full queue
# means a tracker stuck far past its own retries: new items are dropped (and logged), not held.
QUEUE_SIZE = 1000
# The MLflow run tag that names a run's policy (a restarted trainer finds the run by it).
POLICY_TAG = "burnish.policy"


class Tracker(Protocol):
    """One backend. ``log`` makes the policy's run at its first item; ``close`` ends them all."""

    name: str

    def log(self, policy: str, series: str, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def import_extra(module: str, extra: str, setting: str) -> ModuleType:
    """The tracker's package (``module``), or an ImportError that names the setting asking for it and
    the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{setting} is set, but {module} is not installed: from the checkout, pip install '.[{extra}]'") from exc


def numeric(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers in ``values``, nested mappings flattened into "a/b" names; the rest (text,
    None, lists) left out. A bool is a number here: True logs 1."""
    out: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(numeric(value, name))
        elif isinstance(value, int | float):
            out[name] = float(value)
    return out


@contextmanager
def _warned(tracker: str, what: str) -> Iterator[None]:
    # A tracker is a view of what the store keeps: its failure is logged and training goes on
    # (and the other trackers get the item all the same). Never raise out of here.
    try:
        yield
    except Exception as exc:
        log.warning("%s: %s failed: %s: %s", tracker, what, type(exc).__name__, exc)


class WandbTracker:
    """A W&B run per policy, named after it and in a group of its name (the runs of one policy
    across trainer restarts side by side). W&B's own variables apply: WANDB_MODE=offline,
    WANDB_DIR, WANDB_ENTITY, WANDB_API_KEY."""

    name = "W&B"

    def __init__(self, project: str) -> None:
        self.wandb = import_extra("wandb", "wandb", "BURNISH_WANDB_PROJECT")
        self.project = project
        self.runs: dict[str, Any] = {}

    def _run(self, policy: str) -> Any:
        run = self.runs.get(policy)
        if run is None:
            run = self.wandb.init(
                project=self.project,
                name=policy,
                group=policy,
                job_type="train",
                config={"policy": policy},
                reinit="create_new",  # a run per policy, several open at once
                # The process's output is every policy's: it belongs in the trainer's log, not in each run.
                settings=self.wandb.Settings(console="off"),
            )
            for series in SERIES:
                run.define_metric(f"{series}/step")
                run.define_metric(f"{series}/*", step_metric=f"{series}/step")
            self.runs[policy] = run
        return run

    def log(self, policy: str, series: str, step: int, values: Mapping[str, float]) -> None:
        self._run(policy).log({f"{series}/step": step, **values})

    def close(self) -> None:
        for policy, run in self.runs.items():
            with _warned(self.name, f"finishing {policy}'s run"):
                run.finish()


class MLflowTracker:
    """An MLflow run per policy in one experiment, tagged ``burnish.policy``; a restarted trainer
    goes on in the policy's latest run. Through ``MlflowClient`` with its own tracking URI, so
    nothing is set in MLflow's process-wide state."""

    name = "MLflow"

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        tracking = import_extra("mlflow.tracking", "mlflow", "BURNISH_MLFLOW_TRACKING_URI")
        self.metric = importlib.import_module("mlflow.entities").Metric
        # No request yet: a server that is away now fails the first item, not the trainer's start.
        self.client = tracking.MlflowClient(tracking_uri=tracking_uri)
        self.experiment = experiment
        self.runs: dict[str, str] = {}  # policy -> run id

    def _run(self, policy: str) -> str:
        run_id = self.runs.get(policy)
        if run_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(self.experiment)
            # Policy names are ids (core/platform/ids.py: no quotes), safe inside the filter's quotes.
            earlier = self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{POLICY_TAG}` = '{policy}'", order_by=["attributes.start_time DESC"], max_results=1
            )
            if earlier:
                run_id = earlier[0].info.run_id
                self.client.update_run(run_id, status="RUNNING")
            else:
                run_id = self.client.create_run(experiment_id, run_name=policy, tags={POLICY_TAG: policy}).info.run_id
            self.runs[policy] = run_id
        return run_id

    def log(self, policy: str, series: str, step: int, values: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self._run(policy), metrics=[self.metric(key, value, now, step) for key, value in values.items()])

    def close(self) -> None:
        for policy, run_id in self.runs.items():
            with _warned(self.name, f"ending {policy}'s run"):
                self.client.set_terminated(run_id)


class TensorBoardTracker:
    """Event files in ``<directory>/<policy>/``, one subdirectory (a TensorBoard run) per policy;
    a restarted trainer adds a file there, and TensorBoard reads them as one run."""

    name = "TensorBoard"

    def __init__(self, directory: str) -> None:
        self.tensorboardx = import_extra("tensorboardX", "tensorboard", "BURNISH_TENSORBOARD_DIR")
        self.directory = Path(directory).expanduser()
        self.writers: dict[str, Any] = {}

    def log(self, policy: str, series: str, step: int, values: Mapping[str, float]) -> None:
        writer = self.writers.get(policy)
        if writer is None:
            writer = self.writers[policy] = self.tensorboardx.SummaryWriter(logdir=str(self.directory / policy))
        for key, value in values.items():
            writer.add_scalar(key, value, global_step=step)
        # Steps are seconds apart: each on disk at once, for a TensorBoard watching the folder
        # (the writer's own flush waits up to two minutes).
        writer.flush()

    def close(self) -> None:
        for policy, writer in self.writers.items():
            with _warned(self.name, f"closing {policy}'s event file"):
                writer.close()


class _Item(NamedTuple):
    policy: str
    series: str
    step: int
    values: dict[str, float]


class Trackers(Exporter[_Item]):
    """The configured trackers, fed from one thread. Only the trainer's rank 0 makes one (the
    worker runs there alone), so each step is logged once."""

    def __init__(self, trackers: Sequence[Tracker], queue_size: int = QUEUE_SIZE) -> None:
        super().__init__("burnish-trackers", queue_size)
        self.trackers = list(trackers)
        self.dropped = 0
        self.start()

    @classmethod
    def from_settings(cls, settings: Settings) -> Trackers | None:
        """The trackers the settings turn on, None if none is. A package that is missing is an
        ImportError now, at the trainer's start, naming the extra to install."""
        trackers: list[Tracker] = []
        if settings.wandb_project:
            trackers.append(WandbTracker(settings.wandb_project))
        if settings.mlflow_tracking_uri:
            trackers.append(MLflowTracker(settings.mlflow_tracking_uri, settings.mlflow_experiment))
        if settings.tensorboard_dir:
            trackers.append(TensorBoardTracker(settings.tensorboard_dir))
        if not trackers:
            return None
        log.info("the trainer logs to %s", ", ".join(t.name for t in trackers))
        return cls(trackers)

    # As a watcher of training (telemetry/watchers.py).
    def step(self, step: Step) -> None:
        """A recorded step's metrics (``train/<name>``)."""
        self._put(step.policy, TRAIN, step.step, numeric(step.metrics.figures()))

    def decision(self, decision: Decision) -> None:
        """A promotion decision about a version (``promotion/<decision>`` = 1) and the numbers
        of its record (the test's figures, ``promotion/test/...``)."""
        record = decision.record
        self._put(decision.policy, PROMOTION, decision.step, {record.decision: 1.0, **numeric(msgspec.to_builtins(record))})

    def held_out(self, policy: str, step: int, score: float, trajectories: int) -> None:
        """The held-out score of version ``step`` (``eval/score``, ``eval/trajectories``)."""
        self._put(policy, EVAL, step, {"score": float(score), "trajectories": float(trajectories)})

    def _put(self, policy: str, series: str, step: int, values: dict[str, float]) -> None:
        self.put(_Item(policy, series, step, {f"{series}/{key}": value for key, value in values.items()}))

    def on_dropped(self, item: _Item) -> None:
        self.dropped += 1
        log.warning("trackers are behind: %s@%d's %s dropped (%d so far)", item.policy, item.step, item.series, self.dropped)

    def run(self) -> None:
        while (item := self.take()) is not None or not self.stopping.is_set():
            if item is None:
                continue
            for tracker in self.trackers:
                with _warned(tracker.name, f"logging {adapter_name(item.policy, item.step)}'s {item.series}"):
                    tracker.log(*item)
        for tracker in self.trackers:
            with _warned(tracker.name, "closing"):
                tracker.close()

    def close(self, timeout_s: float = 30.0) -> None:
        """Log what is queued, end every run, and wait for it up to ``timeout_s`` (W&B uploads
        what it has not yet at its runs' end)."""
        if not self.stop(timeout_s):
            log.warning("trackers: not done after %.0fs; what is queued is lost, and their runs may not be ended", timeout_s)
