"""The model being trained: a policy's peft LoRA adapter on its base model, its optimizer, one GRPO step.

Read top to bottom: the micro-batch (sequences padded into tensors), the forward pass
(per-token logprobs), the step (loss, backward, clip, AdamW), checkpoints. Every knob
and its default is in ``core/learning/policies.py`` (LoraSettings, TrainSettings).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
import torch

from burnish_server.core.learning.policies import LoraSettings, TrainSettings
from burnish_server.core.learning.steps import StepMetrics
from burnish_server.trainer.base_model import Head, SharedBase
from burnish_server.trainer.grpo import behaviour_gap, grpo_loss
from burnish_server.trainer.logprobs import sampled_logprobs, top_forward_kl, top_logprobs
from burnish_server.trainer.objectives import distill_loss, sft_loss
from burnish_server.trainer.sequences import Sequence
from burnish_server.trainer.shared_prompts import Row, shared_rows
from burnish_server.trainer.teacher import teacher_against_rewards


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T]; packed: [1, total tokens]
    attention_mask: torch.Tensor | None  # [B, T]; packed: None (the position ids say where each sequence starts)
    position_ids: torch.Tensor | None  # packed: [1, total tokens], restarting at 0 for each sequence
    sampled: torch.Tensor  # [B, T], 1 on tokens to train on
    behaviour_logprobs: torch.Tensor  # [B, T]
    has_behaviour: torch.Tensor  # [B, T], False: no comparable recorded logprob (Sequence.compared), taken as on-policy (ratio 1)
    advantages: torch.Tensor  # [B, T]: the sequence's advantage, plus each call's credit per turn
    # Each objective's tokens, all of them among ``sampled`` (trainer/sequences.py: Sequence.grpo, imitate, taught).
    grpo: torch.Tensor  # [B, T]
    imitate: torch.Tensor  # [B, T]
    taught: torch.Tensor  # [B, T]
    teacher_logprobs: torch.Tensor  # [B, T], the teacher's where taught
    # With the teacher's top k (Teacher.top_k): its k likeliest tokens at each taught position and their logprobs, [B, T, k].
    teacher_top_ids: torch.Tensor | None
    teacher_top_logprobs: torch.Tensor | None
    # Where the sampled tokens are, found on the host from the lists (a ``nonzero`` on the device
    # would make the host wait for it): each sampled token's row and position (the hidden state
    # that predicts it is the one before).
    picked_rows: torch.Tensor  # [N]
    picked_at: torch.Tensor  # [N]
    picked_from: torch.Tensor  # [N]: the position in its row of the hidden state that predicts each (the one before, but where rows share a prompt)
    compared_tokens: int  # the trained tokens with a comparable recorded logprob
    held_tokens: int  # the trained tokens sampled under a grammar, whose ratio is against the trainer's own


def make_micro_batch(items: list[tuple[Sequence, float]] | list[Row], pad_id: int, max_len: int, device: torch.device, packed: bool = False) -> MicroBatch:
    """The micro-batch's tensors: one row per sequence, padded to the longest, or (``packed``)
    every sequence in one row, none padded. Sequences are cut at ``max_len``. Given ``Row``s
    (trainer/shared_prompts.py), a row may hold several sequences that begin with the same
    prompt: the prompt once, then each one's rest, kept apart by a 4-D attention mask.

    Built on the host, one flat list per tensor (the cheapest way from Python lists to a
    tensor), then copied to ``device``."""
    rows = [item if isinstance(item, Row) else Row([item]) for item in items]
    shared = any(row.prefix for row in rows)
    if shared and packed:
        raise ValueError("sequences that share a prompt are masked in a row of their own, not packed")
    seqs = [seq for row in rows for seq, _ in row.items]
    advantages = [advantage for row in rows for _, advantage in row.items]
    lengths = [row.length(max_len) for row in rows]
    width = sum(lengths) if packed else max(lengths)
    shape = (1, width) if packed else (len(rows), width)
    # Each row's sequences: (index in seqs, first token, end); for each token, where the hidden
    # state that predicts it is in its row (the token before it; for a rest's first token, the
    # shared prompt's last); and which part of its row it is (the shared prompt -1, else the
    # sequence's place in the row), for the mask.
    layout: list[list[tuple[int, int, int]]] = []
    before: list[list[int]] = []
    segments: list[list[int]] = []
    start = 0
    for row in rows:
        layout.append([])
        at = start if packed else 0
        for i, (first, end) in enumerate(row.spans(max_len)):
            layout[-1].append((len(before), first, end))
            before.append([0] * first + [at + t - first - 1 for t in range(first, end)])
            if first:
                before[-1][first] = row.prefix - 1
            segments.append([-1] * row.prefix + [i] * (end - row.prefix))
            at += end - first
        start += row.length(max_len)

    def tensor(values: list[list], fill: Any, dtype: torch.dtype) -> torch.Tensor:  # fill: a list of k for [B, T, k]
        flat: list = []
        for spans, length in zip(layout, lengths):
            for j, first, end in spans:
                flat += values[j][first:end]
            if not packed:
                flat += [fill] * (width - length)
        return torch.tensor(flat, dtype=dtype).view(*shape, *([len(fill)] if isinstance(fill, list) else []))

    ends = [end for spans in layout for _, _, end in spans]
    # A sequence's first token has nothing before it to be predicted from (packed, the one
    # before it is the previous sequence's last): never trained.
    trained = [[0, *s.trained()[1:end]] for s, end in zip(seqs, ends)]
    sampled = tensor(trained, 0, torch.int64)
    taught = (
        tensor([[m * t for m, t in zip(row, s.taught or [0] * len(row))] for s, row in zip(seqs, trained)], 0, torch.int64)
        if any(s.taught for s in seqs)
        else None
    )
    picked_rows, picked_at = sampled.nonzero(as_tuple=True)
    top_ids = top_logprobs = None
    if taught is not None and any(s.teacher_top for s in seqs):
        k = max(len(ids) for s in seqs for ids, _ in (s.teacher_top or []))
        # Where not taught, a harmless distribution (the loss masks it out): k tokens and a tail alike.
        nothing: tuple[list[int], list[float]] = (list(range(k)), [-math.log(k + 1)] * k)
        tops = [[pair if len(pair[0]) == k else nothing for pair in (s.teacher_top or [nothing] * len(s.tokens))] for s in seqs]
        top_ids = tensor([[ids for ids, _ in row] for row in tops], [0] * k, torch.int64)
        top_logprobs = tensor([[lp for _, lp in row] for row in tops], [0.0] * k, torch.float32)
    attention_mask = None
    if shared:
        # Row token i sees token j (j <= i) where j is the shared prompt's or i's own sequence's;
        # padding sees the prompt and the padding before it (a row of nothing would make NaNs).
        segment = tensor(segments, -2, torch.int64)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        attention_mask = (causal & ((segment[:, None, :] == -1) | (segment[:, None, :] == segment[:, :, None])))[:, None]
    elif not packed:
        attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    host = MicroBatch(
        input_ids=tensor([s.tokens for s in seqs], pad_id, torch.int64),
        attention_mask=attention_mask,
        position_ids=tensor([list(range(end)) for end in ends], 0, torch.int64) if packed or shared else None,
        sampled=sampled,
        behaviour_logprobs=tensor([s.behaviour_logprobs for s in seqs], 0.0, torch.float32),
        has_behaviour=tensor([s.compared for s in seqs], 0, torch.bool),
        advantages=tensor([[a + c for c in s.credit[:end]] for s, a, end in zip(seqs, advantages, ends)], 0.0, torch.float32),
        grpo=tensor([[s.grpo] * end for s, end in zip(seqs, ends)], 0, torch.int64) * sampled,
        imitate=tensor([[s.imitate] * end for s, end in zip(seqs, ends)], 0, torch.int64) * sampled,
        taught=taught if taught is not None else torch.zeros(shape, dtype=torch.int64),
        teacher_logprobs=tensor([s.teacher_logprobs or [0.0] * len(s.tokens) for s in seqs], 0.0, torch.float32) if taught is not None else torch.zeros(shape),
        teacher_top_ids=top_ids,
        teacher_top_logprobs=top_logprobs,
        picked_rows=picked_rows,
        picked_at=picked_at,
        picked_from=tensor(before, 0, torch.int64)[picked_rows, picked_at],
        compared_tokens=sum(sum(m * c for m, c in zip(row, s.compared)) for s, row in zip(seqs, trained)),
        held_tokens=sum(sum(m * h for m, h in zip(row, s.held)) for s, row in zip(seqs, trained)),
    )
    if device.type == "cpu":
        return host
    # Copied without waiting for the device: the next micro-batch's tensors travel while the last one's step runs.
    tensors = {f.name: getattr(host, f.name) for f in fields(host) if isinstance(getattr(host, f.name), torch.Tensor)}
    return replace(host, **{name: tensor.to(device, non_blocking=True) for name, tensor in tensors.items()})


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


def micro_batches(items: list[tuple[Sequence, float]], max_tokens: int, max_len: int, packed: bool = False, share: float | None = None) -> Iterator[list[Row]]:
    """Longest row first, packed greedily so that a micro-batch holds at most ``max_tokens``: its
    rows x its longest row, padded; the sum of its sequences' lengths, packed. ``share`` (the
    model's ``break_even``): sequences that begin with the same prompt share a row where it pays
    (trainer/shared_prompts.py); None: each sequence is a row."""
    rows = shared_rows(items, max_len, max_tokens, share) if share else [Row([item]) for item in items]
    ordered = sorted(rows, key=lambda row: row.length(max_len), reverse=True)
    chunk: list[Row] = []
    total = 0  # the chunk's tokens, unpadded
    for row in ordered:
        length = row.length(max_len)
        if chunk:
            longest = chunk[0].length(max_len)  # the first is the longest
            if (total + length if packed else (len(chunk) + 1) * longest) > max_tokens:
                yield chunk
                chunk, total = [], 0
        chunk.append(row)
        total += length
    if chunk:
        yield chunk


# Under FSDP2 a rank with fewer micro-batches than the others runs empty ones (trainer/distributed.py):
# one pad token of context and one "sampled", with a zero advantage and its loss multiplied by 0.
def filler(pad_id: int) -> list[Row]:
    sequence = Sequence()
    sequence.add([pad_id], [pad_id], None)
    return [Row([(sequence, 0.0)])]


V = TypeVar("V")  # a figure: torch.Tensor while the step runs, float once read


@dataclass
class Figures(Generic[V]):
    """The step's figures, by name. While the step runs, 0-dim tensors on the device, summed over
    its micro-batches (``+=``); read back once at its end, as floats. On a GPU a read waits for
    everything queued, so one inside the loop would leave the device idle while the host
    queues the next work. A micro-batch's figures leave 0 what it did not measure: it adds nothing."""

    loss: V | float = 0.0  # the objectives' terms, weighted and summed
    kl: V | float = 0.0
    clip_fraction: V | float = 0.0  # each micro-batch's clipped share, weighted by its share of GRPO's tokens
    grpo_loss: V | float = 0.0
    sft_nll: V | float = 0.0  # summed over the demonstration tokens
    teacher_kl: V | float = 0.0  # summed over the taught tokens
    # Summed over the trained tokens with a comparable recorded logprob (rows without them
    # compare with themselves, a gap of 0: left out): |logp - behaviour|, ratios outside the
    # clip range, TIS weights at their cap, KL(behaviour || trainer)'s k3 (trainer/grpo.py).
    logprob_diff: V | float = 0.0
    outside_clip: V | float = 0.0
    tis_capped: V | float = 0.0
    mismatch_kl: V | float = 0.0
    entropy: V | float = 0.0  # summed over the sampled tokens
    compared: V | float = 0.0  # the trained tokens with a comparable recorded logprob
    held: V | float = 0.0  # the trained tokens sampled under a grammar

    @classmethod
    def zeros(cls, device: torch.device) -> Figures[torch.Tensor]:
        zero = torch.zeros((), device=device)
        return Figures(*[zero] * len(fields(cls)))

    def __iadd__(self, other: Figures[V]) -> Figures[V]:
        for f in fields(self):
            # A figure left 0 queues no work (an int is the host's count: 0 adds nothing either).
            if isinstance(term := getattr(other, f.name), torch.Tensor) or term:
                setattr(self, f.name, getattr(self, f.name) + term)
        return self

    def stacked(self) -> torch.Tensor:
        """One tensor of the figures, in field order, to sum over the ranks and read at once."""
        return torch.stack([getattr(self, f.name) for f in fields(self)])


