"""A trained version out of burnish: a PEFT adapter folder, merged weights, or a GGUF file.

- ``adapter``: the step's LoRA as peft writes it (``adapter_config.json`` and
  ``adapter_model.safetensors``), its ``base_model_name_or_path`` set to the base the policy
  trains on, so ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), dir)``
  loads it. The optimizer's state stays behind: it is for resuming, not for serving.
- ``merged``: the base with the adapter merged in (``merge_and_unload``), saved as a plain
  Hugging Face folder with the base's tokenizer and chat template, which transformers and vLLM
  load with no LoRA. In the base's dtype as loaded: float32 for a GGUF base (its conversion is
  float32) and on the CPU.
- ``gguf``: the merged weights in one GGUF file, float32, for a base that came from a GGUF
  file: every key of that file (architecture, tokenizer, chat template) is copied, and each of
  its tensors is written from the merged weights under its own name. A quantized base (SmolLM2's
  Q4_1, say) was trained on its dequantized float32 weights, so the file is about four times
  the size of the original per parameter; quantizing it again (llama.cpp's ``llama-quantize``)
  changes its answers, as quantizing any model does. A base that is not a GGUF file has no
  tokenizer metadata here to write: export ``merged`` and convert it with llama.cpp's
  ``convert_hf_to_gguf.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from burnish_server.core.learning.adapters import ADAPTER_CONFIG, ADAPTER_FILES, ADAPTER_WEIGHTS, exported_config
from burnish_server.core.platform.errors import Invalid

Format = Literal["adapter", "merged", "gguf"]
FORMATS: tuple[Format, ...] = ("adapter", "merged", "gguf")


class ExportError(Invalid, ValueError):
    """What cannot be exported, and what to do instead."""

    default_code = "export_invalid"


def export(adapter: Path, base: str, out: Path, fmt: Format, name: str = "model") -> Path:
    """Write the adapter at ``adapter`` (a checkpoint's ``adapter/`` folder), trained on
    ``base`` (a folder or hub id), into ``out`` as ``fmt``. Returns what was written: the
    folder, or for ``gguf`` the file ``out/<name>.gguf``."""
    if not all((adapter / f).is_file() for f in ADAPTER_FILES):
        raise ExportError(f"{adapter} holds no adapter ({', '.join(ADAPTER_FILES)})")
    if fmt == "gguf" and _source_gguf(base) is None:
        raise ExportError(f"{base} did not come from a GGUF file: export --format merged and convert it with llama.cpp's convert_hf_to_gguf.py")
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "adapter":
        shutil.copyfile(adapter / ADAPTER_WEIGHTS, out / ADAPTER_WEIGHTS)
        (out / ADAPTER_CONFIG).write_bytes(exported_config((adapter / ADAPTER_CONFIG).read_bytes(), base))
        return out
    model, tokenizer = _merged(adapter, base)
    if fmt == "merged":
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        return out
    source = _source_gguf(base)
    assert source is not None
    path = out / f"{name}.gguf"
    write_gguf(model, source, path)
    return path


def _merged(adapter: Path, base: str) -> tuple[Any, Any]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32 if not torch.cuda.is_available() else "auto")
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return merged, AutoTokenizer.from_pretrained(base)


def _source_gguf(base: str) -> Path | None:
    """The GGUF file a converted base came from (``trainer/gguf_model.py`` notes it), if it is still there."""
    note = Path(base) / "burnish-source.json"
    if not note.is_file():
        return None
    source = Path(json.loads(note.read_text())["gguf"])
    return source if source.is_file() else None


def _permute(weight: Any, heads: int) -> Any:
    """llama.cpp's layout of a Llama q or k projection (its rotary halves interleaved), which
    transformers undoes when it reads the file."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(model: Any, source: Path, path: Path) -> None:
    """The merged ``model``'s weights as a float32 GGUF file with ``source``'s keys and tensor names."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    config = model.config
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), config.num_hidden_layers)
    weights = {}
    for key, tensor in model.state_dict().items():
        mapped = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            continue
        value = tensor.detach().to("cpu").float().numpy()
        if arch == "llama" and key.endswith("q_proj.weight"):
            value = _permute(value, config.num_attention_heads)
        elif arch == "llama" and key.endswith("k_proj.weight"):
            value = _permute(value, config.num_key_value_heads)
        weights[mapped] = value
    missing = [t.name for t in reader.tensors if t.name not in weights]
    if missing:
        raise ExportError(f"{source}: no merged weight for {missing[:5]}")

    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.ascontiguousarray(weights[tensor.name], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(path)
