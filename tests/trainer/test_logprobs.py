"""trainer/logprobs.py: the sampled tokens' logprobs a chunk of positions at a time equal the full
logits' (values, entropy and the gradient with respect to the hidden states), and no tensor of
[positions x vocabulary] exists in the forward or the backward pass beyond one chunk."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from burnish_server.trainer import logprobs
from burnish_server.trainer.logprobs import sampled_logprobs

N, HIDDEN, VOCAB = 37, 48, 1000


def full(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, scale: float = 1.0, softcap: float | None = None):
    """The way the step took them before: whole logits, log_softmax, gather."""
    z = (hidden @ weight.T).float() * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    logp = z.log_softmax(-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), torch.distributions.Categorical(logits=z).entropy()


def inputs(dtype: torch.dtype = torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(N, HIDDEN, generator=generator) * 2).to(dtype)
    weight = (torch.randn(VOCAB, HIDDEN, generator=generator) / HIDDEN**0.5).to(dtype)
    targets = torch.randint(0, VOCAB, (N,), generator=generator)
    targets[:5] = (hidden[:5].float() @ weight.float().T).argmax(-1)  # a few likely tokens: softmax near 1 there
    upstream = torch.randn(N, generator=generator)  # d loss / d logp, per position
    return hidden, weight, targets, upstream


@pytest.mark.parametrize("rows", [1, 4, 64])  # one position a chunk, several chunks (the last short), one chunk
@pytest.mark.parametrize("shape", [(1.0, None), (0.5, 3.0)])  # plain; scaled and soft-capped (Granite, Gemma)
def test_chunked_equals_full_logits_in_fp32(monkeypatch: pytest.MonkeyPatch, rows: int, shape: tuple[float, float | None]) -> None:
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", rows * VOCAB)
    scale, softcap = shape
    hidden, weight, targets, upstream = inputs()
    mine, theirs = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    got, spread = sampled_logprobs(mine, weight, targets, scale=scale, softcap=softcap, entropy=True)
    expected, entropy = full(theirs, weight, targets, scale, softcap)
    (got * upstream).sum().backward()
    (expected * upstream).sum().backward()
    assert spread is not None and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(spread, entropy, atol=1e-5, rtol=1e-5)
    assert mine.grad is not None and theirs.grad is not None
    torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)


def test_chunked_equals_full_logits_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 head (a GPU's): both ways multiply in bf16 and take softmax in fp32. The logprobs
    agree to fp32 rounding; the gradients to bf16's (the full path rounds g * (onehot - p), this
    one onehot - p, before the same bf16 product)."""
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 8 * VOCAB)
    hidden, weight, targets, upstream = inputs(torch.bfloat16)
    mine, theirs = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    got, _ = sampled_logprobs(mine, weight, targets)
    expected, _ = full(theirs, weight, targets)
    (got * upstream).sum().backward()
    (expected * upstream).sum().backward()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert mine.grad is not None and theirs.grad is not None and mine.grad.dtype == torch.bfloat16
    torch.testing.assert_close(mine.grad.float(), theirs.grad.float(), atol=2e-2, rtol=2e-2)


def test_no_gradient_asked_none_kept() -> None:
    hidden, weight, targets, _ = inputs()
    with torch.no_grad():
        got, spread = sampled_logprobs(hidden, weight, targets)
    assert spread is None and not got.requires_grad
    torch.testing.assert_close(got, full(hidden, weight, targets)[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="frozen"):
        sampled_logprobs(hidden.requires_grad_(), weight.requires_grad_(), targets)


class LargestWithVocabulary(TorchDispatchMode):
    """The most elements of any tensor an operation makes with a dimension of the vocabulary's
    size (views of an input, the head's weight transposed for one, left out)."""

    def __init__(self, vocabulary: int) -> None:
        super().__init__()
        self.vocabulary, self.largest = vocabulary, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and self.vocabulary in tensor.shape and tensor.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, tensor.numel())
        return out


def test_no_positions_by_vocabulary_tensor_beyond_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 4 * VOCAB)
    hidden, weight, targets, upstream = inputs()
    hidden.requires_grad_()
    with LargestWithVocabulary(VOCAB) as watch:
        got, _ = sampled_logprobs(hidden, weight, targets, entropy=True)
        (got * upstream).sum().backward()
    assert 0 < watch.largest <= 4 * VOCAB  # a chunk's; whole, it would be N x VOCAB
    with LargestWithVocabulary(VOCAB) as whole:
        expected, _ = full(hidden, weight, targets)
        (expected * upstream).sum().backward()
    assert whole.largest >= N * VOCAB  # the check sees the full path's logits


# ---- top-k distillation: the teacher's top k with a tail bucket, the forward KL to the policy --


def full_top_kl(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, teacher: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """The same KL through whole logits and autograd: the teacher's k outcomes and its tail
    against the policy's."""
    z = (hidden @ weight.T).float() * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    logp = z.log_softmax(-1).gather(-1, ids)
    q = teacher.exp()
    q_tail, p_tail = (1 - q.sum(-1)).clamp(min=1e-6), (1 - logp.exp().sum(-1)).clamp(min=1e-6)
    return (q * (teacher - logp)).sum(-1) + q_tail * (q_tail.log() - p_tail.log())


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("shape", [(1.0, None), (0.5, 3.0)])
def test_top_k_forward_kl_equals_full_logits(monkeypatch: pytest.MonkeyPatch, rows: int, shape: tuple[float, float | None]) -> None:
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", rows * VOCAB)
    scale, softcap = shape
    hidden, weight, _, upstream = inputs()
    # The teacher: another head on the same states, its top 8 (a few positions nearly certain).
    teacher_weight = weight + torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)) / HIDDEN**0.5
    ids, teacher = logprobs.top_logprobs(hidden * torch.linspace(0.5, 6, N)[:, None], teacher_weight, 8, scale=scale, softcap=softcap)
    expected_ids = (hidden * torch.linspace(0.5, 6, N)[:, None]) @ teacher_weight.T * scale
    if softcap is not None:
        expected_ids = softcap * torch.tanh(expected_ids / softcap)
    torch.testing.assert_close(teacher, expected_ids.log_softmax(-1).topk(8).values, atol=1e-5, rtol=1e-5)
    mine, theirs = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    got = logprobs.top_forward_kl(mine, weight, ids, teacher, scale=scale, softcap=softcap)
    expected = full_top_kl(theirs, weight, ids, teacher, scale, softcap)
    (got * upstream).sum().backward()
    (expected * upstream).sum().backward()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert mine.grad is not None and theirs.grad is not None
    torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)
    assert (got >= -1e-6).all()  # a KL


def test_top_k_forward_kl_is_zero_where_the_policy_is_the_teacher() -> None:
    hidden, weight, _, _ = inputs()
    ids, teacher = logprobs.top_logprobs(hidden, weight, 16)
    mine = hidden.clone().requires_grad_()
    kl = logprobs.top_forward_kl(mine, weight, ids, teacher)
    kl.sum().backward()
    assert mine.grad is not None
    torch.testing.assert_close(kl, torch.zeros(N), atol=1e-5, rtol=0)
    torch.testing.assert_close(mine.grad, torch.zeros_like(hidden), atol=1e-4, rtol=0)
