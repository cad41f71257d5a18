"""A trained version's adapter as it leaves burnish: the files of peft's adapter folder, and
its config pointed at the base it was trained on (so ``PeftModel.from_pretrained`` finds the
base by itself). Used by ``burnish export`` (trainer/export.py) and the admin API's download
(gateway/policies/downloads.py) alike."""

from __future__ import annotations

import json

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)


def exported_config(config: bytes, base: str) -> bytes:
    """peft's adapter config with ``base_model_name_or_path`` set to ``base``."""
    values = json.loads(config)
    values["base_model_name_or_path"] = base
    return json.dumps(values, indent=2).encode()
