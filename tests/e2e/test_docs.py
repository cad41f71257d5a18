"""The commands the README and docs/ tell a user to type work as written.

Every shell block (```bash) of README.md and docs/*.md is read, line continuations joined and
comments dropped, and each command in it checked against what it names:

- ``burnish ...``: the command, its subcommands and every option exist and parse (click's own
  parser, as the shell would hand them over); ``burnish-tasks ...`` the same (its argparse);
- ``make TARGET``: the Makefile has the target; ``VAR=value`` arguments are variables it reads;
- ``pip install '.[extra]'`` / ``'./sdk[extra]'``: the package's pyproject has the extra;
- ``curl ... URL``: the gateway serves the URL's path with that method (its route table);
- ``python path/to/script.py``: the script is in the repository.

Relative links between the docs, anchors included, must land on a file and a heading.
Running the commands themselves (burnish up, a training run) is what the other tests do.
"""

from __future__ import annotations

import functools
import re
import shlex
import tomllib
from pathlib import Path

import click
import pytest

from burnish.tasks.cli import arguments as burnish_tasks
from burnish_server.cli.main import main as burnish

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "notes").glob("*.md"))]
SHELL_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def commands(doc: Path) -> list[list[str]]:
    """Each command of each shell block, as the shell would split it."""
    out = []
    for block in SHELL_BLOCK.findall(doc.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError as exc:  # an unbalanced quote: not what a shell takes either
                raise AssertionError(f"{doc.name}: {line!r}: {exc}") from None
            command: list[str] = []
            for word in [*words, "&&"]:
                if word in ("&&", "||", ";", "|"):
                    if command:
                        out.append(command)
                    command = []
                else:
                    command.append(word)
    return out


ALL = [(doc.name, c) for doc in DOCS for c in commands(doc)]


def _ids(case: tuple[str, list[str]]) -> str:
    return f"{case[0]}: {' '.join(case[1])[:60]}"


def test_the_guide_has_commands_to_check() -> None:
    names = {name for name, c in ALL}
    assert {"README.md", "your-agent.md"} <= names
    assert sum(1 for _, c in ALL if c[0] == "burnish") >= 10


@pytest.mark.parametrize("case", [c for c in ALL if c[1][0] == "burnish"], ids=_ids)
def test_burnish_commands_parse(case: tuple[str, list[str]]) -> None:
    doc, words = case
    try:
        ctx = burnish.make_context("burnish", words[1:])
        command: click.Command = burnish
        args = [*ctx.protected_args, *ctx.args]
        while isinstance(command, click.Group) and args:
            name, sub, args = command.resolve_command(ctx, args)
            assert sub is not None, (doc, words)
            ctx = sub.make_context(name or "", args, parent=ctx)
            command, args = sub, [*getattr(ctx, "protected_args", []), *ctx.args]
    except click.BadParameter as exc:  # a file of the reader's own that is not here
        assert "does not exist" in str(exc), (doc, words, exc)


@pytest.mark.parametrize("case", [c for c in ALL if c[1][0] == "burnish-tasks"], ids=_ids)
def test_burnish_tasks_commands_parse(case: tuple[str, list[str]]) -> None:
    doc, words = case
    try:
        burnish_tasks().parse_args(words[1:])
    except SystemExit as exc:  # argparse's way of refusing
        raise AssertionError(f"{doc}: {' '.join(words)}") from exc


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M)
    return set(phony.group(1).split()) if phony else set()


@pytest.mark.parametrize("case", [c for c in ALL if c[1][0] == "make"], ids=_ids)
def test_make_targets_exist(case: tuple[str, list[str]]) -> None:
    doc, words = case
    text = (ROOT / "Makefile").read_text()
    for word in words[1:]:
        if "=" in word:
            assert f"$({word.split('=', 1)[0]})" in text, (doc, word)
        else:
            assert word in _make_targets(), (doc, word)


def _extras(pyproject: Path) -> set[str]:
    return set(tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {}))


@pytest.mark.parametrize("case", [c for c in ALL if c[1][:2] == ["pip", "install"]], ids=_ids)
def test_pip_installs_name_extras_that_exist(case: tuple[str, list[str]]) -> None:
    """burnish is installed from a checkout ('.[extra]', './sdk[extra]'): it is not on the package index."""
    doc, words = case
    for word in words[2:]:
        assert not word.startswith("burnish"), f"{doc}: pip install {word}: burnish is not on the package index; from a checkout: '.[extra]'"
        found = re.fullmatch(r"(\.|\./sdk)\[([\w,-]+)\]", word)
        if found:
            extras = _extras(ROOT / ("sdk/pyproject.toml" if found.group(1) == "./sdk" else "pyproject.toml"))
            assert set(found.group(2).split(",")) <= extras, (doc, word, extras)


