"""The model being trained: a policy's peft LoRA adapter on its base model, its optimizer, one GRPO step.

Read top to bottom: the batch (sequences padded into tensors), the forward pass
(per-token logprobs), the step (loss, backward, clip, AdamW), checkpoints. Every knob
and its default is in ``core/policies.py`` (LoraSettings, TrainSettings).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from burnish_server.core.policies import LoraSettings, TrainSettings
from burnish_server.core.steps import StepMetrics
from burnish_server.trainer.base_model import SharedBase
from burnish_server.trainer.grpo import behaviour_gap, grpo_loss
from burnish_server.trainer.logprobs import sampled_logprobs
from burnish_server.trainer.objectives import distill_loss, sft_loss
from burnish_server.trainer.sequences import Sequence


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]; packed: [1, total tokens]
    attention_mask: torch.Tensor | None  # [B, T]; packed: None (the position ids say where each sequence starts)
    position_ids: torch.Tensor | None  # packed: [1, total tokens], restarting at 0 for each sequence
    sampled: torch.Tensor  # [B, T], 1 on tokens to train on
    behaviour_logprobs: torch.Tensor  # [B, T]
    has_behaviour: torch.Tensor  # [B, T], False: no recorded logprobs, taken as on-policy (ratio 1)
    advantages: torch.Tensor  # [B, T]: the sequence's advantage, plus each call's credit per turn
    # Each objective's tokens, all of them among ``sampled`` (trainer/sequences.py: Sequence.grpo, imitate, taught).
    grpo: torch.Tensor  # [B, T]
    imitate: torch.Tensor  # [B, T]
    taught: torch.Tensor  # [B, T]
    teacher_logprobs: torch.Tensor  # [B, T], the teacher's where taught


def make_batch(items: list[tuple[Sequence, float]], pad_id: int, max_len: int, device: torch.device, packed: bool = False) -> Batch:
    """The micro-batch's tensors: one row per sequence, padded to the longest, or (``packed``)
    every sequence in one row, none padded. Sequences are cut at ``max_len``."""

    def rows(values: Callable[[Sequence, float], list]) -> list[list]:
        return [values(s, a)[:max_len] for s, a in items]

    def tensor(values: list[list], fill: float | int, dtype: torch.dtype | None = None) -> torch.Tensor:
        if packed:
            return torch.tensor([[v for row in values for v in row]], device=device, dtype=dtype)
        width = max(len(row) for row in values)
        return torch.tensor([row + [fill] * (width - len(row)) for row in values], device=device, dtype=dtype)

    tokens = rows(lambda s, a: s.tokens)
    sampled = rows(lambda s, a: [0, *s.trained()[1:]])
    return Batch(
        input_ids=tensor(tokens, pad_id),
        attention_mask=None if packed else tensor([[1] * len(row) for row in tokens], 0),
        position_ids=tensor([list(range(len(row))) for row in tokens], 0) if packed else None,
        # A sequence's first token has nothing before it to be predicted from (packed, the one
        # before it is the previous sequence's last): never trained.
        sampled=tensor(sampled, 0),
        behaviour_logprobs=tensor(rows(lambda s, a: s.behaviour_logprobs), 0.0, torch.float32),
        has_behaviour=tensor(rows(lambda s, a: [s.has_behaviour_logprobs] * len(s.tokens)), False),
        advantages=tensor(rows(lambda s, a: [a + c for c in s.credit]), 0.0, torch.float32),
        grpo=tensor([[m * s.grpo for m in row] for (s, _), row in zip(items, sampled)], 0),
        imitate=tensor([[m * s.imitate for m in row] for (s, _), row in zip(items, sampled)], 0),
        taught=tensor([[m * t for m, t in zip(row, s.taught or [0] * len(row))] for (s, _), row in zip(items, sampled)], 0),
        teacher_logprobs=tensor(rows(lambda s, a: s.teacher_logprobs or [0.0] * len(s.tokens)), 0.0, torch.float32),
    )


def taught_tokens(items: list[tuple[Sequence, float]], max_len: int) -> tuple[int, int, int]:
    """The tokens each objective trains on in ``items`` (GRPO, SFT, distillation), as the loss counts them."""
    grpo = imitate = taught = 0
    for seq, _ in items:
        trained = [0, *seq.trained()[1:]][:max_len]
        n = sum(trained)
        grpo += n * seq.grpo
        imitate += n * seq.imitate
        taught += sum(m * t for m, t in zip(trained, seq.taught or []))
    return grpo, imitate, taught


def micro_batches(items: list[tuple[Sequence, float]], max_tokens: int, max_len: int, packed: bool = False) -> Iterator[list[tuple[Sequence, float]]]:
    """Longest first, packed greedily so that a micro-batch holds at most ``max_tokens``: its
    rows x its longest row, padded; the sum of its sequences' lengths, packed."""
    ordered = sorted(items, key=lambda item: len(item[0].tokens), reverse=True)
    chunk: list[tuple[Sequence, float]] = []
    total = 0  # the chunk's tokens, unpadded
    for item in ordered:
        length = min(len(item[0].tokens), max_len)
        if chunk:
            longest = min(len(chunk[0][0].tokens), max_len)  # the first is the longest
            if (total + length if packed else (len(chunk) + 1) * longest) > max_tokens:
                yield chunk
                chunk, total = [], 0
        chunk.append(item)
        total += length
    if chunk:
        yield chunk


