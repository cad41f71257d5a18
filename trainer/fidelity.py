"""A checkpoint's probe (core/learning/fidelity.py): its step's shortest sequences and the trainer's
log-probability of each of their tokens under the adapter just trained, saved beside the
adapter as ``probe.json``. Publishing (trainer/publisher.py) compares what vLLM serves with it.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import torch

from burnish_server.core.learning.fidelity import PROBE_SEQUENCES, PROBE_TOKENS, Probe
from burnish_server.trainer.checkpoints import PROBE_FILE
from burnish_server.trainer.policy_model import PolicyModel, make_micro_batch
from burnish_server.trainer.sequences import Sequence


@torch.no_grad()
def make_probe(model: PolicyModel, sequences: list[Sequence]) -> Probe | None:
    """The probe of the model as it is now, on the shortest ``PROBE_SEQUENCES`` of ``sequences``
    (each cut at ``PROBE_TOKENS``): every token after the first is scored, prompt and answer
    alike, so an adapter's effect anywhere shows. None for a step with no sequence. Every rank
    calls it (the forward is a collective under FSDP2)."""
    chosen = sorted((s.tokens[:PROBE_TOKENS] for s in sequences if len(s.tokens) > 1), key=len)[:PROBE_SEQUENCES]
    if not chosen:
        return None
    items = []
    for ids in chosen:
        seq = Sequence()
        seq.add(ids[:1], ids[1:], None)  # every token after the first is "sampled": scored
        items.append((seq, 0.0))
    micro = make_micro_batch(items, model.pad_id, PROBE_TOKENS, model.device)
    # In eval mode, as vLLM serves the adapter: LoRA's dropout (and the base's) off, or a policy
    # with dropout > 0 would probe noise and refuse good versions.
    training = model.model.training
    model.model.eval()
    try:
        logprobs = model.token_logprobs(micro).cpu()
    finally:
        model.model.train(training)
    return Probe(
        sequences=chosen,
        logprobs=[[float(x) for x in logprobs[row, 1 : len(ids)]] for row, ids in enumerate(chosen)],
        dtype=str(model.base.dtype).removeprefix("torch."),
    )


def save_probe(directory: Path, probe: Probe | None) -> None:
    if probe is not None:
        (directory / PROBE_FILE).write_bytes(msgspec.json.encode(probe))