@functools.cache
def _routes() -> list[tuple[set[str], re.Pattern[str]]]:
    from burnish_server.core.platform.settings import Settings
    from burnish_server.gateway.app import create_app

    app = create_app(Settings.load({}, upstream="http://127.0.0.1:9"))
    routes = []
    for route in app.litestar.routes:
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(route.path))
        routes.append((set(getattr(route, "methods", {"GET"})), re.compile(f"^{pattern}$")))
    return routes


@pytest.mark.parametrize("case", [c for c in ALL if c[1][0] == "curl"], ids=_ids)
def test_curl_commands_reach_a_route(case: tuple[str, list[str]]) -> None:
    doc, words = case
    method = next((words[i + 1] for i, w in enumerate(words) if w in ("-X", "--request")), None)
    if method is None:
        method = "POST" if any(w in ("-d", "--data", "--json") for w in words) else "GET"
    urls = [w for w in words if re.match(r"^(https?://[^/\s]+|localhost:\d+|127\.0\.0\.1:\d+)/", w)]
    assert urls, (doc, words)
    path = re.sub(r"^(https?://)?[^/]+", "", urls[0]).split("?")[0]
    path = re.sub(r"\$\{?\w+\}?", "x", path)  # a shell variable in the path: any id
    assert any(method in methods and pattern.match(path) for methods, pattern in _routes()), f"{doc}: {method} {path} is no route"


@pytest.mark.parametrize("case", [c for c in ALL if re.search(r"(^|/)python3?$", c[1][0]) and len(c[1]) > 1], ids=_ids)
def test_scripts_exist(case: tuple[str, list[str]]) -> None:
    doc, words = case
    script = words[1]
    if script.startswith("-"):
        return
    assert (ROOT / script).is_file(), (doc, script)


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_links_between_the_docs_land(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target):  # another site: not ours to check
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{doc.name}: {target}"
        if anchor and path.suffix == ".md":
            headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}
            assert anchor in headings, f"{doc.name}: {target}"


def test_the_settings_reference_names_every_setting() -> None:
    """docs/settings.md is the one list: every server setting as its variable, every field of a
    policy's settings in its section."""
    import msgspec

    from burnish_server.core.learning.policies import LoraSettings, PromotionSettings, RulerSettings, ServingSettings, TrainSettings
    from burnish_server.core.platform.settings import Settings

    text = (ROOT / "docs" / "settings.md").read_text()
    missing = [f"BURNISH_{f.name.upper()}" for f in msgspec.structs.fields(Settings) if f"`BURNISH_{f.name.upper()}`" not in text]
    assert not missing, f"docs/settings.md lacks {missing}"
    sections = dict(re.findall(r"^## (.*?)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    for title, struct in (
        ("A policy: `train` and `lora`", TrainSettings),
        ("A policy: `train` and `lora`", LoraSettings),
        ("A policy: `promotion`", PromotionSettings),
        ("A policy: `ruler`", RulerSettings),
        ("A policy: `serving`", ServingSettings),
    ):
        absent = [f.name for f in msgspec.structs.fields(struct) if f"`{f.name}`" not in sections[title]]
        assert not absent, f"docs/settings.md, {title}, lacks {absent}"


def test_the_docs_site_builds_strictly_and_a_broken_anchor_fails_it(tmp_path: Path) -> None:
    """`make docs`: MkDocs builds the site from docs/ offline; a link to a heading that is not
    there fails the build, as CI runs it."""
    import os
    import shutil
    import subprocess
    import sys

    def build(root: Path) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=root, env=env, capture_output=True, text=True, timeout=300)

    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    built = build(tmp_path)
    assert built.returncode == 0, built.stderr
    assert "What burnish is" in (tmp_path / "site" / "index.html").read_text()
    concepts = tmp_path / "docs" / "concepts.md"
    concepts.write_text(concepts.read_text() + "\nSee [the loss](trainer.md#no-such-heading).\n")
    broken = build(tmp_path)
    assert broken.returncode != 0 and "no-such-heading" in broken.stderr
