"""The trainer process: claim ready groups, take a GRPO step, publish the adapter to vLLM.

One iteration, for each policy in the store that is not paused:

    claim groups_per_step ready groups        (gateway/store/training.py; all or nothing,
                                               or what is ready when training was asked for)
    calls -> token sequences                  (trainer/sequences.py; recorded ids, else the chat template)
    advantages per group -> GRPO step          (trainer/grpo.py, trainer/policy_model.py)
    save checkpoint <data>/policies/<name>/checkpoints/<step>/   (written aside, then renamed)
    record the step: groups trained, metrics, new head             (gateway/store/policies.py; now it counts)
    load it into vLLM as <name>@<step>, check it answers, then switch the policy to it

Publishing also serves a rollback: whenever a policy's head (what should be served)
differs from its step (what is), the head is loaded, checked and switched to.

A trainer killed at any point loses nothing and trains nothing twice: at start it
releases its own stale claims, sets aside a checkpoint whose step was never recorded
(its groups wait again), and publishes a recorded step that was never switched to. A
publish that fails (vLLM away) is recorded in the policy's status and retried every
``publish_retry_s``; the old version keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import torch

from gateway.langfuse_export import LangfuseExport, Step
from gateway.policies import Policy
from gateway.settings import Settings
from gateway.store import tokens
from gateway.store.database import Database
from gateway.store.models import utcnow
from gateway.store.policies import clear_training_request, get_policy, last_step, load_policies, mark_load_error, mark_served, record_step
from gateway.store.training import claim_groups, group_calls, other_trainer_busy, release_groups
from trainer.grpo import group_advantages
from trainer.policy_model import PolicyModel
from trainer.sequences import CallTokens, Sequence, build_sequences

log = logging.getLogger("burnish.trainer")


@dataclass(frozen=True)
class WorkerSettings:
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    poll_s: float = 0.25
    lease_s: float = 900.0
    # Adapters kept loaded in vLLM per policy (older ones are unloaded; their checkpoints stay).
    keep_loaded: int = 3
    # A version vLLM failed to load is tried again after this long (a new step or rollback: at once).
    publish_retry_s: float = 5.0


class TrainerWorker:
    def __init__(self, settings: Settings, worker: WorkerSettings = WorkerSettings()) -> None:
        self.settings, self.worker = settings, worker
        self.db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        self.models: dict[str, PolicyModel] = {}
        self.vllm = httpx.Client(base_url=settings.upstream.rstrip("/").removesuffix("/v1"), timeout=120)
        self.steps_done = 0
        self.failed_publish: dict[str, tuple[int, float]] = {}  # policy -> (step, when it failed)
        self.langfuse = LangfuseExport.from_settings(settings)  # each step as an event, when keys are set

    def checkpoints(self, policy: str) -> Path:
        return self.settings.data_path / "policies" / policy / "checkpoints"

    def model(self, policy: Policy) -> PolicyModel:
        """The in-memory model at the policy's head: kept between steps, rebuilt after a rollback."""
        model = self.models.get(policy.name)
        if model is None or model.step_count != policy.head or model.lora != policy.lora:
            model = PolicyModel(policy.model_path or policy.base_model, policy.lora, policy.train)
            if policy.head > 0:  # resume: adapter and optimizer state of that step
                model.load(self.checkpoints(policy.name) / str(policy.head))
            self.models[policy.name] = model
        elif model.train != policy.train:
            model.configure(policy.train)
        return model

    async def policies(self) -> list[Policy]:
        return await self.db.read(load_policies)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.recover()
        while not stop.is_set():
            if not await self.run_once():
                try:
                    await asyncio.wait_for(stop.wait(), self.worker.poll_s)
                except TimeoutError:
                    pass

    async def run_once(self) -> bool:
        """One pass over the policies: serve what should be served, train what is ready. Trained anything?"""
        trained = False
        for policy in await self.policies():
            await self.publish_pending(policy)
            if not policy.paused:
                trained |= await self.train_once(policy)
        return trained

    async def close(self) -> None:
        if self.langfuse is not None:
            await asyncio.to_thread(self.langfuse.close)
        self.vllm.close()
        await self.db.dispose()

    async def recover(self) -> None:
        """Clean up after a trainer with this worker id that died mid-step."""
        await self.db.migrate()
        released = await self.db.transaction(release_groups, self.worker.worker_id)
        if released:
            log.info("released %d groups left claimed by an earlier run", released)
        for policy in await self.policies():
            if await self.db.read(other_trainer_busy, policy.name, self.worker.worker_id, self.worker.lease_s):
                continue  # another trainer is mid-step on it: what looks unrecorded may be its step
            recorded = await self.db.read(last_step, policy.name)
            for ckpt in self.checkpoints(policy.name).glob("*"):
                if ckpt.name.endswith(".partial"):
                    shutil.rmtree(ckpt)  # half written: never a checkpoint
                elif ckpt.name.isdigit() and int(ckpt.name) > recorded:
                    # Whole, but its step was never recorded (its groups wait again): set aside, not
                    # deleted, so a store that lost its steps does not cost the checkpoints.
                    aside = ckpt.with_name(f".unrecorded-{ckpt.name}-{int(time.time())}")
                    log.info("moving %s to %s: its step was never recorded", ckpt, aside.name)
                    ckpt.rename(aside)

    async def publish_pending(self, policy: Policy) -> None:
        """Serve the policy's head if it is not served yet (a new step, a rollback, a crash between the two)."""
        if policy.head == policy.step:
            return
        failed = self.failed_publish.get(policy.name)
        if failed is not None and failed[0] == policy.head and time.monotonic() - failed[1] < self.worker.publish_retry_s:
            return
        try:
            seconds = await asyncio.to_thread(self.publish, policy, policy.head)
        except Exception as exc:
            log.error("%s@%d is not served: %s", policy.name, policy.head, exc)
            self.failed_publish[policy.name] = (policy.head, time.monotonic())
            await self.db.transaction(mark_load_error, policy.name, f"{policy.name}@{policy.head}: {exc}")
            return
        self.failed_publish.pop(policy.name, None)
        await self.db.transaction(mark_served, policy.name, policy.head, seconds)
        log.info("%s now serves %s@%d (loaded and checked in %.3fs)", policy.name, policy.name, policy.head, seconds)

    async def train_once(self, policy: Policy) -> bool:
        t0 = time.perf_counter()
        requested = policy.train_requested_at is not None
        count = policy.train.groups_per_step
        ids = await self.db.transaction(claim_groups, policy.name, self.worker.worker_id, count, self.worker.lease_s, 1 if requested else count)
        if not ids:
            if requested:  # asked for, but the groups went to another trainer
                await self.db.transaction(clear_training_request, policy.name)
            return False
        try:
            # The policy as it is now, not as this pass read it: another trainer may have stepped
            # it since (the claim means no one is mid-step on it now), and a step from a stale
            # head would be recorded but never served.
            policy = await self.db.read(get_policy, policy.name)
            rows = await self.db.read(group_calls, ids)
            step = 1 + await self.db.read(last_step, policy.name)
            log.info("%s step %d: claimed %d groups, training from step %d", policy.name, step, len(ids), policy.head)
            read_s = time.perf_counter() - t0
            metrics = await asyncio.to_thread(self.train_and_save, policy, rows, step)
            metrics["seconds_read"] = read_s
            metrics["groups"] = len(ids)
            became_head = await self.db.transaction(
                record_step, policy.name, step, policy.head, ids, self.worker.worker_id, metrics, str(self.checkpoints(policy.name) / str(step))
            )
        except Exception:
            log.exception("step for %s failed; its groups wait again", policy.name)
            self.models.pop(policy.name, None)  # the in-memory model may hold the failed step
            await self.db.transaction(release_groups, self.worker.worker_id, ids)
            return False
        if not became_head:
            log.warning("%s was rolled back during step %d: the step is kept but not served", policy.name, step)
        if self.langfuse is not None:
            self.langfuse.put(Step(policy.name, step, policy.head, ids, metrics, utcnow()))
        self.steps_done += 1
        await self.publish_pending(await self.db.read(get_policy, policy.name))
        return True

    def train_and_save(self, policy: Policy, rows: list, step: int) -> dict[str, float]:
        """One GRPO step from ``policy.head``, saved as checkpoint ``step``. Returns its metrics."""
        t0 = time.perf_counter()
        model = self.model(policy)
        t1 = time.perf_counter()
        items, rewards, fallbacks = self.batch(model, rows, policy)
        t2 = time.perf_counter()
        metrics = model.step(items)
        t3 = time.perf_counter()
        model.step_count = step
        rewards_t = torch.tensor(rewards)
        metrics.update(reward_mean=float(rewards_t.mean()), reward_std=float(rewards_t.std()) if len(rewards) > 1 else 0.0, template_fallbacks=fallbacks)
        # Written aside and renamed: a checkpoint directory is whole or absent.
        ckpt = self.checkpoints(policy.name) / str(step)
        partial = ckpt.with_name(f".{step}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save(partial)
        t4 = time.perf_counter()
        metrics.update(seconds_load=t1 - t0, seconds_batch=t2 - t1, seconds_step=t3 - t2, seconds_save=t4 - t3, seconds=t4 - t0)
        (partial / "metrics.json").write_bytes(msgspec.json.encode(metrics))
        shutil.rmtree(ckpt, ignore_errors=True)
        partial.rename(ckpt)
        log.info(
            "%s step %d: reward %.3f±%.3f loss %.4f kl %.4f tokens %d; load %.2fs batch %.2fs step %.2fs save %.2fs",
            policy.name, step, metrics["reward_mean"], metrics["reward_std"], metrics["loss"], metrics["kl"], metrics["tokens"],
            metrics["seconds_load"], metrics["seconds_batch"], metrics["seconds_step"], metrics["seconds_save"],
        )  # fmt: skip
        return metrics

    def batch(self, model: PolicyModel, rows: list, policy: Policy) -> tuple[list[tuple[Sequence, float]], list[float], int]:
        """Rows of (group, trajectory, reward, call...) -> (sequence, advantage) pairs."""
        trajectories: dict[str, dict[str, list]] = {}
        rewards: dict[str, float] = {}
        fallbacks = 0
        for row in rows:
            call = self.call_tokens(model, row)
            fallbacks += call.from_template
            trajectories.setdefault(row.group_id, {}).setdefault(row.trajectory_id, []).append(call)
            rewards[row.trajectory_id] = row.reward
        items: list[tuple[Sequence, float]] = []
        for members in trajectories.values():
            names = list(members)
            advantages = group_advantages(torch.tensor([rewards[t] for t in names]), scale=policy.train.scale_advantages, eps=policy.train.advantage_eps)
            for name, advantage in zip(names, advantages.tolist()):
                items += [(seq, advantage) for seq in build_sequences(members[name])]
        return items, [rewards[t] for m in trajectories.values() for t in m], fallbacks

    @staticmethod
    def call_tokens(model: PolicyModel, row) -> CallTokens:
        lengths = tokens.unpack_ids(row.completion_lengths)
        if row.prompt_token_ids is not None and lengths is not None and row.completion_token_ids is not None:
            logprobs = tokens.split(tokens.unpack_floats(row.completion_logprobs), lengths) if row.completion_logprobs else None
            return CallTokens(tokens.unpack_ids(row.prompt_token_ids), tokens.split(tokens.unpack_ids(row.completion_token_ids), lengths), logprobs)
        # No recorded ids (a non-vLLM upstream, or an endpoint without them): the chat template.
        request, response = msgspec.json.decode(row.request), msgspec.json.decode(row.response or b"{}")
        text = model.tokenizer.apply_chat_template(request.get("messages", []), add_generation_prompt=True, tokenize=False)
        prompt = model.tokenizer.encode(text, add_special_tokens=False)
        contents = [(c.get("message") or {}).get("content") or c.get("text") or "" for c in response.get("choices", [])]
        return CallTokens(prompt, [model.tokenizer.encode(c, add_special_tokens=False) for c in contents], None, from_template=True)

    def publish(self, policy: Policy, step: int) -> float:
        """Load ``<name>@<step>`` into vLLM and check it answers; return the seconds it took.
        Step 0 is the base model, always loaded. The caller switches the policy afterwards."""
        t0 = time.perf_counter()
        name = f"{policy.name}@{step}" if step > 0 else policy.base_model
        if step > 0:
            self.load_adapter(name, self.checkpoints(policy.name) / str(step) / "adapter")
        check = self.vllm.post("/v1/completions", json={"model": name, "prompt": "ok", "max_tokens": 1})
        if check.status_code != 200:
            raise RuntimeError(f"vLLM loaded {name} but it does not answer: {check.status_code} {check.text[:300]}")
        seconds = time.perf_counter() - t0
        self.unload_old(policy.name, step)
        return seconds

    def load_adapter(self, name: str, path: Path) -> None:
        """Have vLLM serve ``name`` from ``path``.

        vLLM may hold the name already. From this path (a rollback re-publishing a step) that
        is fine. From another (a policy deleted and made again under its name, or another
        deployment sharing this vLLM) it is unloaded first: vLLM refuses a second load of a
        name, and would go on serving the other weights under it.
        """
        body = {"lora_name": name, "lora_path": str(path)}
        r = self.vllm.post("/v1/load_lora_adapter", json=body)
        if r.status_code != 200 and "already been loaded" in r.text:
            if self.loaded_from(name) == str(path):
                return
            log.warning("vLLM held %s from another path; reloading it from %s", name, path)
            self.vllm.post("/v1/unload_lora_adapter", json={"lora_name": name})
            r = self.vllm.post("/v1/load_lora_adapter", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM did not load {name}: {r.status_code} {r.text[:300]}")

    def served_models(self) -> list[dict]:
        """vLLM's /v1/models entries (the base model and each loaded adapter); none if it fails."""
        listed = self.vllm.get("/v1/models")
        return listed.json().get("data", []) if listed.status_code == 200 else []

    def loaded_from(self, name: str) -> str | None:
        """The path vLLM loaded adapter ``name`` from (its /v1/models ``root``)."""
        return next((m.get("root") for m in self.served_models() if m.get("id") == name), None)

    def unload_old(self, name: str, serving: int) -> None:
        """Keep the served adapter and the newest others, keep_loaded in all; unload the rest."""
        loaded = (m["id"].rpartition("@") for m in self.served_models())
        others = sorted((int(step) for policy, _, step in loaded if policy == name and step.isdigit() and int(step) != serving), reverse=True)
        for old in others[max(self.worker.keep_loaded - 1, 0) :]:
            self.vllm.post("/v1/unload_lora_adapter", json={"lora_name": f"{name}@{old}"})
