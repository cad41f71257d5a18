"""One base model in memory for every policy trained on it: peft's several adapters on one model.

Policies of many projects often share a base (every team's agent on the same 7B). Each
policy is a LoRA adapter; the base's weights, frozen, are loaded once (``SharedBase``) and
each ``PolicyModel`` attaches its adapter to them, with its own optimizer. Before a policy's
step its adapter is made the active one (peft's ``set_adapter``): only its weights take part
in the forward pass and only they get gradients. ``benchmarks`` in docs/performance.md
("Several policies on one base") has the memory of 1 and 8 policies this way, against a
base per policy.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch

from burnish_server.trainer.distributed import Ranks
from burnish_server.trainer.recompute import selective
from burnish_server.trainer.shared_prompts import break_even


@dataclass(frozen=True)
class Holding:
    """How the trainer holds a base model (``BURNISH_TRAINER_*`` in core/platform/settings.py)."""

    # The base's weights and activations: bf16 on a GPU; fp32 on the CPU, where bf16 matmuls
    # are slow or missing. LoRA's weights and optimizer state are fp32 whatever this says; in a
    # 16-bit dtype on a GPU, the LoRA path computes in it too (``SharedBase.compute``).
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    # Activation (gradient) checkpointing: each layer's activations recomputed in the backward
    # pass instead of kept, about a third more compute for memory that no longer grows with
    # layers x tokens. On by default on a GPU, where agent-length sequences hit the limit. "on"
    # on the CPU also fixes glibc's mmap threshold (``return_freed_memory``). "selective" keeps
    # the layers' matmul and attention results and recomputes only the cheap work between them
    # (``trainer/recompute.py``): less memory than "off" for little more compute.
    checkpointing: Literal["auto", "on", "selective", "off"] = "auto"
    # A micro-batch's sequences packed into one row without padding (position ids per
    # sequence), where the model keeps them apart faithfully. "auto" packs where the attention
    # kernel is variable-length (FlashAttention: each sequence attends within itself at no
    # cost for the others); under SDPA or eager attention, transformers keeps packed sequences
    # apart with a dense mask over the whole row, so attention computes every pair of the row's
    # tokens: its cost grows with the row's length squared, not each sequence's. "auto" pads there.
    packing: Literal["auto", "on", "off"] = "auto"
    # A group's answers trained as one row, their shared prompt once (trainer/shared_prompts.py):
    # a forward pass as long as the prompt plus the answers, not the prompt once per answer.
    # "auto" shares where the rows are padded (not packed), the attention takes a 4-D mask
    # (SDPA, eager) and the model is checked to give each token its own sequence's logits.
    prompt_sharing: Literal["auto", "off"] = "auto"


@dataclass
class Head:
    """The LM head, as ``SharedBase.hidden_states`` hands it out: its module (the weight is read
    when used: under FSDP2 it is whole only from the model's forward on), and the scale and soft
    cap the model puts on its logits (Granite's ``logits_scaling``, Gemma's soft cap)."""

    module: torch.nn.Linear
    scale: float = 1.0
    softcap: float | None = None

    @property
    def weight(self) -> torch.Tensor:
        return self.module.weight


# glibc's malloc: allocations from this size up are mapped on their own and given back to the
# system when freed. By default the threshold rises with every large block freed (up to 32 MiB),
# so a step's many short-lived activations of 1-30 MiB come from the heap, which keeps what it
# once held: an agent's step on SmolLM2 reached 9 GB resident where autograd held under 1 GB
# (bench/agent_memory.py; docs/performance.md).
MMAP_THRESHOLD = 64 * 1024


def return_freed_memory() -> None:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD`` (and trim the heap whenever it can) for
    this process, so that the CPU trainer's resident memory follows what its tensors hold. Each
    large allocation then maps fresh pages (a page fault each, and zeroing), which costs time, so
    it is done only where memory was asked for: a base loaded onto the CPU with activation
    checkpointing on. A no-op off glibc. Process-wide."""
    import ctypes

    try:
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the process's own symbols: libc's
    except OSError:
        return
    if mallopt is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    mallopt(m_mmap_threshold, MMAP_THRESHOLD)
    mallopt(m_trim_threshold, MMAP_THRESHOLD)


@contextmanager
def _mixed(model: Any, device: str, dtype: torch.dtype) -> Iterator[None]:
    from peft.helpers import disable_input_dtype_casting

    with torch.autocast(device, dtype=dtype), disable_input_dtype_casting(model):
        yield


class SharedBase:
    """A base model, and the adapter of each policy attached to it."""

    def __init__(self, path: str, ranks: Ranks | None = None, holding: Holding = Holding()) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = path
        self.ranks = ranks or Ranks()
        self.device = self.ranks.device
        gpu = self.device.type == "cuda"
        if self.device.type == "cpu" and holding.checkpointing in ("on", "selective"):
            return_freed_memory()  # where memory was asked for: it costs a page fault per large allocation
        dtype = {"auto": torch.bfloat16 if gpu else torch.float32, "bfloat16": torch.bfloat16, "float32": torch.float32}[holding.dtype]
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # FlashAttention where it is installed, on a GPU: its variable-length kernel is what makes
        # packed sequences cheap (``Holding.packing``).
        flash = {"attn_implementation": "flash_attention_2"} if gpu and importlib.util.find_spec("flash_attn") else {}
        self.model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **flash)
        self.dtype = dtype
        # On a GPU in bf16 the forward runs under autocast, so LoRA's fp32 factors multiply in
        # bf16 on tensor cores and backward keeps bf16 inputs (TRL does the same); on the CPU, or in
        # fp32, nothing changes.
        self.mixed = gpu and dtype != torch.float32
        if holding.checkpointing in ("on", "selective") or (holding.checkpointing == "auto" and gpu):
            # Non-reentrant: the variant that composes with FSDP2 and with frozen inputs.
            kwargs: dict[str, Any] = {"use_reentrant": False}
            if holding.checkpointing == "selective":
                kwargs["context_fn"] = selective
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if self.ranks.sharded:
            self.ranks.shard(self.model)  # FSDP2 places each rank's shards on its device
        else:
            self.model.to(self.device)  # type: ignore[arg-type]  # transformers' stubs type .to oddly
        varlen = "flash" in str(self.model.config._attn_implementation)
        self.packs = (holding.packing == "on" or (holding.packing == "auto" and varlen)) and self.packing_is_faithful()
        self.shares_prompts = holding.prompt_sharing == "auto" and not self.packs and not varlen and self.sharing_is_faithful()
        config = self.model.config
        self.break_even = break_even(config.hidden_size, getattr(config, "intermediate_size", None) or 4 * config.hidden_size)
        self.check_head()
        self.peft: Any = None  # the PeftModel, once an adapter is attached
        self.adapters: dict[str, str] = {}  # owner (a policy) -> its adapter's name in peft
        self._made = 0
        self._norms: dict[int, float] = {}  # id(a frozen base layer) -> its weight's squared norm

    @property
    def checkpointing(self) -> bool:
        return bool(self.model.is_gradient_checkpointing)

    @torch.no_grad()
    def packing_is_faithful(self) -> bool:
        """Whether two sequences packed in one row (position ids restarting) get the logits each
        gets alone: transformers builds the per-sequence mask from the position ids for the
        models that use its masking (Llama, Qwen2, Mistral, ...); a model that does not would
        let packed sequences see each other, and is trained padded instead."""
        first, second = [1, 2, 3, 4, 5], [6, 7, 8]
        self.model.eval()
        alone = torch.cat([self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=False).logits[0] for ids in (first, second)]).float()
        positions = torch.tensor([list(range(len(first))) + list(range(len(second)))], device=self.device)
        # As the step calls it (policy_model.py), without a cache: with one transformers reads no packing.
        packed = self.model(input_ids=torch.tensor([first + second], device=self.device), position_ids=positions, use_cache=False).logits[0].float()
        return self._agrees(packed, alone)

    def _agrees(self, got: torch.Tensor, expected: torch.Tensor) -> bool:
        """Logits from another layout the same as ``expected``, to the base's precision."""
        tolerance = 1e-4 if self.model.dtype == torch.float32 else 3e-2  # bf16 rounds to ~3 digits
        return bool((got - expected).abs().max() <= tolerance * max(float(expected.abs().max()), 1.0))

    @torch.no_grad()
    def sharing_is_faithful(self) -> bool:
        """Whether two sequences with a shared prompt, laid out as the prompt once and then each
        one's rest (trainer/shared_prompts.py: a 4-D mask, position ids continuing the prompt),
        get the logits each gets alone. A model whose attention ignores a 4-D mask is trained
        one sequence a row instead."""
        from burnish_server.trainer.policy_model import make_micro_batch
        from burnish_server.trainer.sequences import Sequence
        from burnish_server.trainer.shared_prompts import Row

        prompt, rests = [1, 2, 3, 4, 5], ([6, 7, 8], [9, 10])
        items = []
        for rest in rests:
            seq = Sequence()
            seq.add(prompt, rest, None)
            items.append((seq, 0.0))
        self.model.eval()
        micro = make_micro_batch([Row(items, len(prompt))], 0, 64, self.device)
        try:
            shared = (
                self.model(input_ids=micro.input_ids, attention_mask=micro.attention_mask, position_ids=micro.position_ids, use_cache=False).logits[0].float()
            )
        except (RuntimeError, ValueError, TypeError):  # an attention that refuses the mask
            return False
        alone = [self.model(input_ids=torch.tensor([prompt + rest], device=self.device), use_cache=False).logits[0].float() for rest in rests]
        # The shared row: the prompt, the first rest, the second rest (each rest's own positions).
        return self._agrees(shared, torch.cat([alone[0], alone[1][len(prompt) :]]))

    def compute(self) -> AbstractContextManager[Any]:
        """The context of a training forward pass: bf16 autocast on a GPU (``mixed``), else none.
        peft casts a LoRA layer's input to its weights' fp32 before the LoRA matmuls; under
        autocast that is undone at once, so it is turned off there: the input stays the bf16
        tensor the base layer already keeps for backward, not a second copy of it."""
        if not self.mixed:
            return nullcontext()
        return _mixed(self.model, self.device.type, self.dtype)

    @contextmanager
    def hidden_states(self) -> Iterator[Head]:
        """Inside, the model's forward returns its last hidden states where it returned logits
        (at the positions ``logits_to_keep`` names): its LM head is swapped for the identity, and
        the scale and soft cap some models put on their logits are taken off the config and
        handed to whoever applies the head (``trainer/logprobs.py``: a chunk at a time)."""
        model, config = self.model, self.model.config
        head = model.get_output_embeddings()
        name = next((n for n, m in model.named_children() if m is head), None)
        if name is None or type(head) is not torch.nn.Linear or head.bias is not None:
            raise ValueError(f"{type(model).__name__}'s LM head is not a plain bias-free Linear child of the model (LoRA on the head is not supported)")
        softcap, scaling = getattr(config, "final_logit_softcapping", None), getattr(config, "logits_scaling", None)
        setattr(model, name, torch.nn.Identity())
        if softcap is not None:
            config.final_logit_softcapping = None
        if scaling is not None:
            config.logits_scaling = 1.0
        try:
            yield Head(head, 1.0 / scaling if scaling else 1.0, softcap)
        finally:
            setattr(model, name, head)
            if softcap is not None:
                config.final_logit_softcapping = softcap
            if scaling is not None:
                config.logits_scaling = scaling

    @torch.no_grad()
    def check_head(self) -> None:
        """That the model's logits are its LM head on its last hidden states, as
        ``hidden_states`` takes them: the log-probabilities both ways agree. A model that
        computes its logits otherwise is refused at load, never trained on wrong numbers."""
        from burnish_server.trainer.logprobs import sampled_logprobs

        ids = torch.tensor([[1, 2, 3, 4, 5, 6]], device=self.device)
        self.model.eval()
        logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        full = logits.log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        with self.hidden_states() as head:
            hidden = self.model(input_ids=ids, use_cache=False).logits[0, :-1]
            chunked, _ = sampled_logprobs(hidden, head.weight, ids[0, 1:], scale=head.scale, softcap=head.softcap)
        tolerance = 1e-4 if self.model.dtype == torch.float32 else 5e-2
        if not torch.allclose(chunked, full, atol=tolerance * max(1.0, float(full.abs().max())), rtol=0):
            raise ValueError(f"{type(self.model).__name__} computes its logits otherwise than its LM head on its last hidden states: not supported")

    def squared_norm(self, layer: Any) -> float:
        """A frozen base layer's squared weight norm, computed once (under FSDP2 it takes a collective)."""
        if id(layer) not in self._norms:
            self._norms[id(layer)] = self.ranks.squared_norm(layer.weight)
        return self._norms[id(layer)]

    def attach(self, owner: str, config: Any, seed: int) -> tuple[Any, str]:
        """A new adapter for ``owner`` (LoRA's A matrices drawn from ``seed``: the same seed, the
        same start, whatever else is attached); returns the PeftModel and the adapter's name."""
        from peft import get_peft_model

        if owner in self.adapters:
            raise ValueError(f"{owner!r} already has an adapter on {self.path}")
        # peft's adapter names are module keys: a policy's name may hold "." or ":".
        name = f"adapter_{self._made}"
        self._made += 1
        torch.manual_seed(seed)
        if self.peft is None:
            self.peft = get_peft_model(self.model, config, adapter_name=name)
        else:
            self.peft.add_adapter(name, config)
        self.adapters[owner] = name
        return self.peft, name

    def detach(self, owner: str) -> None:
        """Remove ``owner``'s adapter; with the last one, the base is left as it was loaded."""
        name = self.adapters.pop(owner, None)
        if name is None:
            return
        if self.adapters:
            if self.peft.active_adapter == name:  # another first: peft warns when the active one goes
                self.peft.set_adapter(next(iter(self.adapters.values())))
            self.peft.delete_adapter(name)
        else:
            self.model = self.peft.unload()  # the LoRA layers taken out, nothing merged
            self.peft = None
