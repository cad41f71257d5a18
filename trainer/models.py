"""The policies' models a trainer holds in memory, and the step each takes: the same on every rank.

Rank 0 (trainer/worker.py) decides what trains and when. Each of its calls here is first
said to the other ranks (trainer/distributed.py: ``Ranks.broadcast``), which do the same in
``follow``: every rank holds the same models and takes every step. Only rank 0 reads and
writes checkpoints; a checkpoint it reads is sent to the others with the step.

    step(policy, calls, n)   the model at the policy's head (built, or restored from its checkpoint)
                             -> (sequence, advantage) pairs (trainer/sequences.py), each call with
                                its teacher's prompt where the policy distills (trainer/teacher.py)
                             -> one step of the policy's objectives (trainer/policy_model.py), each rank on its share
                             -> rank 0 saves checkpoint n (trainer/checkpoints.py)
    forget(policy)           its adapter and optimizer off the base (the base too, with its last policy)
    keep_alive()             rank 0 idle: a word now and then, so that the others do not time out
    stop()                   the others return from ``follow``

With one rank every call is local and nothing is said.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import msgspec

from burnish_server.core.learning.policies import Policy
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.core.platform.settings import Settings
from burnish_server.serving.discovery import upstreams
from burnish_server.serving.scoring import VLLMScorer
from burnish_server.serving.tool_calling import served_template
from burnish_server.store.training import TrainingCall
from burnish_server.trainer.base_model import Holding, SharedBase
from burnish_server.trainer.checkpoints import Checkpoints
from burnish_server.trainer.demonstrations import Demonstrations
from burnish_server.trainer.distributed import Ranks
from burnish_server.trainer.fidelity import make_probe, save_probe
from burnish_server.trainer.policy_model import PolicyModel
from burnish_server.trainer.sequences import training_batch
from burnish_server.trainer.teacher import ContextTeacher, served_scores
from burnish_server.trainer.turns import Turns

log = logging.getLogger("burnish.trainer")

# Rank 0, idle, speaks at least this often (distributed.py: COMMAND_TIMEOUT is far longer).
KEEP_ALIVE_S = 60.0


# What rank 0 says to the others (pickled over the gloo group: ranks of one trainer only).
class Train(msgspec.Struct, frozen=True):
    policy: Policy
    rows: list[TrainingCall]
    step: int
    lone: dict[str, float] | None = None  # each lone attempt's advantage (trainer/sequences.py: training_batch)


class Forget(msgspec.Struct, frozen=True):
    policy: str


class Alive(msgspec.Struct, frozen=True):
    pass


class Stop(msgspec.Struct, frozen=True):
    pass


Command = Train | Forget | Alive | Stop


def objectives(m: StepMetrics) -> str:
    """The log line's words for the objectives beside GRPO, where the step had any."""
    out = ""
    if m.sft_tokens:
        out += f"; sft loss {m.sft_loss:.4f} on {m.sft_tokens:.0f} tokens"
    if m.distill_tokens or m.teacher_unrendered_calls:
        out += f"; teacher kl {m.teacher_kl:.4f} on {m.distill_tokens:.0f} tokens, {m.teacher_unrendered_calls} calls unrendered, {m.seconds_teacher:.2f}s"
    return out


