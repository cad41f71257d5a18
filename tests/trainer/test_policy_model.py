"""The trainer's model step on the tiny model, offline (transformers' generate, no vLLM):
reward rises, and a checkpoint resumes exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from burnish_server.core.learning.policies import LoraSettings, TrainSettings
from burnish_server.trainer.grpo import group_advantages
from burnish_server.trainer.policy_model import PolicyModel
from burnish_server.trainer.sequences import Sequence

STEPS, GROUPS, GROUP_SIZE = 40, 2, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("m") / "tiny"
    subprocess.run([sys.executable, "-m", "burnish_server.cli", "tiny-model", str(path)], check=True, capture_output=True, timeout=300)
    return path


def digit_share(model: PolicyModel, ids: list[int]) -> float:
    text = model.tokenizer.decode(ids, skip_special_tokens=True)
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def rollout(model: PolicyModel, prompt: list[int]) -> tuple[list[tuple[Sequence, float]], list[float]]:
    items, rewards = [], []
    for _ in range(GROUPS):
        model.model.eval()
        with torch.no_grad():
            out = model.model.generate(torch.tensor([prompt] * GROUP_SIZE), do_sample=True, max_new_tokens=16, pad_token_id=model.pad_id)
        completions = [o[len(prompt) :].tolist() for o in out]
        r = [digit_share(model, c) for c in completions]
        rewards += r
        for c, a in zip(completions, group_advantages(torch.tensor(r)).tolist()):
            seq = Sequence()
            seq.add(prompt, c, None)
            items.append((seq, a))
    return items, rewards


def prompt_ids(model: PolicyModel) -> list[int]:
    text = model.tokenizer.apply_chat_template([{"role": "user", "content": "Write some digits."}], add_generation_prompt=True, tokenize=False)
    return model.tokenizer.encode(text, add_special_tokens=False)


def test_reward_rises_on_the_digit_task(tiny: Path) -> None:
    torch.manual_seed(0)
    model = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3))
    prompt = prompt_ids(model)
    means = []
    for _ in range(STEPS):
        items, rewards = rollout(model, prompt)
        model.step(items)
        means.append(sum(rewards) / len(rewards))
    first, last = sum(means[:8]) / 8, sum(means[-8:]) / 8
    # Measured over seeds 0-3: first ~0.07-0.1, last ~0.55-0.65.
    assert first < 0.2 and last > first + 0.25, means


def test_checkpoint_resumes_exactly(tiny: Path, tmp_path: Path) -> None:
    torch.manual_seed(1)
    settings = TrainSettings(learning_rate=5e-3)
    model = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), settings)
    prompt = prompt_ids(model)
    batches = [rollout(model, prompt)[0] for _ in range(3)]
    before = model.distance_from_base()
    health = model.step(batches[0])
    assert before == 0 < (health.distance_from_base or 0) and (health.entropy or 0) > 0  # LoRA's B starts at 0
    assert health.distance_from_base == pytest.approx(delta_norm(model), rel=1e-4)
    model.save(tmp_path / "ckpt")
    model.step(batches[1])
    expected = model.step(batches[2])

    resumed = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), settings)
    resumed.load(tmp_path / "ckpt")
    assert resumed.step_count == 1
    resumed.step(batches[1])
    got = resumed.step(batches[2])
    assert got.grad_norm == pytest.approx(expected.grad_norm, rel=1e-4)
    for (name, a), b in zip(model.model.named_parameters(), resumed.model.parameters()):
        if a.requires_grad:
            assert torch.allclose(a, b, atol=1e-6), name


@torch.no_grad()
def delta_norm(model: PolicyModel) -> float:
    """||delta W|| / ||W|| over the adapted layers, the slow way: peft's merged weights."""
    moved = base = 0.0
    for module in model.model.modules():
        if hasattr(module, "get_delta_weight") and model.adapter in getattr(module, "lora_A", {}):
            moved += float(module.get_delta_weight(model.adapter).pow(2).sum())
            base += float(module.base_layer.weight.pow(2).sum())
    return (moved / base) ** 0.5


