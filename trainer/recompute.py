"""Selective activation checkpointing: which of a decoder layer's results the backward pass keeps.

Without checkpointing, autograd keeps every tensor a layer's backward reads: its matmuls'
inputs and outputs, and as many again from the cheap work between them (the norms' fp32
copies, rotary's halves, the MLP's SiLU and its product, 3 x 8,960 numbers a token in a 1.5B
Qwen2's MLP alone). Full checkpointing (``Holding.checkpointing`` "on") keeps only each layer's
input and runs the whole layer again in backward: a third more compute. "selective" keeps what
the layer's matmuls and attention kernel made and recomputes only the rest, which is cheap:
elementwise work, and LoRA's second factor, whose inner dimension is the rank (a matmul that
narrow costs about what an elementwise op does, for as much memory as the base layer's output).

This is torch's selective checkpointing (``torch.utils.checkpoint.create_selective_checkpoint_contexts``,
as torchtitan uses it), handed to transformers' checkpointing of each decoder layer
(``gradient_checkpointing_kwargs``): the policy below sees every operation the layer runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# A matmul whose inner dimension is at most this is recomputed: LoRA's B, whose inner dimension
# is the rank (8-64 in practice). A larger rank's B is kept, like the base's matmuls (no model's
# hidden size is this small).
NARROW = 64


def _ops(*names: str) -> set[Any]:
    """The operations of these names that this torch (and its extensions: FlashAttention) has."""
    found = set()
    for name in names:
        namespace, _, op = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op, None) if hasattr(torch.ops, namespace) else None
        if packet is not None:
            found.add(packet.default)
    return found


_MATMULS = _ops("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")
_ATTENTION = _ops(
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "flash_attn._flash_attn_forward",
    "flash_attn._flash_attn_varlen_forward",
)


def _keep(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op in _ATTENTION:
        return CheckpointPolicy.MUST_SAVE
    if op in _MATMULS:
        left = args[1] if op in (torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default) else args[0]
        return CheckpointPolicy.MUST_SAVE if left.shape[-1] > NARROW else CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective() -> Any:
    """``torch.utils.checkpoint.checkpoint``'s ``context_fn``: keep the matmuls' and attention's results."""
    return create_selective_checkpoint_contexts(_keep)
