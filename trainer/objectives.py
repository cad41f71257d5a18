"""The objectives beside GRPO: supervised fine-tuning and on-policy distillation, per token.

Pure functions of tensors, like trainer/grpo.py; the step (trainer/policy_model.py) adds
them up, each normalised by its own tokens (docs/objectives.md):

    loss = w_grpo * L_grpo + w_sft * L_sft + w_distill * L_distill

    L_sft     = -(1 / N_sft) * sum over demonstration tokens of  logp_t

    L_distill =  (1 / N_distill) * sum over taught tokens of  w_t * d_t * logp_t       (teacher.top_k 0)
              =  (1 / N_distill) * sum over taught positions of  w_t * KL_t       (top_k k: the forward
                 KL from the teacher's k likeliest tokens and its tail to the policy, trainer/logprobs.py)
                 d_t = stopgrad(logp_t - teacher_t)              log(pi / teacher) of the sampled token:
                                                                 the reverse KL's estimate at t
                 w_t = min(exp(stopgrad(logp_t) - behaviour_t), IMPORTANCE_CAP)
                                                                 the samples came from vLLM's version

On the policy's own samples (w = 1), the expectation of the gradient of ``L_distill`` over the
sampled token is the gradient of the per-position reverse KL, sum_y pi(y) (log pi(y) - log
teacher(y)): each token is pushed down by how much likelier the policy finds it than the
teacher does. This is on-policy distillation as Agarwal et al. ("On-Policy Distillation of
Language Models: Learning from Self-Generated Mistakes", GKD, 2024) define it with the
reverse KL, estimated on the sampled token alone as the Tinker cookbook does (Thinking
Machines, "On-Policy Distillation", 2025): a per-token advantage ``-d_t`` with no discount, so
the teacher is asked one forward pass per sample, never the full [positions x vocabulary]
distribution. tests/trainer/test_objectives.py checks the gradient against finite differences of the
exact KL on the tiny model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The importance weight's cap (truncated importance sampling): the value its authors used,
# and grpo.py's ``tis_cap`` suggestion. A token the trainer finds far likelier than vLLM did
# cannot dominate the step.
IMPORTANCE_CAP = 2.0


@dataclass
class Parts:
    loss: torch.Tensor  # this micro-batch's share of the objective (divided by the step's normaliser)
    total: torch.Tensor  # the figure reported, summed over the micro-batch's tokens: NLL (SFT), reverse KL (distill)
    tokens: torch.Tensor  # the micro-batch's tokens of this objective (a tensor: reading it would wait on the device)


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, normaliser: int) -> Parts:
    """The negative log-likelihood of the demonstration tokens (``mask`` 1), [batch, time]."""
    mask = mask.to(logprobs.dtype)
    nll = -(logprobs * mask).sum()
    return Parts(nll / max(normaliser, 1), nll.detach(), mask.sum())


def distill_loss(
    logprobs: torch.Tensor, behaviour: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, normaliser: int, top_kl: torch.Tensor | None = None
) -> Parts:
    """Per-token reverse KL to the teacher on the sampled tokens the teacher scored (``mask`` 1):
    ``teacher`` holds its logprobs of them, ``behaviour`` vLLM's when it sampled; [batch, time].

    With ``top_kl`` (the teacher's top k: trainer/logprobs.py ``top_forward_kl``, per position,
    differentiable), the loss is that forward KL at each taught position instead, weighted
    alike: the positions are the ones vLLM's samples visited."""
    mask = mask.to(logprobs.dtype)
    with torch.no_grad():
        weight = torch.exp(logprobs.detach() - behaviour).clamp(max=IMPORTANCE_CAP)
    if top_kl is not None:
        kl = top_kl * mask
        return Parts((weight * kl).sum() / max(normaliser, 1), kl.detach().sum(), mask.sum())
    with torch.no_grad():
        gap = (logprobs.detach() - teacher) * mask
    loss = (weight * gap * logprobs * mask).sum() / max(normaliser, 1)
    return Parts(loss, gap.sum(), mask.sum())