def test_logprobs_only_where_sampled_match_the_full_forward(tiny: Path) -> None:
    """Logits kept only at positions that predict a sampled token give the same logprobs there."""
    from burnish_server.trainer.policy_model import make_micro_batch

    model = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), TrainSettings())
    first, second = Sequence(), Sequence()
    first.add([5, 6, 7, 8], [9, 10, 11], None)
    first.add([12, 13], [14, 15], None)  # a second turn: sampled tokens in the middle and at the end
    second.add([20, 21], [22, 23, 24, 25], None)
    batch = make_micro_batch([(first, 1.0), (second, -1.0)], model.pad_id, 64, model.device)
    with torch.no_grad():
        entropy: list[torch.Tensor] = []
        got = model.token_logprobs(batch, entropy)
        logits = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
        full = torch.nn.functional.pad(logits.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1), (1, 0))
        spread = torch.distributions.Categorical(logits=logits).entropy()
    sampled = batch.sampled.bool()
    assert torch.allclose(got[sampled], full[sampled], atol=1e-5)
    assert torch.allclose(entropy[0][sampled], torch.nn.functional.pad(spread, (1, 0))[sampled], atol=1e-4)  # the health figure
    assert got[sampled].abs().min() > 0
    assert got[:, ~sampled.any(0)].abs().max() == 0  # columns no row samples: never computed


def test_chunked_logprobs_and_their_gradients_match_the_full_logits(tiny: Path) -> None:
    """The only path (the LM head a chunk of positions at a time, trainer/logprobs.py) against the
    whole logits as the step took them before: the logprobs of the sampled tokens to 1e-5, the
    gradient of a loss on them with respect to every LoRA weight to 1e-4 of its largest entry, padded and
    packed, with the KL term's reference (the adapter disabled) as well."""
    from burnish_server.trainer import logprobs
    from burnish_server.trainer.policy_model import make_micro_batch

    model = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), TrainSettings())
    with torch.no_grad():  # LoRA's B starts at 0, which would leave A without a gradient
        for name, param in model.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    rows, packed = make_micro_batch(_varied(0), model.pad_id, 64, model.device), make_micro_batch(_varied(0), model.pad_id, 64, model.device, packed=True)
    original = logprobs.CHUNK_ELEMENTS
    for batch in (rows, packed):
        sampled = batch.sampled.bool()
        weights = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(0))
        logprobs.CHUNK_ELEMENTS = 3 * model.model.config.vocab_size  # several chunks
        try:
            got = model.token_logprobs(batch)
        finally:
            logprobs.CHUNK_ELEMENTS = original
        (got * weights * sampled).sum().backward()
        grads = {id(p): p.grad.clone() for p in model.params if p.grad is not None}
        model.optimizer.zero_grad(set_to_none=True)
        logits = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False).logits
        whole = torch.nn.functional.pad(logits[:, :-1].float().log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1), (1, 0))
        (whole * weights * sampled).sum().backward()
        torch.testing.assert_close(got[sampled], whole[sampled], atol=1e-5, rtol=1e-5)
        assert len(grads) == len(model.params)
        for param in model.params:
            assert param.grad is not None
            # fp32 sums in another order: within 1e-4 of the tensor's largest entry
            torch.testing.assert_close(grads[id(param)], param.grad, atol=1e-4 * float(param.grad.abs().max()), rtol=1e-4)
        model.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad(), model.model.disable_adapter():  # the KL term's reference
            reference = model.token_logprobs(batch)
            base = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False).logits
        expected = base[:, :-1].float().log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        torch.testing.assert_close(reference[sampled], torch.nn.functional.pad(expected, (1, 0))[sampled], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(reference[sampled], got[sampled].detach())  # the adapter was off


def test_a_resumed_model_trains_with_the_policys_current_settings(tiny: Path, tmp_path: Path) -> None:
    """The optimizer state saved in a checkpoint carries its learning rate; the policy's wins."""
    model = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3))
    model.save(tmp_path / "ckpt")
    resumed = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=1e-4, weight_decay=0.01))
    resumed.load(tmp_path / "ckpt")
    assert {(g["lr"], g["weight_decay"]) for g in resumed.optimizer.param_groups} == {(1e-4, 0.01)}


