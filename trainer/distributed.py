"""The trainer past one device: N ranks on torch.distributed, started by torchrun.

Every rank holds the same policies' models and takes every step together; rank 0 alone
talks to the store and to vLLM (trainer/worker.py) and tells the others what to do
(trainer/models.py: ``follow``). A step's sequences are split among the ranks by tokens, so
that they finish together; each rank runs forward and backward on its share, the adapter's
gradients are summed across ranks, and every rank takes the same optimizer step. The loss
is normalised by the step's token count over all ranks, so N ranks compute the gradient one
rank would (tests/trainer/test_distributed.py checks the adapters agree).

Two ways to hold the base model (``BURNISH_TRAINER_PARALLEL``):

* ``ddp``: every rank holds the whole base; only the adapter's gradients cross ranks, summed
  in one all-reduce per step. This is DDP's algorithm; DDP's wrapper is not used because it
  fixes its parameters when it wraps the model, and a trainer adds and removes policies'
  adapters on a base while it runs (trainer/base_model.py).
* ``fsdp``: FSDP2 (``fully_shard``) shards each decoder layer's base weights across the ranks,
  gathered for the layer's forward and backward: a base N times a device's memory fits on N.
  The LoRA weights, which are the only ones trained and are small, stay whole on every rank
  (they are attached after the sharding, so FSDP does not manage them) and are summed as
  under ``ddp``. Every forward gathers weights from every rank, so under ``fsdp`` each rank
  runs as many micro-batches as the busiest (the others run empty ones).

A rank that dies fails the collective the others are in: rank 0's step raises, its groups
are released and nothing is recorded; torchrun restarts the ranks (``--max-restarts``) and
they resume from the last checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar

import torch

Parallel = Literal["ddp", "fsdp"]
T = TypeVar("T")

# A follower waits this long for rank 0's next word; rank 0 speaks at least every
# KEEP_ALIVE_S while idle (trainer/models.py), so this bounds only a rank 0 that hangs.
COMMAND_TIMEOUT = timedelta(hours=1)


@dataclass
class Ranks:
    """This process's place among the trainer's ranks (one, unless started by torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    parallel: Parallel = "ddp"
    commands: Any = field(default=None, repr=False)  # a gloo group: objects between CPUs, whatever the device

    @classmethod
    def from_env(cls, parallel: Parallel = "ddp") -> Ranks:
        """From torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); one rank without it."""
        import torch.distributed as dist

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(parallel=parallel)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        commands = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
        return cls(dist.get_rank(), world, local_rank, parallel, commands)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.parallel == "fsdp" and self.world > 1

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    def close(self) -> None:
        import torch.distributed as dist

        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()

    # ---- the step's work, split -----------------------------------------------------------

    def share(self, items: list[T], tokens: list[int]) -> list[T]:
        """This rank's items: longest first, each to the rank with the fewest tokens so far
        (ties to the lowest rank). Every rank computes the same split."""
        if self.world == 1:
            return items
        load, mine = [0] * self.world, []
        for i in sorted(range(len(items)), key=lambda i: -tokens[i]):
            rank = load.index(min(load))
            load[rank] += tokens[i]
            if rank == self.rank:
                mine.append(items[i])
        return mine

    def most(self, n: int) -> int:
        """The largest ``n`` over the ranks."""
        if self.world == 1:
            return n
        import torch.distributed as dist

        value = torch.tensor([n], dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        summed = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return summed.tolist()

    def total(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the ranks, where they are (on a GPU, without waiting for them)."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        summed = values.double()
        dist.all_reduce(summed)
        return summed

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Each parameter's gradient summed over the ranks, in one all-reduce (a rank that had
        no sequence adds zeros)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        for p, g, part in zip(params, grads, flat.split([g.numel() for g in grads])):
            p.grad = part.view_as(g).to(g.dtype)

    def squared_norm(self, weight: torch.Tensor) -> float:
        """||weight||^2, whether the weight is whole here or a shard of a DTensor."""
        from torch.distributed.tensor import DTensor

        if not isinstance(weight, DTensor):
            return float(weight.detach().float().pow(2).sum())
        return self.sum([float(weight.to_local().detach().float().pow(2).sum())])[0]

    # ---- the base, held --------------------------------------------------------------------

    def shard(self, model: Any) -> None:
        """Under ``fsdp`` with several ranks, FSDP2 over each decoder layer and then the whole
        model (its embeddings and head). The base's weights are frozen first: sharded weights
        that nothing trains need no gradient reduction."""
        if not self.sharded:
            return
        from torch.distributed.fsdp import fully_shard

        for p in model.parameters():
            p.requires_grad_(False)
        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)

    # ---- rank 0's word to the others ----------------------------------------------------------

    def broadcast(self, value: Any = None) -> Any:
        """Rank 0's ``value``, on every rank (pickled, over the gloo group)."""
        if self.world == 1:
            return value
        import torch.distributed as dist

        box = [value if self.main else None]
        dist.broadcast_object_list(box, src=0, group=self.commands)  # pickled: between ranks of one trainer
        return box[0]


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's repeated blocks (``model.model.layers`` in every decoder transformers ships
    that burnish trains: Llama, Qwen2, Mistral, Gemma, SmolLM2...)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers to shard with FSDP2; use BURNISH_TRAINER_PARALLEL=ddp")
    return list(layers)
