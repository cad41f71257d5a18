"""The training defaults ``burnish up`` gives a policy: one rule for every model, however it
is named (the embedded SmolLM2, a GGUF file, a folder, a hub id).

LoRA on every linear projection of the decoder, rank 16, alpha 32, and a learning rate from
the model's width, after "LoRA Without Regret" (Schulman et al., 2025):

    learning_rate = BASE_LR * (2000 / hidden_size) ** exponent * (32 / alpha)

- LoRA on every projection, the MLP's included: attention alone learns less for the same steps.
- Alpha stays 32 whatever the rank (LoRA's ``alpha / rank`` scaling then makes the best rate
  nearly independent of the rank), so only a changed alpha moves the rate.
- The width's exponent is the one that paper's authors fitted per family (Llama-like 0.781,
  Qwen 0.0775, in the Tinker cookbook's ``get_lr``); a family they did not fit takes Llama's.
- Their base (5e-4 for LoRA) was fitted on supervised fine-tuning. Ours is 0.4 of it, 2e-4,
  which puts SmolLM2-135M (Llama-like, width 576) at 5.3e-4: where it learned the demo's sums
  (docs/trainer.md). The rule is measured on SmolLM2 only; on larger models it is the paper's
  scaling, unmeasured here.

On the CPU build a call that asks for no budget (the Codex CLI never does) gets at most
``CPU_MAX_TOKENS`` (``serving.max_tokens``): vLLM would otherwise sample up to what the prompt
leaves of the window, and a Codex call on SmolLM2 sampled 2,092 tokens in 8.6 minutes.

Hindsight (``train.teacher.hindsight``: a lone attempt's answer distilled toward the base shown
the user's next turn) is left off: on SmolLM2 it raised the demo's held-out sums as much as
grouped replays did, and drove word_sorting's down onto a list of numbers (docs/production.md).

A model with random weights (the tiny test model) is not what the rule is for: it needs a
step ten times larger (docs/trainer.md), and ``burnish up --model tiny`` says so.
"""

from __future__ import annotations

import msgspec

from burnish_server.core.learning.policies import LoraSettings, ServingSettings, TrainSettings

BASE_LR = 2e-4
REFERENCE_WIDTH = 2000
REFERENCE_ALPHA = 32
# Per family (config.json's model_type): the exponent of the width in the rule.
QWEN_EXPONENT = 0.0775
LLAMA_EXPONENT = 0.781
EXPONENTS = {"qwen2": QWEN_EXPONENT, "qwen3": QWEN_EXPONENT, "qwen2_moe": QWEN_EXPONENT, "qwen3_moe": QWEN_EXPONENT}
# A decoder's linear projections, as Llama, Qwen, Mistral, Gemma and SmolLM name them.
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Every model gets these: a bigger step needs groups enough to compare.
GROUPS_PER_STEP = 4
RANK = 16
# A call's budget where it asks for none, on the CPU build: a turn of a coding CLI on SmolLM2
# (4-5 tokens a second beside a 6,000-token prompt on two cores) ends in about two minutes.
CPU_MAX_TOKENS = 512


class ModelShape(msgspec.Struct, frozen=True, kw_only=True):
    """What the rule reads of a model: its config.json's ``model_type`` and ``hidden_size``."""

    model_type: str
    hidden_size: int


class Defaults(msgspec.Struct, frozen=True, kw_only=True):
    lora: LoraSettings
    train: TrainSettings
    serving: ServingSettings = ServingSettings()
    # One line a user reads at start: what was chosen, from what, and how to change it.
    explanation: str


def learning_rate(shape: ModelShape, alpha: int = REFERENCE_ALPHA) -> float:
    exponent = EXPONENTS.get(shape.model_type, LLAMA_EXPONENT)
    return float(BASE_LR * (REFERENCE_WIDTH / shape.hidden_size) ** exponent * (REFERENCE_ALPHA / alpha))


def defaults(shape: ModelShape, *, micro_batch_tokens: int | None = None, window: int | None = None, max_tokens: int | None = None) -> Defaults:
    """The LoRA and training settings for a pretrained model of this shape.

    ``micro_batch_tokens``: the trainer's forward size where the machine needs a smaller one
    than the default (``burnish up`` on the CPU build). ``window``: the window the model is
    served with, where it is known: the longest sequence trained, so that a coding CLI's
    session (a 6,000-token prompt before its first sampled token) is trained on. ``max_tokens``:
    the budget of a call that asks for none (``CPU_MAX_TOKENS`` on the CPU build)."""
    lr = float(f"{learning_rate(shape):.2g}")
    lora = LoraSettings(rank=RANK, alpha=REFERENCE_ALPHA, target_modules=LLAMA_PROJECTIONS)
    train = TrainSettings(learning_rate=lr, groups_per_step=GROUPS_PER_STEP)
    if micro_batch_tokens is not None:
        train = msgspec.structs.replace(train, micro_batch_tokens=micro_batch_tokens)
    if window is not None:
        train = msgspec.structs.replace(train, max_seq_len=window)
    exponent = EXPONENTS.get(shape.model_type, LLAMA_EXPONENT)
    explanation = (
        f"training defaults: LoRA r={lora.rank} alpha={lora.alpha} on every projection, learning rate {lr:g} "
        f"(2e-4 x (2000 / width {shape.hidden_size}) ^ {exponent} for {shape.model_type}), {train.groups_per_step} groups a step"
        + (f", sequences up to {window} tokens (the served window)" if window is not None else "")
        + (f"; a call that asks for no budget gets at most {max_tokens} tokens (serving.max_tokens)" if max_tokens is not None else "")
        + "; "
        "change them with PATCH /admin/policies/<name> (docs/settings.md)"
    )
    return Defaults(lora=lora, train=train, serving=ServingSettings(max_tokens=max_tokens), explanation=explanation)
