"""A trained version's LoRA adapter as a zip download (the admin API and the dashboard's
version row): peft's two files, the config pointed at the policy's base. The gateway reads the
checkpoint folder the trainer wrote (a data directory both see), streams the zip without
compressing (safetensors do not compress) and never holds the weights in memory. Merged weights
and GGUF files need torch: ``burnish export`` writes them."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

from litestar.response import Stream

from burnish_server.core.learning.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, exported_config
from burnish_server.core.platform.errors import NotFound
from burnish_server.core.platform.ids import adapter_name
from burnish_server.gateway.services import Services
from burnish_server.store import policies as store

CHUNK = 1 << 20


class _Sink(io.RawIOBase):
    """What zipfile writes, kept until the stream takes it (zipfile writes data descriptors
    to a stream it cannot seek)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.chunks.append(bytes(b))
        return len(b)

    def take(self) -> bytes:
        out = b"".join(self.chunks)
        self.chunks.clear()
        return out


def _zipped(config: bytes, weights: Path) -> Iterator[bytes]:
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(ADAPTER_CONFIG, config)
        with weights.open("rb") as src, z.open(ADAPTER_WEIGHTS, "w", force_zip64=True) as dst:
            while block := src.read(CHUNK):
                dst.write(block)
                yield sink.take()
    yield sink.take()


async def adapter_zip(svc: Services, name: str, step: int) -> Stream:
    policy = await svc.db.read(store.get_policy, name)
    steps = await svc.db.read(store.list_steps, name)
    found = next((s for s in steps if s.step == step), None)
    if found is None:
        raise NotFound(f"policy {name!r} has no step {step} (step 0 is the base model, with no adapter)", "checkpoint_not_found", "step")
    folder = Path(found.checkpoint) / "adapter"
    if not (folder / ADAPTER_WEIGHTS).is_file() or not (folder / ADAPTER_CONFIG).is_file():
        raise NotFound(f"{adapter_name(name, step)}'s adapter is not in {folder} on this gateway's machine", "checkpoint_not_found", "step")
    config = exported_config((folder / ADAPTER_CONFIG).read_bytes(), policy.model_path or policy.base_model)
    filename = f"{name}-{step}-adapter.zip"
    return Stream(
        _zipped(config, folder / ADAPTER_WEIGHTS), media_type="application/zip", headers={"content-disposition": f'attachment; filename="{filename}"'}
    )