def _items(model: PolicyModel, seed: int) -> list[tuple[Sequence, float]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for advantage in (1.0, -1.0, 0.5, -0.5):
        prompt = torch.randint(5, 200, (6,), generator=generator).tolist()
        completion = torch.randint(5, 200, (5,), generator=generator).tolist()
        seq = Sequence()
        seq.add(prompt, completion, None)
        out.append((seq, advantage))
    return out


def _adapter(model: PolicyModel) -> dict[str, torch.Tensor]:
    from peft.utils import get_peft_model_state_dict

    return {k: v.clone() for k, v in get_peft_model_state_dict(model.model, adapter_name=model.adapter).items()}


def test_policies_on_one_base_train_as_each_would_alone(tiny: Path, tmp_path: Path) -> None:
    """trainer/base_model.py: several policies' adapters on one base model in memory. A step of
    one leaves the others untouched, and each ends where it would have on a base of its own."""
    from burnish_server.trainer.base_model import SharedBase

    settings = TrainSettings(learning_rate=5e-3)
    alone = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), settings, owner="a")
    for _ in range(2):
        alone.step(_items(alone, 0))
    expected = _adapter(alone)

    shared = SharedBase(str(tiny))
    a = PolicyModel(shared, LoraSettings(rank=8, alpha=16), settings, owner="a")
    b = PolicyModel(shared, LoraSettings(rank=4, alpha=8, target_modules=("q_proj", "v_proj")), TrainSettings(learning_rate=1e-2, seed=1), owner="b.v2")
    assert a.model is b.model and shared.adapters == {"a": a.adapter, "b.v2": b.adapter}
    before_b = _adapter(b)
    a.step(_items(a, 0))
    assert all(torch.equal(before_b[k], v) for k, v in _adapter(b).items())  # a's step moved none of b's weights
    b.step(_items(b, 1))
    a.step(_items(a, 0))  # after b's step, a's adapter is the active one again
    got = _adapter(a)
    assert got.keys() == expected.keys() and all(torch.allclose(got[k], expected[k], atol=1e-6) for k in got)
    # Each saves and resumes on its own; a policy dropped leaves the rest, the last leaves the base bare.
    b.save(tmp_path / "b")
    saved = _adapter(b)
    b.close()
    assert list(shared.adapters) == ["a"]
    again = PolicyModel(shared, LoraSettings(rank=4, alpha=8, target_modules=("q_proj", "v_proj")), TrainSettings(seed=1), owner="b.v2")
    again.load(tmp_path / "b")
    assert all(torch.equal(saved[k], v) for k, v in _adapter(again).items()) and _adapter(again).keys() == saved.keys()
    a.close()
    again.close()
    assert shared.peft is None and not shared.adapters