# The objectives' terms (core/learning/policies.py: Objective), each over its own tokens in the
# micro-batch and normalised by its tokens in the whole step (``tokens``), so that the
# micro-batches' terms add up to the step's. The losses are trainer/grpo.py's and trainer/objectives.py's.


def grpo_term(
    logprobs: torch.Tensor, behaviour: torch.Tensor, micro: MicroBatch, settings: TrainSettings, reference: torch.Tensor | None, tokens: int
) -> tuple[torch.Tensor, Figures[torch.Tensor]]:
    parts = grpo_loss(logprobs, behaviour, micro.advantages, micro.grpo, settings, reference, normaliser=tokens)
    clip_fraction = parts.clip_fraction * parts.tokens / tokens  # the micro-batch's share, weighted by its tokens
    return parts.loss, Figures(grpo_loss=parts.loss.detach(), kl=parts.kl, clip_fraction=clip_fraction, tis_capped=parts.tis_capped)


def sft_term(logprobs: torch.Tensor, micro: MicroBatch, tokens: int) -> tuple[torch.Tensor, Figures[torch.Tensor]]:
    parts = sft_loss(logprobs, micro.imitate, tokens)
    return parts.loss, Figures(sft_nll=parts.total)


def distill_term(
    logprobs: torch.Tensor, behaviour: torch.Tensor, micro: MicroBatch, tokens: int, top_kl: torch.Tensor | None
) -> tuple[torch.Tensor, Figures[torch.Tensor]]:
    parts = distill_loss(logprobs, behaviour, micro.teacher_logprobs, micro.taught, tokens, top_kl)
    return parts.loss, Figures(teacher_kl=parts.total)


