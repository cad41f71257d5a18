"""A GGUF file -> a plain Hugging Face folder (safetensors, config, tokenizer, chat template).

vLLM's LoRA support and peft both want an ordinary checkpoint, while many small models
people have on disk are GGUF files (llama.cpp's format, often quantized). transformers
reads GGUF and dequantizes it to float tensors when the ``gguf`` package is installed;
the model it returns is marked as quantized and refuses ``save_pretrained``, so the
weights are copied into a fresh model built from the same config, which saves normally.

The embedded demo model's file is found by ``serving/models.py:embedded_gguf``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def convert_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Write ``gguf_file`` as a float32 safetensors model with its tokenizer into ``out_dir``.

    Whole or absent: the folder is written beside ``out_dir`` and renamed into place, so a
    conversion cut short is never mistaken for a model. Returns ``out_dir``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_file, out_dir = Path(gguf_file).resolve(), Path(out_dir)
    folder, name = str(gguf_file.parent), gguf_file.name
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A fresh model from the same config takes the dequantized weights and saves normally.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may be absent from the file's tensors; anything else is a broken file.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{gguf_file}: weights do not match its config (missing {missing[:5]}, unexpected {unexpected[:5]})")
    if config.tie_word_embeddings:
        plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "burnish-source.json").write_text(json.dumps({"gguf": str(gguf_file), "size": gguf_file.stat().st_size}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
