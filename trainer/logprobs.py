"""The log-probability of each sampled token, from the last hidden states and the LM head, a chunk
of positions at a time: the step's [positions x vocabulary] logits never exist whole.

For one position with hidden state ``h``, LM head ``W`` ([vocabulary, hidden]) and sampled token
``y``:

    z        = W h                                   the logits; with the model's own scale s and
                                                     soft cap c, z = c * tanh(s W h / c)
    logp     = z[y] - logsumexp(z)
    d logp / d h = W^T (onehot(y) - softmax(z)) * dz/d(Wh)

The last line is a fixed vector per position: whatever the loss, the gradient that reaches ``h``
is that vector times the loss's gradient with respect to ``logp``, one number per position. So
the forward pass computes it chunk by chunk, right after the chunk's logits (as Liger-Kernel's
fused linear cross-entropy computes its input's gradient in the forward pass), keeps it
([positions x hidden], the size of the hidden states), and lets the chunk's logits go; the
backward pass only scales it. Nothing is recomputed: the arithmetic is the full-logits path's
(one [chunk x hidden] x [hidden x vocabulary] product forward, one back), in pieces of at most
``CHUNK_ELEMENTS`` logits. TRL's chunked LM head recomputes each chunk's logits in the backward
pass instead, which costs a third product.

The head runs in its weight's dtype (bf16 on a GPU) and everything after it in fp32, as the
model's ``.logits.float()`` did; the product for the gradient takes ``onehot - softmax`` in the
head's dtype, as autograd did through the full logits. The LM head is frozen (LoRA never adapts
it here): no gradient reaches ``W``. A position's entropy (a health figure, no gradient) comes
from the same chunk: ``logsumexp(z) - sum(softmax(z) * z)``.
"""

from __future__ import annotations

from typing import Any

import torch

# Logits per chunk: 2^25 fp32 numbers = 128 MiB (220 positions of a 152k vocabulary, 682 of
# SmolLM2's 49k). A chunk holds two such tensors at once (the logits, then their exponentials).
CHUNK_ELEMENTS = 1 << 25


def chunk_rows(vocabulary: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocabulary)


class _SampledLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, scale: float, softcap: float | None, entropy: bool) -> Any:
        n = hidden.shape[0]
        grad = bool(ctx.needs_input_grad[0])
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        spread = torch.empty(n, dtype=torch.float32, device=hidden.device) if entropy else None
        kept = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if grad else None
        rows = chunk_rows(weight.shape[0])
        for start in range(0, n, rows):
            end = min(start + rows, n)
            h, y = hidden[start:end].to(weight.dtype), targets[start:end, None]
            # Two [chunk x vocabulary] tensors at most (the logits, then their exponentials),
            # everything else in place: on the CPU each fresh one costs more than its arithmetic.
            z = (h @ weight.T).float()
            if scale != 1.0:
                z.mul_(scale)
            capped = None
            if softcap is not None:
                z.div_(softcap).tanh_()
                capped = 1 - z**2 if kept is not None else None  # d tanh = 1 - tanh^2
                z.mul_(softcap)
            # Shifted by the row's largest logit: every figure below is the same for z and z - m.
            z.sub_(z.amax(-1, keepdim=True))
            p = z.exp()
            total = p.sum(-1)
            lse = total.log()
            logp[start:end] = z.gather(-1, y).squeeze(-1) - lse
            if not (grad or entropy):
                continue
            p.div_(total[:, None])  # softmax
            if spread is not None:
                spread[start:end] = lse - torch.linalg.vecdot(p, z)
            if kept is None:
                continue
            p.scatter_add_(-1, y, torch.full(y.shape, -1.0, device=p.device))  # softmax - onehot(y) = -d logp / dz
            if capped is not None:
                p.mul_(capped)
            if scale != 1.0:
                p.mul_(scale)
            kept[start:end] = (p.to(weight.dtype) @ weight).neg_().to(kept.dtype)
        ctx.save_for_backward(kept)
        if spread is None:
            return logp
        ctx.mark_non_differentiable(spread)
        return logp, spread

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, *_: Any) -> Any:
        (kept,) = ctx.saved_tensors
        grad = None
        if ctx.needs_input_grad[0]:
            grad = (kept.float() * grad_logp[:, None]).to(kept.dtype)
        return grad, None, None, None, None, None