def _varied(seed: int) -> list[tuple[Sequence, float]]:
    """Sequences of different lengths, some of two turns: what packing must keep apart."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, advantage in enumerate((1.0, -1.0, 0.5, -0.5, 0.25)):
        seq = Sequence()
        seq.add(torch.randint(5, 200, (3 + 2 * i,), generator=generator).tolist(), torch.randint(5, 200, (2 + i,), generator=generator).tolist(), None)
        if i % 2:
            seq.add(torch.randint(5, 200, (2,), generator=generator).tolist(), torch.randint(5, 200, (3,), generator=generator).tolist(), None)
        out.append((seq, advantage))
    return out


def test_packed_sequences_train_as_padded_ones(tiny: Path) -> None:
    """Sequences packed into one row (position ids per sequence; transformers masks each to
    itself) give the padded batch's logprobs, and a step that leaves the same adapter."""
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.policy_model import make_micro_batch

    packed, padded = (SharedBase(str(tiny), holding=Holding(packing=packing)) for packing in ("on", "auto"))
    assert packed.packs and not padded.packs  # the tiny model (Qwen2) masks packed sequences faithfully; SDPA: auto pads
    models = [PolicyModel(base, LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3)) for base in (packed, padded)]
    items = _varied(0)
    with torch.no_grad():
        one_row = make_micro_batch(items, 0, 64, models[0].device, packed=True)
        rows = make_micro_batch(items, 0, 64, models[1].device)
        assert one_row.input_ids.shape == (1, sum(len(s.tokens) for s, _ in items)) and rows.input_ids.shape[0] == len(items)
        got, expected = models[0].token_logprobs(one_row), models[1].token_logprobs(rows)
    torch.testing.assert_close(got[one_row.sampled.bool()], expected[rows.sampled.bool()], atol=1e-5, rtol=1e-5)
    for model in models:
        model.step(items)
        model.step(_varied(1))
    # Equal to float precision, except where AdamW's first step divides a gradient within a few
    # 1e-8 of zero by its own size (tests/trainer/test_distributed.py): such an entry moves by a share of
    # lr that the order of the sums decides. At most one entry in a thousand; every one within lr.
    lr, entries, loose = 5e-3, 0, 0
    packed_adapter, padded_adapter = _adapter(models[0]), _adapter(models[1])
    for key, value in packed_adapter.items():
        gap = (value - padded_adapter[key]).abs()
        assert gap.max() <= lr, key
        entries, loose = entries + gap.numel(), loose + int((gap > 2e-5 + 1e-4 * padded_adapter[key].abs()).sum())
    assert loose <= entries // 1000, (loose, entries)


def test_activation_checkpointing_changes_memory_not_the_step(tiny: Path) -> None:
    """Full and selective checkpointing leave the adapter the step leaves without; selective
    keeps the matmuls' and attention's results (trainer/recompute.py), so backward recomputes no
    matmul but LoRA's narrow second factor (counted by torch's FLOP counter: full recomputes every one)."""
    from torch.utils.flop_counter import FlopCounterMode

    from burnish_server.trainer.base_model import Holding, SharedBase

    adapters, flops = {}, {}
    for checkpointing in ("on", "selective", "off"):
        base = SharedBase(str(tiny), holding=Holding(checkpointing=checkpointing))
        assert base.checkpointing is (checkpointing != "off")
        model = PolicyModel(base, LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3))
        with FlopCounterMode(display=False) as counter:
            model.step(_varied(0))
        adapters[checkpointing], flops[checkpointing] = _adapter(model), counter.get_total_flops()
    for checkpointing in ("on", "selective"):
        for key, value in adapters[checkpointing].items():
            torch.testing.assert_close(value, adapters["off"][key], atol=1e-6, rtol=1e-5)
    # Selective recomputes LoRA's B alone, rank / hidden of the base's work (8 / 128 here; 16 / 1536 on a 1.5B model).
    assert flops["off"] < flops["selective"] < flops["off"] * 1.1 < flops["on"], flops


def test_the_step_reads_nothing_back_from_the_device_before_its_end(tiny: Path) -> None:
    """On a GPU, reading a tensor's value (``.item()``, ``float()``, ``nonzero``) waits for all the
    work queued before it, and the device idles while the host queues more. The step's own code
    finds the sampled positions on the host (make_micro_batch, before the copy), keeps its figures on
    the device and reads them once at its end (``tolist``, which dispatches no per-value read);
    the fused AdamW reads no step count. What is left is transformers' own check of the mask.
    Counted by the ops that read a value, by who called them (the first step also reads each
    base layer's norm, once, for ``distance_from_base``)."""
    import traceback
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sites: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func.overloadpacket.__name__ in ("_local_scalar_dense", "nonzero", "is_nonzero", "equal"):
                caller = [f for f in traceback.extract_stack()[:-1] if f"{os.sep}torch{os.sep}" not in f.filename][-1]
                self.sites[f"{Path(caller.filename).name}:{caller.name}"] += 1
            return func(*args, **(kwargs or {}))

    model = PolicyModel(str(tiny), LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3, kl_coef=0.05))
    model.step(_varied(0))
    for packed in (False, True):
        model.base.packs = packed
        with Reads() as reads:
            model.step(_varied(1))
        assert {site.split(":")[0] for site in reads.sites} <= {"policy_model.py", "masking_utils.py"}, reads.sites
        assert {site for site in reads.sites if site.startswith("policy_model.py")} == {"policy_model.py:make_micro_batch"}, reads.sites


