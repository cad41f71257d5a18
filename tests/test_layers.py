"""The layer contract: each layer imports only downward; the gateway never loads torch, the
trainer never loads Litestar. Checked statically (import-linter, the contracts in
pyproject.toml) and at run time in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def loaded_after(module: str, *watch: str) -> list[str]:
    """Which of ``watch`` a fresh interpreter has loaded after importing ``module``."""
    code = f"import sys, {module}; print(' '.join(m for m in {watch!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_gateway_never_loads_torch() -> None:
    assert loaded_after("burnish_server.gateway.app", "torch", "transformers", "peft", "burnish_server.trainer") == []


def test_the_trainer_never_loads_litestar() -> None:
    assert loaded_after("burnish_server.trainer.worker", "litestar", "uvicorn", "burnish_server.gateway") == []


def test_the_domain_loads_no_framework() -> None:
    # Every module of every room of core/ (core/protocols/surfaces/chat.py -> burnish_server.core.protocols.surfaces.chat).
    paths = [p.relative_to(ROOT).with_suffix("") for p in (ROOT / "core").rglob("*.py") if not p.name.startswith("_")]
    modules = [".".join(("burnish_server", *p.parts)) for p in paths]
    assert len(modules) > 30 and "burnish_server.core.protocols.wire" in modules, modules
    code = f"import sys; import {', '.join(modules)}; print(' '.join(m for m in ('sqlalchemy', 'litestar', 'httpx', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0 and out.stdout.split() == [], out.stderr or out.stdout


def lint_imports() -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT)


def lint_with_probe(probe: Path, imported: str) -> str:
    """import-linter's report with ``probe`` importing ``imported`` (it must break a contract),
    its lines unwrapped."""
    probe.write_text(f"import {imported}  # a deliberate wrong-way import\n")
    try:
        broken = lint_imports()
    finally:
        probe.unlink()
    assert broken.returncode != 0, broken.stdout[-3000:]
    return " ".join(broken.stdout.split())  # import-linter wraps its lines


def test_the_layer_contract_holds_and_catches_a_wrong_way_import() -> None:
    assert LINT_IMPORTS.exists(), "import-linter is not installed: make test installs it (the lint extra)"
    kept = lint_imports()
    assert kept.returncode == 0, kept.stdout[-3000:]
    # A module of the domain that imports the gateway: the contract must break on it.
    said = lint_with_probe(ROOT / "core" / "_wrong_way_probe.py", "burnish_server.gateway.app")
    assert "burnish_server.core._wrong_way_probe -> burnish_server.gateway.app" in said, said[-3000:]


def test_the_domains_rooms_import_one_way() -> None:
    """platform < protocols < learning < api (docs/architecture.md): a room importing upward breaks the lint."""
    said = lint_with_probe(ROOT / "core" / "platform" / "_wrong_way_probe.py", "burnish_server.core.learning.policies")
    assert "The domain's rooms: each imports only the rooms below it BROKEN" in said, said[-3000:]
    assert "burnish_server.core.platform._wrong_way_probe -> burnish_server.core.learning.policies" in said, said[-3000:]


def test_no_module_imports_litestars_private_api() -> None:
    """Every Litestar import names public modules only (none with a segment starting ``_``):
    the lint bans the private modules there are today; this catches any."""
    import ast

    found = []
    for path in ROOT.glob("*/**/*.py"):
        if path.parts[len(ROOT.parts)] in {".venv", ".tools", "tests", "bench", "examples"}:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name.split(".")[0] == "litestar" and any(part.startswith("_") for part in name.split(".")[1:]):
                    found.append(f"{path.relative_to(ROOT)}: {name}")
    assert not found, found


LAYERS = ("core", "store", "serving", "telemetry", "gateway", "trainer", "migrations", "cli")


def test_every_error_is_under_the_one_tree() -> None:
    """Every exception class the product defines subclasses ``core/platform/errors.py: BurnishError``
    (docs/architecture.md, "Errors"), but the CLI's click exceptions, its edge as the gateway's
    error handlers are the gateway's."""
    code = f"""
import importlib, pkgutil, sys
from burnish_server.core.platform.errors import BurnishError
import click
for layer in {LAYERS!r}:
    package = importlib.import_module("burnish_server." + layer)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        # Not the migrations (Alembic binds their context only while it migrates), nor `python -m`'s entry.
        if not info.name.startswith("burnish_server.migrations.") and not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
seen, stack, outside = set(), [Exception], []
while stack:
    for sub in stack.pop().__subclasses__():
        if sub not in seen:
            seen.add(sub)
            stack.append(sub)
            if sub.__module__.startswith("burnish_server.") and not issubclass(sub, (BurnishError, click.ClickException)):
                outside.append(sub.__module__ + "." + sub.__qualname__)
print(" ".join(sorted(outside)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [], out.stdout
