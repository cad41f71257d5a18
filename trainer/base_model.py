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

from typing import Any

import torch


class SharedBase:
    """A base model, and the adapter of each policy attached to it."""

    def __init__(self, path: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = path
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # bf16 on a GPU; fp32 on the CPU, where bf16 matmuls are slow or missing.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)  # type: ignore[arg-type]  # transformers' stubs type .to oddly
        self.peft: Any = None  # the PeftModel, once an adapter is attached
        self.adapters: dict[str, str] = {}  # owner (a policy) -> its adapter's name in peft
        self._made = 0

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