def micro_batch_figures(
    logprobs: torch.Tensor, behaviour: torch.Tensor, entropy: torch.Tensor, loss: torch.Tensor, micro: MicroBatch, settings: TrainSettings
) -> Figures[torch.Tensor]:
    """A micro-batch's figures beside its objectives': its loss, the policy's entropy on its
    sampled tokens, and how far the trainer is from vLLM on them (trainer/grpo.py: behaviour_gap)."""
    spread = (entropy * micro.sampled).sum()
    gap = behaviour_gap(logprobs.detach(), behaviour, micro.sampled * micro.has_behaviour, settings)
    return Figures(
        loss=loss.detach(), entropy=spread, logprob_diff=gap.logprob_diff, outside_clip=gap.outside_clip, mismatch_kl=gap.mismatch_kl,
        compared=micro.compared_tokens, held=micro.held_tokens,
    )  # fmt: skip


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
        # torch's fused AdamW: one kernel over every LoRA tensor, with its step count on the device
        # (the per-tensor loop reads each tensor's count back to the host); 5x faster on the CPU
        # for SmolLM2's 420 LoRA tensors. The LoRA weights are whole on every rank, under FSDP2 too.
        self.optimizer = torch.optim.AdamW(self.params, lr=train.learning_rate, betas=train.adam_betas, weight_decay=train.weight_decay, fused=True)
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

    @contextmanager
    def _predicting(self, micro: MicroBatch) -> Iterator[tuple[torch.Tensor, Head]]:
        """The last hidden states that predict each sampled token ([N, hidden], in the order of
        ``picked_rows``/``picked_at``), and the LM head to apply to them, a chunk at a time."""
        self.activate()
        with self.base.hidden_states() as head:
            with self.base.compute():
                hidden = self.model(
                    input_ids=micro.input_ids,
                    attention_mask=micro.attention_mask,
                    position_ids=micro.position_ids,
                    logits_to_keep=0,  # every position, a view: the step picks the sampled ones itself
                    use_cache=False,  # nothing to cache in training; and with a cache transformers reads no packing from position ids
                ).logits  # [rows, positions, hidden]: the head is out
            yield hidden[micro.picked_rows, micro.picked_from], head

    def token_logprobs(self, micro: MicroBatch, entropy: list[torch.Tensor] | None = None, top_kl: list[torch.Tensor] | None = None) -> torch.Tensor:
        """logprob of each sampled token given the ones before it, fp32 [rows, positions]; 0
        where no token is sampled (the loss masks all but the sampled ones).

        The model runs to its last hidden states (its LM head swapped out); the head is then
        applied at the positions that predict a sampled token alone (an agent's prompt is most
        of its tokens), a chunk of them at a time (``trainer/logprobs.py``), so no [tokens x vocabulary] logits
        exist, in the forward pass or the backward (a 152k vocabulary: 0.6 MB a position in
        fp32). On a GPU the forward runs under the base's autocast (``SharedBase.compute``).

        ``top_kl``: where the micro-batch holds the teacher's top k, the forward KL from it to the
        policy at each sampled position ([rows, positions], differentiable) is appended."""
        at = (micro.picked_rows, micro.picked_at)
        with self._predicting(micro) as (hidden, head):
            picked, spread = sampled_logprobs(hidden, head.weight, micro.input_ids[at], scale=head.scale, softcap=head.softcap, entropy=entropy is not None)
            if top_kl is not None and micro.teacher_top_ids is not None and micro.teacher_top_logprobs is not None:
                ids, teacher = micro.teacher_top_ids[at], micro.teacher_top_logprobs[at]
                kl = top_forward_kl(hidden, head.weight, ids, teacher, scale=head.scale, softcap=head.softcap)
                top_kl.append(torch.zeros(micro.input_ids.shape, dtype=torch.float32, device=kl.device).index_put(at, kl))
        out = torch.zeros(micro.input_ids.shape, dtype=torch.float32, device=picked.device)
        if entropy is not None and spread is not None:  # the policy's entropy where each token was sampled: a health figure, no gradient
            entropy.append(out.index_put(at, spread))
        return out.index_put(at, picked)

    @torch.no_grad()
    def token_top(self, micro: MicroBatch, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As ``token_logprobs`` without a gradient, and at each sampled position the ``k``
        likeliest tokens and their logprobs ([rows, positions, k]): a teacher's, for top-k distillation."""
        at = (micro.picked_rows, micro.picked_at)
        with self._predicting(micro) as (hidden, head):
            picked, _ = sampled_logprobs(hidden, head.weight, micro.input_ids[at], scale=head.scale, softcap=head.softcap)
            ids, logprobs = top_logprobs(hidden, head.weight, k, scale=head.scale, softcap=head.softcap)
        shape = (*micro.input_ids.shape, k)
        return (
            torch.zeros(micro.input_ids.shape, dtype=torch.float32, device=picked.device).index_put(at, picked),
            torch.zeros(shape, dtype=torch.int64, device=ids.device).index_put(at, ids),
            torch.zeros(shape, dtype=torch.float32, device=ids.device).index_put(at, logprobs),
        )

    @torch.no_grad()
    def distance_from_base(self) -> torch.Tensor:
        """How far the adapter has moved the weights it adapts: ||scale * B @ A|| over ||W||
        (Frobenius, all adapted layers together), through r x r products, never the full delta:
        ||B A||^2 = trace(B^T B A A^T) = sum((B^T B) * (A A^T)), A A^T being symmetric. Layers of
        one shape are stacked and take one batched product, so the figure costs a few operations
        a step, not a few per layer. A tensor on the device (the step reads it with its others)."""
        from peft.tuners.lora import LoraLayer

        shapes: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        base = 0.0
        for module in self.model.modules():  # in the same order on every rank: squared_norm may be a collective
            layer: Any = module  # peft's layers type their adapters loosely
            if not isinstance(module, LoraLayer) or self.adapter not in layer.lora_A:
                continue
            a, b = layer.lora_A[self.adapter].weight.float(), layer.lora_B[self.adapter].weight.float()
            a_s, b_s = shapes.setdefault((a.shape, b.shape, layer.scaling[self.adapter]), ([], []))
            a_s.append(a)
            b_s.append(b)
            base += self.base.squared_norm(layer.base_layer)
        moved = torch.zeros((), device=self.device)
        for (_, _, scaling), (a_s, b_s) in shapes.items():
            a, b = torch.stack(a_s), torch.stack(b_s)  # [layers, r, in], [layers, out, r]
            moved += scaling**2 * ((b.mT @ b) * (a @ a.mT)).sum()
        return (moved / base).sqrt() if base else moved

    @torch.no_grad()
    def teach(self, items: list[tuple[Sequence, float]]) -> None:
        """The teacher's logprob of each sampled token it can score (``Sequence.teacher_logprobs``
        and ``taught``): the base model, adapter off, on each call's teacher prompt
        (trainer/teacher.py) followed by the tokens the policy sampled, in micro-batches as the
        step's. A token past ``max_seq_len`` in the teacher's longer sequence is not taught."""
        spans: list[tuple[Sequence, int, int]] = []  # (student sequence, its span's start, length)
        asked: list[tuple[Sequence, float]] = []
        k = self.train.teacher.top() if self.train.teacher is not None else 0
        for seq, _ in items:
            if seq.taught is not None:  # scored already (a teacher vLLM serves: trainer/teacher.py)
                continue
            seq.teacher_logprobs, seq.taught = [0.0] * len(seq.tokens), [0] * len(seq.tokens)
            if k:
                seq.teacher_top = [([], [])] * len(seq.tokens)
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
            micro = make_micro_batch(chunk, self.pad_id, max_len, self.device, packed)
            with self.model.disable_adapter():
                if k:
                    logprobs, top_ids, top_logprobs = (t.cpu() for t in self.token_top(micro, k))
                else:
                    logprobs = self.token_logprobs(micro).cpu()
            if index >= len(chunks):
                continue
            offset = 0
            for row, (question, _) in enumerate(item for r in chunk for item in r.items):
                seq, start, length = where[id(question)]
                line = logprobs[0, offset:] if packed else logprobs[row]
                prompt = len(question.tokens) - length
                scores, taught = seq.teacher_logprobs, seq.taught
                assert scores is not None and taught is not None  # made above
                for i in range(min(length, max_len - prompt)):
                    scores[start + i] = float(line[prompt + i])
                    taught[start + i] = 1
                if k:
                    ids = top_ids[0, offset:] if packed else top_ids[row]
                    values = top_logprobs[0, offset:] if packed else top_logprobs[row]
                    tops = seq.teacher_top
                    assert tops is not None  # made above
                    for i in range(min(length, max_len - prompt)):
                        tops[start + i] = (ids[prompt + i].tolist(), values[prompt + i].tolist())
                offset += min(len(question.tokens), max_len)

    @torch.no_grad()
    def reference_logprobs(self, micro: MicroBatch) -> torch.Tensor:
        """The base model's logprobs of the sampled tokens (the adapter off): GRPO's KL reference."""
        with self.model.disable_adapter():
            return self.token_logprobs(micro)

    def step(self, items: list[tuple[Sequence, float]]) -> StepMetrics:
        """One optimizer step over (sequence, advantage) pairs: the policy's objectives
        (core/learning/policies.py: Objective), each token-level over the tokens it trains on, weighted
        and summed; the teacher scores the samples first where the policy distills.

        Besides the loss it reports how far the trainer's logprobs of the sampled tokens are
        from those vLLM recorded (``logprob_diff``, ``outside_clip``: over the tokens that have
        recorded logprobs), which says whether the samples are still on-policy enough to learn from."""
        self.activate()
        settings, ranks, packed, max_len = self.train, self.base.ranks, self.base.packs, self.train.max_seq_len
        weights = settings.weights
        trained = [s.trained() for s, _ in items]
        total = sum(sum(mask[:max_len]) for mask in trained)  # over every rank's share
        forced = sum(s.sampled for s, _ in items) - sum(sum(mask) for mask in trained)
        # This rank's share of the sequences (all of them, on one rank), in micro-batches; under
        # FSDP2 every rank runs as many as the busiest, the others' extra ones empty.
        mine = ranks.share(items, [min(len(s.tokens), max_len) for s, _ in items])
        t0 = time.perf_counter()
        if weights.distill > 0:
            self.model.eval()
            self.teach(mine)
        seconds_teacher = time.perf_counter() - t0
        pairs, against = ranks.sum([float(n) for n in teacher_against_rewards(mine)]) if weights.distill > 0 else (0.0, 0.0)
        self.model.train()
        # Each objective is normalised by its own tokens, over the whole step (every rank's share).
        n_grpo, n_sft, _ = taught_tokens(items, max_len)
        n_distill = int(ranks.sum([float(taught_tokens(mine, max_len)[2])])[0])
        chunks = list(micro_batches(mine, settings.micro_batch_tokens, max_len, packed, self.base.break_even if self.base.shares_prompts else None))
        passes = ranks.most(len(chunks)) if ranks.sharded else len(chunks)
        sums = Figures.zeros(self.device)
        for index in range(passes):
            real = index < len(chunks)
            micro = make_micro_batch(chunks[index] if real else filler(self.pad_id), self.pad_id, max_len, self.device, packed)
            spread: list[torch.Tensor] = []
            top_kl: list[torch.Tensor] = []  # with the teacher's top k: the forward KL to it per sampled position
            logprobs = self.token_logprobs(micro, spread, top_kl if weights.distill > 0 else None)
            # Without recorded behaviour logprobs the step is on-policy: ratio 1.
            behaviour = torch.where(micro.has_behaviour, micro.behaviour_logprobs, logprobs.detach())
            loss = logprobs.sum() * 0  # an objective with no tokens here adds nothing, but the pass still backpropagates (FSDP2's collectives)
            if weights.grpo > 0 and n_grpo:
                reference = self.reference_logprobs(micro) if settings.kl_coef > 0 else None
                term, figures = grpo_term(logprobs, behaviour, micro, settings, reference, n_grpo)
                loss = loss + weights.grpo * term
                sums += figures
            if weights.sft > 0 and n_sft:
                term, figures = sft_term(logprobs, micro, n_sft)
                loss = loss + weights.sft * term
                sums += figures
            if weights.distill > 0 and n_distill:
                term, figures = distill_term(logprobs, behaviour, micro, n_distill, top_kl[0] if top_kl else None)
                loss = loss + weights.distill * term
                sums += figures
            (loss if real else loss * 0).backward()
            if real:  # not an empty pass's (a filler's), though its objectives' figures above are summed all the same
                sums += micro_batch_figures(logprobs, behaviour, spread[0], loss, micro, settings)
        # Every rank's gradients and figures, summed: the step's, as one rank would have them.
        ranks.sum_gradients(self.params)
        summed = ranks.total(sums.stacked())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, settings.grad_clip)
        # No objective had a token (every call unrendered for a teacher, say): no update at all,
        # not even AdamW's momentum carrying the weights on from the steps before.
        if (weights.grpo > 0) * n_grpo + (weights.sft > 0) * n_sft + (weights.distill > 0) * n_distill:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        # The one read of the step: its figures, the gradient's norm and the adapter's distance.
        *values, grad_norm_value, distance = torch.cat([summed.double(), grad_norm.double()[None], self.distance_from_base().double()[None]]).tolist()
        got: Figures[float] = Figures(*values)
        n = max(got.compared, 1.0)
        return StepMetrics(
            loss=got.loss,
            kl=got.kl,
            clip_fraction=got.clip_fraction,
            grad_norm=grad_norm_value,
            tokens=float(total),
            forced_tokens=float(forced),
            held_tokens=got.held,
            sequences=float(len(items)),
            grpo_loss=got.grpo_loss,
            grpo_tokens=float(n_grpo if weights.grpo > 0 else 0),
            sft_loss=got.sft_nll / max(n_sft, 1),
            sft_tokens=float(n_sft if weights.sft > 0 else 0),
            teacher_kl=got.teacher_kl / max(n_distill, 1),
            distill_tokens=float(n_distill if weights.distill > 0 else 0),
            seconds_teacher=seconds_teacher,
            teacher_pairs=int(pairs),
            teacher_pairs_against=int(against),
            logprob_diff_mean=got.logprob_diff / n,
            outside_clip_fraction=got.outside_clip / n,
            tis_capped_fraction=got.tis_capped / n,
            mismatch_kl=got.mismatch_kl / n,
            # Learning health (docs/health.md): the policy's entropy on its sampled tokens, and
            # how far the adapter has moved the weights from the base's.
            entropy=got.entropy / max(total, 1),
            distance_from_base=distance,
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
