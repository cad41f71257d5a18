"""GRPO's advantages and loss against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from burnish_server.core.learning.policies import TrainSettings
from burnish_server.trainer.grpo import group_advantages, grpo_loss


def test_advantages_are_centred_and_scaled_by_the_sample_std() -> None:
    # rewards 0, 1, 2, 3: mean 1.5; sample std = sqrt(((1.5^2)*2 + (0.5^2)*2) / 3) = sqrt(5/3)
    adv = group_advantages(torch.tensor([0.0, 1.0, 2.0, 3.0]), eps=0.0)
    std = math.sqrt(5 / 3)
    assert adv.tolist() == pytest.approx([-1.5 / std, -0.5 / std, 0.5 / std, 1.5 / std])
    assert group_advantages(torch.tensor([0.0, 1.0, 2.0, 3.0]), scale=False).tolist() == [-1.5, -0.5, 0.5, 1.5]


def test_equal_rewards_teach_nothing() -> None:
    assert group_advantages(torch.tensor([0.7, 0.7, 0.7])).tolist() == [0.0, 0.0, 0.0]


def test_loss_on_policy_is_minus_the_mean_advantage_per_token() -> None:
    # Same logprobs as the behaviour policy: ratio 1 everywhere, loss = -sum(A * mask) / tokens.
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.2, 0.2, 0.2]]))
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])  # 4 sampled tokens
    adv = torch.tensor([2.0, -1.0])
    parts = grpo_loss(logp, logp.clone(), adv, mask, TrainSettings())
    assert parts.loss.item() == pytest.approx(-(2 * 2 + (-1) * 2) / 4)
    assert parts.tokens.item() == 4 and parts.clip_fraction.item() == 0.0


def test_ratio_is_clipped_asymmetrically() -> None:
    settings = TrainSettings(clip_eps_low=0.2, clip_eps_high=0.28)
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    # ratios 2.0, 0.5, 1.1, 0.9 on one sequence
    logp = behaviour + torch.log(torch.tensor([[2.0, 0.5, 1.1, 0.9]]))
    mask = torch.ones(1, 4)
    # A > 0: min(r*A, clip(r)*A) -> 1.28, 0.5, 1.1, 0.9 (the low clip does not bind on the min for A>0)
    pos = grpo_loss(logp, behaviour, torch.tensor([1.0]), mask, settings)
    assert pos.loss.item() == pytest.approx(-(1.28 + 0.5 + 1.1 + 0.9) / 4)
    # A < 0: min(-r, -clip(r)) -> -2.0, -0.8, -1.1, -0.9
    neg = grpo_loss(logp, behaviour, torch.tensor([-1.0]), mask, settings)
    assert neg.loss.item() == pytest.approx((2.0 + 0.8 + 1.1 + 0.9) / 4)
    assert pos.clip_fraction.item() == pytest.approx(0.5)


def test_kl_term_is_k3_against_the_reference() -> None:
    settings = TrainSettings(kl_coef=0.1)
    logp = torch.log(torch.tensor([[0.5, 0.4]]))
    ref = torch.log(torch.tensor([[0.25, 0.4]]))
    mask = torch.ones(1, 2)
    parts = grpo_loss(logp, logp.clone(), torch.tensor([0.0]), mask, settings, reference_logprobs=ref)
    delta = math.log(0.25 / 0.5)
    k3 = math.exp(delta) - delta - 1  # second token: delta 0, k3 0
    assert parts.kl.item() == pytest.approx(k3 / 2)
    assert parts.loss.item() == pytest.approx(0.1 * k3 / 2)


def test_gradient_pushes_up_the_advantaged_tokens() -> None:
    logits = torch.zeros(1, 3, requires_grad=True)
    logp = torch.log_softmax(logits, dim=-1)  # three tokens, logprob of each as a "sequence"
    behaviour = logp.detach().clone()
    grpo_loss(logp, behaviour, torch.tensor([1.0]), torch.tensor([[1, 0, 0]]), TrainSettings()).loss.backward()
    assert logits.grad[0, 0] < 0  # gradient descent raises token 0's logit


def test_micro_batches_normalised_by_the_step_total_add_up_to_the_whole() -> None:
    torch.manual_seed(0)
    logp, behaviour = torch.randn(4, 5), torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).int()
    adv = torch.randn(4)
    whole = grpo_loss(logp, behaviour, adv, mask, TrainSettings()).loss
    total = int(mask.sum())
    halves = sum(grpo_loss(logp[i : i + 2], behaviour[i : i + 2], adv[i : i + 2], mask[i : i + 2], TrainSettings(), normaliser=total).loss for i in (0, 2))
    assert halves.item() == pytest.approx(whole.item(), rel=1e-6)


def test_the_step_reports_how_far_the_trainer_is_from_what_vllm_recorded() -> None:
    settings = TrainSettings(clip_eps_low=0.2, clip_eps_high=0.28)
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    logp = behaviour + torch.log(torch.tensor([[2.0, 0.5, 1.1, 0.9]]))  # ratios to vLLM
    mask = torch.tensor([[1, 1, 1, 0]])
    parts = grpo_loss(logp, behaviour, torch.tensor([1.0]), mask, settings)
    # sums over the three sampled tokens: |log 2| + |log 0.5| + |log 1.1|; 2.0 and 0.5 lie outside [0.8, 1.28]
    assert parts.logprob_diff.item() == pytest.approx(2 * math.log(2) + math.log(1.1), rel=1e-5)
    assert parts.outside_clip.item() == 2 and parts.tis_capped.item() == 0
    # KL(vLLM || trainer) by k3, r - 1 - log r, summed over the same tokens: never negative, 0 only where r = 1
    k3 = sum(r - 1 - math.log(r) for r in (2.0, 0.5, 1.1))
    assert parts.mismatch_kl.item() == pytest.approx(k3, rel=1e-5)
    fresh = grpo_loss(behaviour.clone(), behaviour, torch.tensor([1.0]), mask, settings)
    assert fresh.mismatch_kl.item() == 0 and fresh.logprob_diff.item() == 0


def test_truncated_importance_sampling_weighs_each_token_by_its_capped_ratio() -> None:
    settings = TrainSettings(tis_cap=1.5)
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    logp = (behaviour + torch.log(torch.tensor([[2.0, 0.5, 1.1]]))).requires_grad_()
    mask = torch.ones(1, 3)
    parts = grpo_loss(logp, behaviour, torch.tensor([1.0]), mask, settings)
    # ratio to itself is 1: loss = -mean(w * A) with w = min(r, 1.5) = 1.5, 0.5, 1.1; nothing clipped
    assert parts.loss.item() == pytest.approx(-(1.5 + 0.5 + 1.1) / 3, rel=1e-5)
    assert parts.clip_fraction.item() == 0 and parts.tis_capped.item() == 1
    parts.loss.backward()
    # d loss / d logp_t = -w_t * A / tokens: the gradient flows through every token, weighted
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([-1.5 / 3, -0.5 / 3, -1.1 / 3], rel=1e-5)


def test_turn_credits_are_discounted_sums_of_the_call_rewards_at_and_after_each_call() -> None:
    from burnish_server.core.learning.credit import turn_credits

    assert turn_credits([None, None, None], 0.9) == [0.0, 0.0, 0.0]
    assert turn_credits([1.0, None, 2.0], 1.0) == [3.0, 2.0, 2.0]
    assert turn_credits([1.0, None, 2.0], 0.5) == [1.5, 1.0, 2.0]
    assert turn_credits([None, -1.0], 0.0) == [0.0, -1.0]
    assert turn_credits([], 1.0) == []


def stale_call() -> tuple[torch.Tensor, torch.Tensor]:
    """A call's four sampled tokens: the logprobs vLLM recorded when a version with even odds on
    six tokens sampled them, and the trainer's now, steps later, when token 3 is far likelier."""
    sampled_by = torch.zeros(6)
    now = sampled_by.clone()
    now[3] += 2.0
    tokens = torch.tensor([[3, 3, 1, 0]])
    return torch.log_softmax(sampled_by, -1)[tokens], torch.log_softmax(now, -1)[tokens].requires_grad_()