class Models:
    def __init__(self, settings: Settings, checkpoints: Checkpoints, ranks: Ranks | None = None, turns: Turns | None = None) -> None:
        self.settings, self.checkpoints = settings, checkpoints
        self.turns = turns or Turns()  # rank 0's: sampling paused for its steps where it shares vLLM's cores
        self.ranks = ranks or Ranks()
        self.holding = Holding(settings.trainer_dtype, settings.trainer_checkpointing, settings.trainer_packing, settings.trainer_prompt_sharing)
        self.models: dict[str, PolicyModel] = {}
        self.bases: dict[str, SharedBase] = {}  # by model path: one in memory for all its policies
        self.used_at: dict[str, float] = {}  # policy -> when its model last trained (or was loaded)
        self.spoke_at = time.monotonic()

    # ---- rank 0's calls, each said to the other ranks first ----------------------------------

    def step(self, policy: Policy, rows: list[TrainingCall], step: int, lone: dict[str, float] | None = None) -> StepMetrics:
        """One GRPO step from ``policy.head``, saved as checkpoint ``step``, with ``lone``: each lone
        attempt's advantage, by trajectory. Returns its metrics."""
        self.say(Train(policy, rows, step, lone))
        return self.train(policy, rows, step, lone)

    def forget(self, policy: str) -> None:
        self.say(Forget(policy))
        self.drop(policy)

    def unload_idle(self) -> None:
        """Free the memory of the policies that have not trained for ``trainer_idle_unload``
        seconds: a trainer of many projects' policies holds only those that are training."""
        now = time.monotonic()
        for name in [name for name, at in self.used_at.items() if now - at >= self.settings.trainer_idle_unload]:
            log.info("%s has not trained for %.0fs: its model leaves memory until its next step", name, now - self.used_at[name])
            self.forget(name)

    def keep_alive(self) -> None:
        if self.ranks.world > 1 and time.monotonic() - self.spoke_at >= KEEP_ALIVE_S:
            self.say(Alive())

    def stop(self) -> None:
        try:
            self.say(Stop())
        except RuntimeError as exc:  # torch.distributed's error: a rank is gone already
            log.warning("the other ranks did not hear the stop: %s", exc)

    def say(self, command: Command) -> None:
        if self.ranks.world > 1:
            self.ranks.broadcast(command)
            self.spoke_at = time.monotonic()

    # ---- the other ranks -------------------------------------------------------------------

    def follow(self) -> None:
        """Do what rank 0 says, until it says stop (or dies: then the collective fails, and
        torchrun ends every rank)."""
        while True:
            command: Command = self.ranks.broadcast()
            match command:
                case Train(policy, rows, step, lone):
                    self.train(policy, rows, step, lone)
                case Forget(name):
                    self.drop(name)
                case Stop():
                    return
                case Alive():
                    pass

    # ---- what every rank does ------------------------------------------------------------------

    def model(self, policy: Policy) -> PolicyModel:
        """The in-memory model at the policy's head: kept between steps, rebuilt after a rollback.
        Policies on the same base share it (trainer/base_model.py): each is an adapter on it."""
        model = self.models.get(policy.name)
        if model is None or model.step_count != policy.head or model.lora != policy.lora:
            self.drop(policy.name)
            path = policy.model_path or policy.base_model
            base = self.bases.get(path) or self.bases.setdefault(path, SharedBase(path, self.ranks, self.holding))
            model = PolicyModel(base, policy.lora, policy.train, owner=policy.name)
            if policy.head > 0:  # resume: adapter and optimizer state of that step, as rank 0 read it
                directory = self.checkpoints.step(policy.name, policy.head)
                model.restore(self.ranks.broadcast(PolicyModel.read(directory) if self.ranks.main else None))
            self.models[policy.name] = model
        elif model.train != policy.train:
            model.configure(policy.train)
        self.used_at[policy.name] = time.monotonic()
        return model

    def drop(self, policy: str) -> None:
        """Drop a policy's model (its adapter off the base; the base too, if no policy is left on it)."""
        model = self.models.pop(policy, None)
        self.used_at.pop(policy, None)
        if model is None:
            return
        model.close()
        if not model.base.adapters:
            self.bases.pop(model.base.path, None)

    def train(self, policy: Policy, rows: list[TrainingCall], step: int, lone: dict[str, float] | None = None) -> StepMetrics:
        t0 = time.perf_counter()
        model = self.model(policy)
        t1 = time.perf_counter()
        teacher = policy.train.teacher
        template = served_template(Path(policy.model_path or policy.base_model))  # vLLM's, where burnish chose it
        prompts = ContextTeacher(model.tokenizer, teacher, template).prompt if teacher is not None and policy.train.weights.distill > 0 else None
        shown = Demonstrations(model.tokenizer, template).sequence if policy.train.weights.sft > 0 else None
        batch = training_batch(rows, policy.train, head=policy.head, teacher_prompt=prompts, demonstration=shown, lone=lone)
        t2 = time.perf_counter()
        served = 0
        if prompts is not None and teacher is not None and teacher.model is not None:
            scorer = VLLMScorer(upstreams(self.settings)[0], api_key=self.settings.upstream_api_key)
            try:
                served_scores(batch.items, scorer, teacher.model, policy.train.max_seq_len)
            finally:
                scorer.close()
            served = scorer.requests
        t_served = time.perf_counter() - t2
        with self.turns.paused():
            metrics = model.step(batch.items)
        metrics.seconds_teacher += t_served
        metrics.teacher_requests = served
        # What vLLM must answer with this adapter before it serves it (trainer/fidelity.py).
        probe = make_probe(model, [seq for seq, _ in batch.items])
        t3 = time.perf_counter()
        model.step_count = step
        self.used_at[policy.name] = time.monotonic()  # idle from the step's end (unload_idle)
        if not self.ranks.main:
            return metrics
        n = len(batch.rewards)  # 0 if every claimed group turned out held out (marked after the claim)
        mean = sum(batch.rewards) / n if n else 0.0
        metrics.reward_mean = mean
        metrics.reward_std = (sum((r - mean) ** 2 for r in batch.rewards) / (n - 1)) ** 0.5 if n > 1 else 0.0
        metrics.untokenized_calls, metrics.stale_calls, metrics.call_rewards = batch.untokenized, batch.stale, batch.call_rewards
        metrics.sequence_splits = batch.splits
        metrics.teacher_unrendered_calls = batch.unrendered
        metrics.lone = batch.lone
        metrics.count_splits(batch.split_reasons)  # why each split happened (core/learning/drift.py)
        metrics.ranks = self.ranks.world
        ages = batch.staleness or [0]
        metrics.staleness_mean, metrics.staleness_max = sum(ages) / len(ages), max(ages)

        def fill(directory: Path) -> None:
            model.save(directory)
            save_probe(directory, probe)
            metrics.seconds_load, metrics.seconds_batch, metrics.seconds_step = t1 - t0, t2 - t1, t3 - t2
            metrics.seconds_save = time.perf_counter() - t3
            metrics.seconds = time.perf_counter() - t0
            (directory / "metrics.json").write_bytes(msgspec.json.encode(metrics))

        self.checkpoints.write(policy.name, step, fill)
        m = metrics
        log.info(
            "%s step %d: reward %.3f±%.3f loss %.4f kl %.4f entropy %.3f from-base %.1e tokens %d |logp-vllm| %.1e mismatch-kl %.1e outside-clip %.3f tis-capped %.3f "
            "staleness %.1f/%d splits %d untokenized %d stale %d; load %.2fs batch %.2fs step %.2fs save %.2fs%s",
            policy.name, step, m.reward_mean, m.reward_std, m.loss, m.kl, m.entropy, m.distance_from_base, m.tokens,
            m.logprob_diff_mean, m.mismatch_kl, m.outside_clip_fraction, m.tis_capped_fraction, m.staleness_mean, m.staleness_max,
            m.sequence_splits, m.untokenized_calls, m.stale_calls, m.seconds_load, m.seconds_batch, m.seconds_step, m.seconds_save,
            objectives(m),
        )  # fmt: skip
        return metrics
