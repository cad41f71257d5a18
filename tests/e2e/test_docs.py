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


# How a hand-written page may write a default that is empty or null.
NOTHING = {"–", "-", "empty", "null", "none", "–(off)"}


def stated(text: str, value: object) -> bool:
    """Whether ``text`` (a table cell of a hand-written page) states ``value``, the code's
    default: the cell's value before any parenthesis, code marks and quotes aside."""
    cell = re.split(r" \(", text.strip())[0] if not text.strip().startswith("(") else text.strip()
    cell = cell.strip().strip("`").strip('"').strip()
    if value is None or value == "":
        return cell.lower().replace(" ", "") in NOTHING or cell.startswith("SQLite")
    if isinstance(value, bool):
        return cell.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(cell) == float(value)
        except ValueError:
            return False
    if isinstance(value, (tuple, list)):
        return cell.replace(" ", "").strip("()[]") in (",".join(map(str, value)), " ".join(map(str, value)).replace(" ", ""))
    return cell.lower() == str(value).lower()


def test_the_settings_page_states_the_codes_defaults() -> None:
    """A default written by hand in docs/settings.md is the code's: a changed default fails here
    until the page says it (the reference pages are generated: docs/reference.py)."""
    from msgspec import inspect as mi

    from burnish_server.core.learning.policies import LoraSettings, PromotionSettings, RulerSettings, ServingSettings, TrainSettings
    from burnish_server.core.platform.settings import Settings

    def defaults(struct: type, name=lambda f: f) -> dict[str, object]:
        fields = mi.type_info(struct).fields  # type: ignore[attr-defined]
        return {name(f.name): f.default if f.default is not mi.NODEFAULT else f.default_factory() for f in fields}

    code = {
        **defaults(Settings, lambda f: f"BURNISH_{f.upper()}"),
        **{k: v for s in (TrainSettings, LoraSettings, PromotionSettings, RulerSettings, ServingSettings) for k, v in defaults(s).items()},
    }
    checked, wrong = 0, []
    for row in re.findall(r"^\| (.+?) \| (.+?) \|", (ROOT / "docs" / "settings.md").read_text(), re.M):
        names = [n for n in re.findall(r"`([A-Za-z_]+)`", row[0]) if n in code]
        if not names:
            continue
        values = [row[1]] * len(names) if len(names) > 1 and "," not in row[1] else re.split(r",\s*(?![^()]*\))", row[1])
        for name, text in zip(names, values):
            checked += 1
            if not stated(text, code[name]):
                wrong.append(f"{name}: the page says {text!r}, the code {code[name]!r}")
    assert checked > 100 and not wrong, "\n".join(wrong)


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


def test_the_reference_pages_are_generated_from_the_code() -> None:
    """docs/reference/ is what docs/reference.py writes from the code as it is now: a changed
    default, comment, error code or metric fails here until it is run (make docs runs it)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("reference", ROOT / "docs" / "reference.py")
    assert spec is not None and spec.loader is not None
    reference = sys.modules["reference"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    pages = {name: re.sub(r"\n{3,}", "\n\n", text) for name, text in reference.generate().items()}
    for name, text in pages.items():
        assert (ROOT / "docs" / "reference" / name).read_text() == text, f"docs/reference/{name} is out of date: run .venv/bin/python docs/reference.py"
    assert "`BURNISH_TRAINER_LEASE` | number | `900.0` |" in pages["settings.md"]
    assert "| `NotFound` | 404 |" in pages["errors.md"] and "`policy_not_found`" in pages["errors.md"]
    assert "- `reward(trajectory_id: str, value: float, **components: float) -> Any`: Post a trajectory's reward" in pages["sdk.md"]
    assert "`burnish_requests_total` | counter |" in pages["metrics.md"] and "| `teacher_pairs`, `teacher_pairs_against` |" in pages["metrics.md"]