def test_a_stale_calls_tokens_are_weighed_by_their_capped_ratio_and_a_fresh_calls_by_one() -> None:
    """Under TIS (cap 2, as verl, slime and SkyRL default to), a call sampled by a version three
    steps old: the tokens the policy has since come to like much more are capped at 2, those it
    likes less keep their ratio; a call the policy just sampled weighs every token 1."""
    settings = TrainSettings(tis_cap=2.0)
    behaviour, logp = stale_call()
    parts = grpo_loss(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 4), settings)
    ratios = torch.exp(logp.detach() - behaviour)[0].tolist()
    assert ratios[0] == pytest.approx(6 * math.e**2 / (math.e**2 + 5), rel=1e-5) and ratios[0] > 2 and ratios[2] < 1
    assert parts.tis_capped.item() == 2 and parts.mismatch_kl.item() > 0.5
    parts.loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([-2.0 / 4, -2.0 / 4, -ratios[2] / 4, -ratios[3] / 4], rel=1e-5)

    fresh = logp.detach().clone().requires_grad_()
    on_policy = grpo_loss(fresh, fresh.detach(), torch.tensor([1.0]), torch.ones(1, 4), settings)
    on_policy.loss.backward()
    assert on_policy.tis_capped.item() == 0 and on_policy.mismatch_kl.item() == 0
    assert fresh.grad is not None and fresh.grad.tolist()[0] == pytest.approx([-1 / 4] * 4)


def test_by_default_a_stale_calls_tokens_past_the_clip_range_carry_no_gradient() -> None:
    """The default correction (the clipped ratio against vLLM's recorded logprobs): the same call
    sampled three steps ago as above. With a positive advantage, the tokens the policy has since
    come to like past 1 + clip_eps_high contribute nothing; the rest their ratio, those it likes
    less too (the clip binds only on the side the advantage pushes towards)."""
    settings = TrainSettings()
    assert settings.tis_cap is None
    behaviour, logp = stale_call()
    parts = grpo_loss(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 4), settings)
    ratios = torch.exp(logp.detach() - behaviour)[0].tolist()
    assert ratios[0] > 1 + settings.clip_eps_high and ratios[2] < 1 - settings.clip_eps_low  # outside on both sides
    assert parts.clip_fraction.item() == 1 and parts.tis_capped.item() == 0  # all four lie outside the range
    parts.loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, -ratios[2] / 4, -ratios[3] / 4], rel=1e-5)