# Under FSDP2 a rank with fewer micro-batches than the others runs empty ones (trainer/distributed.py):
# one pad token of context and one "sampled", with a zero advantage and its loss multiplied by 0.
def filler(pad_id: int) -> list[tuple[Sequence, float]]:
    sequence = Sequence()
    sequence.add([pad_id], [pad_id], None)
    return [(sequence, 0.0)]


@dataclass(frozen=True, slots=True)
class Saved:
    """A checkpoint in memory: what a rank needs to resume a policy's model."""

    adapter: dict[str, torch.Tensor]  # the LoRA weights, by peft's names
    optimizer: dict[str, Any]  # torch's optimizer state_dict
    step: int


class PolicyModel:
    """A policy's adapter on its base model (``trainer/base_model.py``: a base may hold several
    policies' adapters), its optimizer, and the step."""

    def __init__(
        self, base_model: str | SharedBase, lora: LoraSettings = LoraSettings(), train: TrainSettings = TrainSettings(), owner: str = "policy"
    ) -> None:
        from peft import LoraConfig

        self.base = base_model if isinstance(base_model, SharedBase) else SharedBase(base_model)
        self.owner = owner
        self.device = self.base.device
        self.tokenizer = self.base.tokenizer
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
        self.model, self.adapter = self.base.attach(owner, config, train.seed)
        self.lora, self.train = lora, train
        # This adapter's weights alone (peft names them ...lora_A.<adapter>.weight).
        self.params = [p for n, p in self.model.named_parameters() if f".{self.adapter}." in n]
        self.optimizer = torch.optim.AdamW(self.params, lr=train.learning_rate, betas=train.adam_betas, weight_decay=train.weight_decay)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.step_count = 0

    def activate(self) -> None:
        """Make this policy's adapter the one the forward pass uses (and the only one trained)."""
        if self.model.active_adapter != self.adapter:
            self.model.set_adapter(self.adapter)

    def close(self) -> None:
        """Take the adapter off the base (the base stays loaded for the other policies on it)."""
        self.base.detach(self.owner)

    def configure(self, train: TrainSettings) -> None:
        """New training settings for the next steps; the optimizer keeps its state."""
        for group in self.optimizer.param_groups:
            group.update(lr=train.learning_rate, betas=train.adam_betas, weight_decay=train.weight_decay)
        self.train = train

    def token_logprobs(self, batch: Batch, entropy: list[torch.Tensor] | None = None) -> torch.Tensor:
        """logprob of each sampled token given the ones before it, fp32 [rows, positions]; 0
        where no token is sampled (the loss masks all but the sampled ones).

        The model runs to its last hidden states, kept only at the positions that predict a
        sampled token in some row (transformers' ``logits_to_keep``: an agent's prompt is most of
        its tokens); the LM head is then applied to the sampled (row, position) pairs alone, a
        chunk of them at a time (``trainer/logprobs.py``), so no [tokens x vocabulary] logits
        exist, in the forward pass or the backward (a 152k vocabulary: 0.6 MB a position in
        fp32). On a GPU the forward runs under the base's autocast (``SharedBase.compute``)."""
        self.activate()
        predicts = batch.sampled[:, 1:].any(0).nonzero().squeeze(-1)  # position t predicts token t + 1
        with self.base.hidden_states() as head:
            with self.base.compute():
                hidden = self.model(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids,
                    logits_to_keep=predicts,
                    use_cache=False,  # nothing to cache in training; and with a cache transformers reads no packing from position ids
                ).logits  # [rows, len(predicts), hidden]: the head is out
            rows, columns = batch.sampled[:, predicts + 1].nonzero(as_tuple=True)
            at = (rows, predicts[columns] + 1)
            picked, spread = sampled_logprobs(
                hidden[rows, columns], head.weight, batch.input_ids[at], scale=head.scale, softcap=head.softcap, entropy=entropy is not None
            )
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=picked.device)
        if entropy is not None and spread is not None:  # the policy's entropy where each token was sampled: a health figure, no gradient
            entropy.append(out.index_put(at, spread))
        return out.index_put(at, picked)

    @torch.no_grad()
    def distance_from_base(self) -> float:
        """How far the adapter has moved the weights it adapts: ||scale * B @ A|| over ||W||
        (Frobenius, all adapted layers together), through r x r products, never the full delta."""
        from peft.tuners.lora import LoraLayer

        moved = base = 0.0
        for module in self.model.modules():  # in the same order on every rank: squared_norm may be a collective
            layer: Any = module  # peft's layers type their adapters loosely
            if not isinstance(module, LoraLayer) or self.adapter not in layer.lora_A:
                continue
            a, b = layer.lora_A[self.adapter].weight.float(), layer.lora_B[self.adapter].weight.float()
            moved += float(layer.scaling[self.adapter] ** 2 * torch.trace((b.T @ b) @ (a @ a.T)))
            base += self.base.squared_norm(layer.base_layer)
        return (moved / base) ** 0.5 if base else 0.0

    @torch.no_grad()
    def teach(self, items: list[tuple[Sequence, float]]) -> None:
        """The teacher's logprob of each sampled token it can score (``Sequence.teacher_logprobs``
        and ``taught``): the base model, adapter off, on each call's teacher prompt
        (trainer/teacher.py) followed by the tokens the policy sampled, in micro-batches as the
        step's. A token past ``max_seq_len`` in the teacher's longer sequence is not taught."""
        spans: list[tuple[Sequence, int, int]] = []  # (student sequence, its span's start, length)
        asked: list[tuple[Sequence, float]] = []
        for seq, _ in items:
            if seq.taught is not None:  # scored already (a teacher vLLM serves: trainer/teacher.py)
                continue
            seq.teacher_logprobs, seq.taught = [0.0] * len(seq.tokens), [0] * len(seq.tokens)
            for span in seq.spans:
                if span.teacher_prompt is None or span.length == 0:
                    continue
                question = Sequence()
                question.add(span.teacher_prompt, seq.tokens[span.start : span.start + span.length], None)
                spans.append((seq, span.start, span.length))
                asked.append((question, 0.0))
        where = {id(question): at for (question, _), at in zip(asked, spans)}
        max_len, packed = self.train.max_seq_len, self.base.packs
        chunks = list(micro_batches(asked, self.train.micro_batch_tokens, max_len, packed))
        ranks = self.base.ranks
        for index in range(ranks.most(len(chunks)) if ranks.sharded else len(chunks)):
            chunk = chunks[index] if index < len(chunks) else filler(self.pad_id)
            batch = make_batch(chunk, self.pad_id, max_len, self.device, packed)
            with self.model.disable_adapter():
                logprobs = self.token_logprobs(batch).cpu()
            if index >= len(chunks):
                continue
            offset = 0
            for row, (question, _) in enumerate(chunk):
                seq, start, length = where[id(question)]
                line = logprobs[0, offset:] if packed else logprobs[row]
                prompt = len(question.tokens) - length
                scores, taught = seq.teacher_logprobs, seq.taught
                assert scores is not None and taught is not None  # made above
                for i in range(min(length, max_len - prompt)):
                    scores[start + i] = float(line[prompt + i])
                    taught[start + i] = 1
                offset += min(len(question.tokens), max_len)

    def step(self, items: list[tuple[Sequence, float]]) -> StepMetrics:
        """One optimizer step over (sequence, advantage) pairs: the policy's objectives
        (core/policies.py: Objective), each token-level over the tokens it trains on, weighted
        and summed; the teacher scores the samples first where the policy distills.

        Besides the loss it reports how far the trainer's logprobs of the sampled tokens are
        from those vLLM recorded (``logprob_diff``, ``outside_clip``: over the tokens that have
        recorded logprobs), which says whether the samples are still on-policy enough to learn from."""
        self.activate()
        settings, ranks, packed = self.train, self.base.ranks, self.base.packs
        weights = settings.weights
        trained = [s.trained() for s, _ in items]
        total = sum(sum(mask[: self.train.max_seq_len]) for mask in trained)  # over every rank's share
        forced = sum(s.sampled for s, _ in items) - sum(sum(mask) for mask in trained)
        # This rank's share of the sequences (all of them, on one rank), in micro-batches; under
        # FSDP2 every rank runs as many as the busiest, the others' extra ones empty.
        mine = ranks.share(items, [min(len(s.tokens), self.train.max_seq_len) for s, _ in items])
        t0 = time.perf_counter()
        if weights.distill > 0:
            self.model.eval()
            self.teach(mine)
        seconds_teacher = time.perf_counter() - t0
        self.model.train()
        # Each objective is normalised by its own tokens, over the whole step (every rank's share).
        n_grpo, n_sft, _ = taught_tokens(items, self.train.max_seq_len)
        n_distill = int(ranks.sum([float(taught_tokens(mine, self.train.max_seq_len)[2])])[0])
        chunks = list(micro_batches(mine, self.train.micro_batch_tokens, self.train.max_seq_len, packed))
        passes = ranks.most(len(chunks)) if ranks.sharded else len(chunks)
        sums = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grpo_loss": 0.0, "sft_nll": 0.0, "teacher_kl": 0.0}
        compared = {"logprob_diff": 0.0, "outside_clip": 0.0, "tis_capped": 0.0, "tokens": 0.0}
        entropy = 0.0
        for index in range(passes):
            real = index < len(chunks)
            batch = make_batch(chunks[index] if real else filler(self.pad_id), self.pad_id, self.train.max_seq_len, self.device, packed)
            spread: list[torch.Tensor] = []
            logprobs = self.token_logprobs(batch, spread)
            # Without recorded behaviour logprobs the step is on-policy: ratio 1.
            behaviour = torch.where(batch.has_behaviour, batch.behaviour_logprobs, logprobs.detach())
            loss = logprobs.sum() * 0  # an objective with no tokens here adds nothing, but the pass still backpropagates (FSDP2's collectives)
            if weights.grpo > 0 and n_grpo:
                reference = None
                if settings.kl_coef > 0:
                    with torch.no_grad(), self.model.disable_adapter():
                        reference = self.token_logprobs(batch)
                parts = grpo_loss(logprobs, behaviour, batch.advantages, batch.grpo, settings, reference, normaliser=n_grpo)
                loss = loss + weights.grpo * parts.loss
                sums["grpo_loss"] += parts.loss.item()
                sums["kl"] += parts.kl.item()
                sums["clip_fraction"] += parts.clip_fraction.item() * parts.tokens / n_grpo
                compared["tis_capped"] += parts.tis_capped.item()
            if weights.sft > 0 and n_sft:
                sft = sft_loss(logprobs, batch.imitate, n_sft)
                loss = loss + weights.sft * sft.loss
                sums["sft_nll"] += sft.total.item()
            if weights.distill > 0 and n_distill:
                taught = distill_loss(logprobs, behaviour, batch.teacher_logprobs, batch.taught, n_distill)
                loss = loss + weights.distill * taught.loss
                sums["teacher_kl"] += taught.total.item()
            (loss if real else loss * 0).backward()
            if not real:
                continue
            # Normalised by the step's token count, the micro-batches' terms add up to the step's.
            entropy += float((spread[0] * batch.sampled).sum())
            sums["loss"] += loss.item()
            # How far the trainer is from vLLM on every trained token that has recorded logprobs
            # (rows without them compare with themselves, a gap of 0: left out).
            gap, outside = behaviour_gap(logprobs.detach(), behaviour, batch.sampled * batch.has_behaviour, settings)
            compared["tokens"] += float((batch.sampled * batch.has_behaviour).sum().item())
            compared["logprob_diff"] += gap
            compared["outside_clip"] += outside
        # Every rank's gradients and figures, summed: the step's, as one rank would have them.
        ranks.sum_gradients(self.params)
        *summed, entropy = ranks.sum([*sums.values(), *compared.values(), entropy])
        sums.update(zip(sums, summed))
        compared.update(zip(compared, summed[len(sums) :]))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.train.grad_clip).item()
        # No objective had a token (every call unrendered for a teacher, say): no update at all,
        # not even AdamW's momentum carrying the weights on from the steps before.
        if (weights.grpo > 0) * n_grpo + (weights.sft > 0) * n_sft + (weights.distill > 0) * n_distill:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        n = max(compared["tokens"], 1.0)
        return StepMetrics(
            loss=sums["loss"],
            kl=sums["kl"],
            clip_fraction=sums["clip_fraction"],
            grad_norm=grad_norm,
            tokens=float(total),
            forced_tokens=float(forced),
            sequences=float(len(items)),
            grpo_loss=sums["grpo_loss"],
            grpo_tokens=float(n_grpo if weights.grpo > 0 else 0),
            sft_loss=sums["sft_nll"] / max(n_sft, 1),
            sft_tokens=float(n_sft if weights.sft > 0 else 0),
            teacher_kl=sums["teacher_kl"] / max(n_distill, 1),
            distill_tokens=float(n_distill if weights.distill > 0 else 0),
            seconds_teacher=seconds_teacher,
            logprob_diff_mean=compared["logprob_diff"] / n,
            outside_clip_fraction=compared["outside_clip"] / n,
            tis_capped_fraction=compared["tis_capped"] / n,
            # Learning health (docs/trainer.md): the policy's entropy on its sampled tokens, and
            # how far the adapter has moved the weights from the base's.
            entropy=entropy / max(total, 1),
            distance_from_base=self.distance_from_base(),
        )

    def save(self, directory: Path) -> None:
        """Adapter (what vLLM loads), optimizer and trainer state: enough to resume exactly."""
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        adapter = directory / "adapter"
        adapter.mkdir(parents=True, exist_ok=True)
        # As peft's save_pretrained writes an adapter (its keys without the adapter's name),
        # for this adapter alone whatever else the base holds.
        # From the adapter's own parameters: the model's whole state dict would hold the base's
        # FSDP2 shards too.
        mine = {n: p.detach() for n, p in self.model.named_parameters() if f".{self.adapter}." in n}
        weights = {k: v.contiguous() for k, v in get_peft_model_state_dict(self.model, state_dict=mine, adapter_name=self.adapter).items()}
        save_file(weights, str(adapter / "adapter_model.safetensors"), metadata={"format": "pt"})
        config = self.model.peft_config[self.adapter]
        inference_mode, config.inference_mode = config.inference_mode, True
        config.save_pretrained(str(adapter))
        config.inference_mode = inference_mode
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        state = {"step": self.step_count, "lora": msgspec.to_builtins(self.lora), "train": msgspec.to_builtins(self.train)}
        (directory / "trainer_state.json").write_text(json.dumps(state, indent=2))

    @staticmethod
    def read(directory: Path) -> Saved:
        """A checkpoint in memory. Rank 0 reads it and sends it to the other ranks
        (trainer/models.py), which need not see the data directory."""
        from safetensors.torch import load_file

        return Saved(
            adapter=load_file(directory / "adapter" / "adapter_model.safetensors"),
            optimizer=torch.load(directory / "optimizer.pt", map_location="cpu"),
            step=json.loads((directory / "trainer_state.json").read_text())["step"],
        )

    def restore(self, state: Saved) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in state.adapter.items()}, adapter_name=self.adapter)
        self.optimizer.load_state_dict(state.optimizer)  # moves the state to the parameters' device
        self.configure(self.train)  # the saved state carries the old lr/betas: the policy's settings win
        self.step_count = state.step

    def load(self, directory: Path) -> None:
        self.restore(self.read(directory))