def test_the_gpus_paths_run_on_the_cpu(tiny: Path, tmp_path: Path) -> None:
    """What a GPU runs by default (a bf16 base, activation checkpointing, packing), on the CPU:
    it steps, moves the adapter (kept in fp32), saves and resumes."""
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.policy_model import make_micro_batch

    base = SharedBase(str(tiny), holding=Holding(dtype="bfloat16", checkpointing="on", packing="on"))
    assert base.model.dtype == torch.bfloat16 and base.checkpointing and base.packs
    model = PolicyModel(base, LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3))
    assert {p.dtype for p in model.params} == {torch.float32}
    metrics = model.step(_varied(0))
    assert metrics.tokens > 0 and (metrics.distance_from_base or 0) > 0 and torch.isfinite(torch.tensor(metrics.loss))
    # A GPU's LoRA path: the forward under bf16 autocast (here the CPU's), weights, gradients and
    # AdamW's state in fp32; the step agrees with the fp32 LoRA path to bf16's precision.
    mixed = PolicyModel(SharedBase(str(tiny), holding=Holding(dtype="bfloat16")), LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3))
    plain = PolicyModel(SharedBase(str(tiny), holding=Holding(dtype="bfloat16")), LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3))
    mixed.base.mixed = True
    with torch.no_grad():
        batch = make_micro_batch(_varied(0), mixed.pad_id, 64, mixed.device)
        torch.testing.assert_close(mixed.token_logprobs(batch), plain.token_logprobs(batch), atol=0.1, rtol=0.05)
    steps = [m.step(_varied(0)) for m in (mixed, plain)]
    assert steps[0].loss == pytest.approx(steps[1].loss, abs=2e-2)
    assert {p.dtype for p in mixed.params} == {torch.float32}
    assert {v.dtype for state in mixed.optimizer.state.values() for v in state.values() if v.dim()} == {torch.float32}
    model.save(tmp_path / "bf16")
    resumed = PolicyModel(SharedBase(str(tiny), holding=Holding(dtype="bfloat16")), LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3))
    resumed.load(tmp_path / "bf16")
    assert all(torch.equal(v, _adapter(resumed)[k]) for k, v in _adapter(model).items())


def test_a_model_whose_logits_are_not_its_head_on_its_hidden_states_is_refused(tiny: Path, tmp_path: Path) -> None:
    """trainer/base_model.py: check_head. A config that says the logits are scaled (Granite's
    ``logits_scaling``) on a model whose forward does not scale them: the chunked head and the
    model disagree, and the base is refused at load rather than trained on other numbers."""
    import json
    import shutil

    from burnish_server.trainer.base_model import SharedBase

    model = tmp_path / "scaled"
    shutil.copytree(tiny, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"logits_scaling": 4.0}))
    with pytest.raises(ValueError, match="computes its logits otherwise"):
        SharedBase(str(model))


