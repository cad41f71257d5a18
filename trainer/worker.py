"""The trainer process: claim ready groups, take a GRPO step, publish the adapter to vLLM.

One iteration, for each policy in the registry:

    claim groups_per_step ready groups        (gateway/store/training.py; all or nothing)
    calls -> token sequences                  (trainer/sequences.py; recorded ids, else the chat template)
    advantages per group -> GRPO step          (trainer/grpo.py, trainer/policy_model.py)
    save checkpoint <data>/policies/<name>/checkpoints/<step>/   (written aside, then renamed)
    mark the groups trained at that step                          (now the step counts)
    load it into vLLM as <name>@<step>, check it answers, then switch the policy to it

A trainer killed at any point loses nothing and trains nothing twice: at start it
releases its own stale claims, deletes a checkpoint whose groups were never marked
(they wait again), and publishes a marked step that was never switched to. A publish
that fails (vLLM away) is retried on every pass; the old version keeps serving.
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

from gateway.policies import Policy, Registry, write_policies
from gateway.settings import Settings
from gateway.store import tokens
from gateway.store.database import Database
from gateway.store.training import claim_groups, complete_groups, group_calls, last_trained_step, release_groups
from trainer.grpo import group_advantages
from trainer.policy_model import LoraSettings, PolicyModel, TrainSettings
from trainer.sequences import CallTokens, Sequence, build_sequences

log = logging.getLogger("burnish.trainer")


@dataclass(frozen=True)
class WorkerSettings:
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    poll_s: float = 0.5
    lease_s: float = 900.0
    # Adapters kept loaded in vLLM per policy (older ones are unloaded; their checkpoints stay).
    keep_loaded: int = 3


class TrainerWorker:
    def __init__(
        self,
        settings: Settings,
        *,
        lora: LoraSettings = LoraSettings(),
        train: TrainSettings = TrainSettings(),
        worker: WorkerSettings = WorkerSettings(),
    ) -> None:
        self.settings, self.lora, self.train, self.worker = settings, lora, train, worker
        self.db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        self.registry = Registry(settings.policies_path)
        self.models: dict[str, PolicyModel] = {}
        self.vllm = httpx.Client(base_url=settings.upstream.rstrip("/").removesuffix("/v1"), timeout=120)
        self.steps_done = 0

    def checkpoints(self, policy: str) -> Path:
        return self.settings.data_path / "policies" / policy / "checkpoints"

    def model(self, policy: Policy, step: int) -> PolicyModel:
        if policy.name not in self.models:
            model = PolicyModel(policy.model_path or policy.base_model, self.lora, self.train)
            if step > 0:  # resume: adapter and optimizer state of the last trained step
                model.load(self.checkpoints(policy.name) / str(step))
            self.models[policy.name] = model
        return self.models[policy.name]

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.recover()
        while not stop.is_set():
            trained = False
            self.registry.reload()  # re-read the registry if it changed
            for policy in list(self.registry.policies.values()):
                await self.publish_pending(policy)
                trained |= await self.train_once(policy)
            if not trained:
                try:
                    await asyncio.wait_for(stop.wait(), self.worker.poll_s)
                except TimeoutError:
                    pass

    async def close(self) -> None:
        self.vllm.close()
        await self.db.dispose()

    async def recover(self) -> None:
        """Clean up after a trainer with this worker id that died mid-step."""
        await self.db.migrate()
        released = await self.db.transaction(release_groups, self.worker.worker_id)
        if released:
            log.info("released %d groups left claimed by an earlier run", released)
        for policy in self.registry.policies.values():
            trained = await self.db.transaction(last_trained_step, policy.name)
            for ckpt in self.checkpoints(policy.name).glob("*"):
                if not ckpt.name.isdigit() or int(ckpt.name) > trained:
                    log.info("removing %s: its groups were never marked trained", ckpt)
                    shutil.rmtree(ckpt)

    async def publish_pending(self, policy: Policy) -> None:
        trained = await self.db.transaction(last_trained_step, policy.name)
        if trained > policy.step:
            try:
                await asyncio.to_thread(self.publish, policy, trained, self.checkpoints(policy.name) / str(trained) / "adapter")
            except Exception as exc:
                log.error("%s@%d is trained but not served yet: %s", policy.name, trained, exc)

    async def train_once(self, policy: Policy) -> bool:
        ids = await self.db.transaction(claim_groups, policy.name, self.worker.worker_id, self.train.groups_per_step, self.worker.lease_s)
        if not ids:
            return False
        try:
            rows = await self.db.transaction(group_calls, ids)
            step = 1 + await self.db.transaction(last_trained_step, policy.name)
            await asyncio.to_thread(self.train_and_save, policy, rows, step)
        except Exception:
            log.exception("step for %s failed; its groups wait again", policy.name)
            self.models.pop(policy.name, None)  # the in-memory model may hold the failed step
            await self.db.transaction(release_groups, self.worker.worker_id, ids)
            return False
        await self.db.transaction(complete_groups, ids, self.worker.worker_id, step)
        self.registry.reload()
        await self.publish_pending(self.registry.policies.get(policy.name, policy))
        return True

    def train_and_save(self, policy: Policy, rows: list, step: int) -> None:
        t0 = time.perf_counter()
        model = self.model(policy, step - 1)
        items, rewards, fallbacks = self.batch(model, rows)
        metrics = model.step(items)
        model.step_count = step
        metrics.update(reward_mean=float(torch.tensor(rewards).mean()), reward_std=float(torch.tensor(rewards).std()), template_fallbacks=fallbacks)
        # Written aside and renamed: a checkpoint directory is whole or absent.
        ckpt = self.checkpoints(policy.name) / str(step)
        partial = ckpt.with_name(f".{step}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save(partial)
        metrics["seconds"] = time.perf_counter() - t0
        (partial / "metrics.json").write_bytes(msgspec.json.encode(metrics))
        shutil.rmtree(ckpt, ignore_errors=True)
        partial.rename(ckpt)
        log.info("%s step %d: reward %.3f loss %.4f tokens %d (%.2fs)", policy.name, step, metrics["reward_mean"], metrics["loss"], metrics["tokens"], metrics["seconds"])
        self.steps_done += 1

    def batch(self, model: PolicyModel, rows: list) -> tuple[list[tuple[Sequence, float]], list[float], int]:
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
            advantages = group_advantages(torch.tensor([rewards[t] for t in names]), scale=self.train.loss.scale_advantages)
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

    def publish(self, policy: Policy, step: int, adapter: Path) -> None:
        """Load into vLLM, check it answers, and only then switch the policy's alias to it."""
        name = f"{policy.name}@{step}"
        r = self.vllm.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(adapter)})
        if r.status_code != 200:
            raise RuntimeError(f"vLLM did not load {name}: {r.status_code} {r.text[:300]}")
        check = self.vllm.post("/v1/completions", json={"model": name, "prompt": "ok", "max_tokens": 1})
        if check.status_code != 200:
            raise RuntimeError(f"vLLM loaded {name} but it does not answer: {check.status_code} {check.text[:300]}")
        current = self.registry.policies
        write_policies(self.settings.policies_path, [p if p.name != policy.name else msgspec.structs.replace(p, step=step) for p in current.values()])
        self.registry.reload()  # see our own write at once
        for old in range(step - self.worker.keep_loaded, 0, -1):
            if self.vllm.post("/v1/unload_lora_adapter", json={"lora_name": f"{policy.name}@{old}"}).status_code != 200:
                break
