"""GRPO's arithmetic: group-relative advantages and the clipped, token-level loss.

The advantages and credits are ``core/learning/credit.py``'s (the dashboard shows the same figures).
Everything here is a pure function of tensors, so it can be checked by hand
(tests/trainer/test_grpo.py). The loop that feeds it lives elsewhere in trainer/.

    advantage_i   = (r_i - mean(r)) / (std(r) + eps)        per group; std optional
    credit_i,t    = sum over calls k >= t of  gamma^(k-t) * c_i,k
                                                            c_i,k: the reward posted for call k of
                                                            trajectory i alone (0 if none)
    A_i,t         = advantage_i + credit_i,t                of every token call t sampled
    ratio_t       = exp(logp_t - logp_behaviour_t)          logp_behaviour: what vLLM recorded; for a call
                                                            sampled under a grammar, stopgrad(logp_t)
                                                            (trainer/sequences.py: Sequence.compared)
    loss_t        = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)
                    + kl_coef * k3_t,   k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
    loss          = sum over every sampled token in the batch / number of those tokens

With ``tis_cap`` set (truncated importance sampling), the trainer's own logprobs, detached,
take the behaviour's place in the ratio, and the gap to what vLLM sampled with becomes a
per-token weight, cut at the cap so that one token the trainer finds far likelier than
vLLM did cannot dominate the step:

    ratio_t       = exp(logp_t - stopgrad(logp_t))                   1, with the policy gradient
    w_t           = min(exp(stopgrad(logp_t) - logp_behaviour_t), tis_cap)
    loss_t        = -w_t * ratio_t * A  (+ the KL term)

Whatever the mode, the step reports how far the trainer is from vLLM on the sampled tokens
(``logprob_diff``: mean |logp_t - logp_behaviour_t|; ``outside_clip``: the share whose ratio
to vLLM is outside the clip range; ``mismatch_kl``: KL(behaviour || trainer), estimated on the
tokens vLLM sampled with k3, which is never negative and unbiased:

    r_t           = exp(logp_t - logp_behaviour_t)
    mismatch_kl   = mean over sampled tokens of  r_t - 1 - log r_t

All three grow with staleness (the policy moved since it sampled) and with any mismatch
between the two engines' numerics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from burnish_server.core.learning import credit
from burnish_server.core.learning.policies import TrainSettings


def group_advantages(rewards: torch.Tensor, *, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """``core/learning/credit.py: group_advantages`` on a tensor (the rule lives there, shared with the dashboard)."""
    return torch.tensor(credit.group_advantages(rewards.tolist(), scale=scale, eps=eps), dtype=torch.float32)


@dataclass
class LossParts:
    """The loss and its figures, every one a tensor on the loss's device: the step reads them
    back once, at its end, never between a forward and a backward (on a GPU each read waits for
    the device to finish everything queued)."""

    loss: torch.Tensor  # the scalar to backpropagate
    policy_loss: torch.Tensor
    kl: torch.Tensor  # mean k3 over sampled tokens (0 if no reference)
    clip_fraction: torch.Tensor  # share of sampled tokens whose ratio was clipped
    tokens: torch.Tensor  # the sampled tokens (``mask``'s sum)
    # Sums over sampled tokens (divide by ``tokens``): |logp - behaviour|, ratio to the
    # behaviour outside the clip range, TIS weight at its cap, KL(behaviour || trainer)'s k3.
    logprob_diff: torch.Tensor
    outside_clip: torch.Tensor
    tis_capped: torch.Tensor
    mismatch_kl: torch.Tensor


@dataclass
class Gap:
    """How far the trainer is from vLLM on some tokens, as sums over them (tensors): |logp -
    behaviour|, the tokens whose ratio to the behaviour is outside the clip range, and the k3
    estimate of KL(behaviour || trainer)."""

    logprob_diff: torch.Tensor
    outside_clip: torch.Tensor
    mismatch_kl: torch.Tensor
    ratio: torch.Tensor  # per token: exp(logp - behaviour), no gradient (TIS weighs by it)


def behaviour_gap(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, settings: TrainSettings) -> Gap:
    """The trainer against vLLM on the ``mask``ed tokens (module docstring). No gradient."""
    with torch.no_grad():
        mask = mask.to(logprobs.dtype)
        gap = logprobs.detach() - behaviour_logprobs
        ratio = torch.exp(gap)
        outside = ((ratio < 1 - settings.clip_eps_low) | (ratio > 1 + settings.clip_eps_high)).to(mask.dtype)
        return Gap((gap.abs() * mask).sum(), (outside * mask).sum(), ((ratio - 1 - gap) * mask).sum(), ratio)


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: TrainSettings,
    reference_logprobs: torch.Tensor | None = None,
    normaliser: int | None = None,
) -> LossParts:
    """Token-level GRPO loss.

    All tensors are [batch, time]; ``advantages`` may be [batch] (one per sequence).
    ``mask`` is 1 on sampled tokens (the only ones trained on), 0 on prompt and padding.
    ``normaliser`` is the number of sampled tokens in the whole step, when a step is split
    into micro-batches; by default, this batch's. From ``settings`` it uses the clip range
    (``clip_eps_low``, ``clip_eps_high``) and ``kl_coef``.
    """
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    low, high = 1 - settings.clip_eps_low, 1 + settings.clip_eps_high
    gap = behaviour_gap(logprobs, behaviour_logprobs, mask, settings)
    to_behaviour = gap.ratio
    tis_capped = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if settings.tis_cap is None:
        ratio = torch.exp(logprobs - behaviour_logprobs)
        clipped = ratio.clamp(low, high)
        per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    else:
        ratio = torch.exp(logprobs - logprobs.detach())
        weight = to_behaviour.clamp(max=settings.tis_cap)
        tis_capped = ((to_behaviour > settings.tis_cap).to(mask.dtype) * mask).sum()
        per_token = -weight * ratio * advantages
    tokens = mask.sum()
    n = max(normaliser, 1) if normaliser is not None else tokens.clamp(min=1)
    policy_loss = (per_token * mask).sum() / n
    kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if reference_logprobs is not None and settings.kl_coef > 0:
        delta = reference_logprobs - logprobs
        k3 = torch.exp(delta) - delta - 1
        kl = (k3 * mask).sum() / n
    with torch.no_grad():
        # Under TIS the ratio is 1 and nothing is clipped: the weight does the correcting.
        was_clipped = ((ratio < low) | (ratio > high)).to(mask.dtype)
        clip_fraction = (was_clipped * mask).sum() / tokens.clamp(min=1)
    return LossParts(
        policy_loss + settings.kl_coef * kl,
        policy_loss.detach(),
        kl.detach(),
        clip_fraction,
        tokens,
        gap.logprob_diff,
        gap.outside_clip,
        tis_capped,
        gap.mismatch_kl,
    )