def _groups(seed: int) -> list[tuple[Sequence, float]]:
    """Two groups of answers to a prompt each, answers of different lengths, some of two turns
    (a second prompt and answer after the first): what prompt sharing lays out in one row a group."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for g in range(2):
        prompt = torch.randint(5, 200, (7 + 3 * g,), generator=generator).tolist()
        for i, advantage in enumerate((1.0, -1.0, 0.5)):
            seq = Sequence()
            seq.add(prompt, torch.randint(5, 200, (2 + i,), generator=generator).tolist(), None)
            if i == 1:
                seq.add(torch.randint(5, 200, (2,), generator=generator).tolist(), torch.randint(5, 200, (3,), generator=generator).tolist(), None)
            out.append((seq, advantage * (g + 1)))
    return out


def test_a_groups_answers_share_their_prompt_and_train_as_apart(tiny: Path) -> None:
    """trainer/shared_prompts.py: a group's answers in one row, the prompt once. Each sampled
    token gets the logprob it gets in its own row, the rows are as many as the groups, and a
    step leaves the adapter the step one sequence a row leaves."""
    from burnish_server.trainer.base_model import Holding, SharedBase
    from burnish_server.trainer.policy_model import make_micro_batch, micro_batches

    shared, apart = (SharedBase(str(tiny), holding=Holding(prompt_sharing=mode)) for mode in ("auto", "off"))
    assert shared.shares_prompts and not apart.shares_prompts
    models = [PolicyModel(base, LoraSettings(rank=8, alpha=16), TrainSettings(learning_rate=5e-3)) for base in (shared, apart)]
    with torch.no_grad():  # LoRA's B starts at 0: let the adapter change the logprobs
        for model in models:
            for name, param in model.model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    items = _groups(0)
    (rows,) = micro_batches(items, 4096, 64, share=shared.break_even)
    assert [len(row.items) for row in rows] == [3, 3] and [row.prefix for row in rows] == [10, 7]  # longest row first
    together = make_micro_batch(rows, 0, 64, models[0].device)
    one_a_row = make_micro_batch([item for row in rows for item in row.items], 0, 64, models[1].device)
    assert together.input_ids.numel() < one_a_row.input_ids.numel() and together.sampled.sum() == one_a_row.sampled.sum()
    with torch.no_grad():
        got, expected = models[0].token_logprobs(together), models[1].token_logprobs(one_a_row)
    torch.testing.assert_close(got[together.sampled.bool()], expected[one_a_row.sampled.bool()], atol=1e-5, rtol=1e-5)
    metrics = [model.step(items) for model in models]
    for name in ("loss", "grpo_loss", "entropy", "tokens", "grad_norm"):
        assert getattr(metrics[0], name) == pytest.approx(getattr(metrics[1], name), rel=1e-4, abs=1e-6), name
    for key, value in _adapter(models[0]).items():
        torch.testing.assert_close(value, _adapter(models[1])[key], atol=2e-5, rtol=1e-4)


def test_shared_rows_keep_to_the_micro_batch_and_leave_a_lone_prompt_alone() -> None:
    from burnish_server.trainer.shared_prompts import shared_rows

    items = _groups(0)
    lone = Sequence()
    lone.add([9, 9, 9], [4, 4], None)
    rows = shared_rows([*items, (lone, 0.0)], 64, 20, 1e9)
    # The first group's prompt is 7 tokens, its rests 2, 3 + 2 + 3 and 4: 7 + 2 + 8 fits 20, the third starts a row of its own.
    assert [(len(r.items), r.prefix) for r in rows] == [(2, 7), (1, 0), (2, 10), (1, 0), (1, 0)]
    assert all(r.length(64) <= 20 for r in rows if len(r.items) > 1)
    assert sorted(id(item[0]) for r in rows for item in r.items) == sorted(id(s) for s, _ in [*items, (lone, 0.0)])
    # Long answers to a short prompt: one row of 2 + 10 + 10 tokens costs 22 + 22^2 / 10 = 70, two of 12 cost 53.
    answers = []
    for i in range(2):
        seq = Sequence()
        seq.add([1, 2], list(range(10 + i, 20 + i)), None)
        answers.append((seq, 0.0))
    assert [len(r.items) for r in shared_rows(answers, 64, 64, 10)] == [1, 1]
    assert [len(r.items) for r in shared_rows(answers, 64, 64, 1e9)] == [2]