def sampled_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, scale: float = 1.0, softcap: float | None = None, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(z)[target]`` per row of ``hidden`` ([N, hidden]; ``targets`` [N]), where ``z``
    is the row's logits under LM head ``weight`` ([vocabulary, hidden]), ``scale`` and ``softcap``
    as above; and, with ``entropy``, each row's entropy (no gradient). Differentiable in
    ``hidden``; ``weight`` must be frozen."""
    if weight.requires_grad and torch.is_grad_enabled():
        raise ValueError("sampled_logprobs takes no gradient to the LM head: its weight must be frozen")
    if entropy:
        logp, spread = _SampledLogprobs.apply(hidden, weight, targets, scale, softcap, True)
        return logp, spread
    return _SampledLogprobs.apply(hidden, weight, targets, scale, softcap, False), None


# ---- distillation beyond the sampled token ---------------------------------------------------
#
# The teacher's top k tokens at a position, with the rest of its mass as one "tail" bucket, and
# the forward KL from it to the policy over those k + 1 outcomes (ART's top-k distillation; the
# full forward KL when k covers the vocabulary):
#
#     KL_t = sum over y in K   q(y) (log q(y) - log p(y))   +   q_tail (log q_tail - log p_tail)
#            q: the teacher's, p: the policy's;  q_tail = 1 - sum_K q,  p_tail = 1 - sum_K p
#
# Its gradient in the logits z is a fixed vector per position, as logp's is above:
#
#     d KL_t / d z = -sum_K q(y) (onehot(y) - p)  -  q_tail / p_tail * d p_tail / d z
#     d p_tail / d z_j = -(p_j [j in K] - S p_j),   S = sum_K p
#
# so the same trick holds: computed with the chunk's logits, kept, scaled in the backward.

TAIL_FLOOR = 1e-6  # a tail's probability is never taken below this (its log would be -inf)


@torch.no_grad()
def top_logprobs(hidden: torch.Tensor, weight: torch.Tensor, k: int, *, scale: float = 1.0, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` likeliest tokens of each row's distribution and their logprobs ([N, k] each),
    a chunk of rows at a time: the teacher's side of top-k distillation."""
    n = hidden.shape[0]
    ids = torch.empty((n, k), dtype=torch.int64, device=hidden.device)
    logprobs = torch.empty((n, k), dtype=torch.float32, device=hidden.device)
    for start in range(0, n, chunk_rows(weight.shape[0])):
        end = min(start + chunk_rows(weight.shape[0]), n)
        z = _logits(hidden[start:end], weight, scale, softcap)
        z = z.log_softmax(-1)
        logprobs[start:end], ids[start:end] = z.topk(k, dim=-1)
    return ids, logprobs


def _logits(hidden: torch.Tensor, weight: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    z = (hidden.to(weight.dtype) @ weight.T).float()
    if scale != 1.0:
        z.mul_(scale)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return z


class _TopForwardKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, teacher: torch.Tensor, scale: float, softcap: float | None) -> Any:
        n = hidden.shape[0]
        kl = torch.empty(n, dtype=torch.float32, device=hidden.device)
        kept = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if ctx.needs_input_grad[0] else None
        q = teacher.exp()
        q_tail = (1 - q.sum(-1)).clamp(min=TAIL_FLOOR)
        for start in range(0, n, chunk_rows(weight.shape[0])):
            end = min(start + chunk_rows(weight.shape[0]), n)
            z = (hidden[start:end].to(weight.dtype) @ weight.T).float()
            if scale != 1.0:
                z.mul_(scale)
            capped = None
            if softcap is not None:
                z.div_(softcap).tanh_()
                capped = 1 - z**2
                z.mul_(softcap)
            p = z.sub_(z.amax(-1, keepdim=True)).softmax(-1)
            y, qk, qt = ids[start:end], q[start:end], q_tail[start:end]
            pk = p.gather(-1, y)
            s = pk.sum(-1)
            p_tail = (1 - s).clamp(min=TAIL_FLOOR)
            logp = pk.clamp(min=1e-30).log()
            kl[start:end] = (qk * (teacher[start:end] - logp)).sum(-1) + qt * (qt.log() - p_tail.log())
            if kept is None:
                continue
            # d KL / d z = -sum_K q (onehot - p) + (q_tail / p_tail) (p [in K] - S p), in place on p
            ratio = qt / p_tail
            g = p * (qk.sum(-1) - ratio * s)[:, None]
            g.scatter_add_(-1, y, -qk + ratio[:, None] * pk)
            if capped is not None:
                g.mul_(capped)
            if scale != 1.0:
                g.mul_(scale)
            kept[start:end] = (g.to(weight.dtype) @ weight).to(kept.dtype)
        ctx.save_for_backward(kept)
        return kl

    @staticmethod
    def backward(ctx: Any, grad_kl: torch.Tensor) -> Any:
        (kept,) = ctx.saved_tensors
        grad = (kept.float() * grad_kl[:, None]).to(kept.dtype) if ctx.needs_input_grad[0] else None
        return grad, None, None, None, None, None


def top_forward_kl(
    hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, teacher: torch.Tensor, *, scale: float = 1.0, softcap: float | None = None
) -> torch.Tensor:
    """Per row of ``hidden`` ([N, hidden]), the forward KL from the teacher's top-k distribution
    (``ids`` and their logprobs ``teacher``, [N, k]) with its tail bucket to the policy's,
    differentiable in ``hidden``; ``weight`` must be frozen."""
    if weight.requires_grad and torch.is_grad_enabled():
        raise ValueError("top_forward_kl takes no gradient to the LM head: its weight must be frozen")
    return _TopForwardKL.apply(hidden, weight, ids, teacher, scale, softcap)
