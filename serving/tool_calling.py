"""Tool calls on every model ``burnish up`` serves: which chat template shows the model its
tools, and which of vLLM's tool-call parsers reads its calls.

vLLM refuses a request with ``tools`` (any ``tool_choice``) unless it was started with
``--enable-auto-tool-choice --tool-call-parser NAME``, and a parser only finds calls written
in its own format, which the chat template must show the model. So the two are chosen
together, in this order:

1. The user named a parser or a template (``--vllm-arg=--tool-call-parser=...`` or
   ``--chat-template``): theirs, as given; nothing is added.
2. A model whose own template renders tools: that template, and the parser its call format
   names (``<tool_call>``: hermes; ``<|python_tag|>``: llama3_json; ``[TOOL_CALLS]``: mistral).
3. A GGUF file (the embedded SmolLM2 is one) whose own template is ChatML without tools:
   burnish's ChatML tool template (``templates/chatml-tools.jinja``) and the ``hermes`` parser.
   It takes the default system prompt the model's own template adds to a conversation that
   has none (SmolLM2's does), read by rendering that template, so that a conversation without
   tools renders exactly as the model's own template renders it.
4. Anything else: no parser, and ``burnish up`` says how to name one.

With burnish's template, ``--tool-strict-level parameter`` holds every call to its tool's
schema (vLLM's structural tag: ``<tool_call>``, a tool's name, arguments that fit its
parameters), whatever ``tool_choice`` says: a small model's forced calls then always parse.
A model's own template keeps vLLM's default level (the ``strict`` field of each tool).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"
CHATML_TOOLS = TEMPLATES / "chatml-tools.jinja"
# A call format in a template, and the vLLM parser that reads it.
CALL_FORMATS = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"), ("[TOOL_CALLS]", "mistral"))
USER_FLAGS = ("--tool-call-parser", "--chat-template", "--enable-auto-tool-choice")


@dataclass(frozen=True)
class ToolCalling:
    """The vLLM flags for tool calls, and one line saying what was chosen and why."""

    parser: str | None
    template: Path | None  # None: the model's own
    note: str
    strict: bool = False  # hold every call's arguments to its tool's schema

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.template is not None:
            out += ["--chat-template", str(self.template)]
        if self.parser is not None:
            out += ["--enable-auto-tool-choice", "--tool-call-parser", self.parser]
        if self.strict:
            out += ["--tool-strict-level", "parameter"]
        return out


def tool_template(default_system: str | None, into: Path) -> Path:
    """burnish's ChatML tool template, with ``default_system`` as the system prompt of a
    conversation that has none, written to ``into`` (vLLM reads templates from files)."""
    preamble = "" if default_system is None else "{%- set default_system = " + json.dumps(default_system) + " -%}\n"
    text = preamble + CHATML_TOOLS.read_text()
    if not into.exists() or into.read_text() != text:
        into.parent.mkdir(parents=True, exist_ok=True)
        into.write_text(text)
    return into


# A user message no template would write itself, to find where the model's own template put it.
_PROBE = "\x1fburnish-probe\x1f"
_SYSTEM_BLOCK = re.compile(r"^<\|im_start\|>system\n(.*?)<\|im_end\|>\n", re.S)


def default_system(template: str) -> str | None:
    """The system prompt a ChatML template adds to a conversation that has none (SmolLM2's
    "You are a helpful AI assistant named SmolLM, ..."), read by rendering the template as
    transformers does (a sandbox, trimmed blocks); None where it adds none or cannot render."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = json.dumps
    try:
        text = env.from_string(template).render(
            messages=[{"role": "user", "content": _PROBE}], add_generation_prompt=False, raise_exception=raise_exception, bos_token="", eos_token=""
        )
    except Exception:  # a template written for another renderer: no default is taken from it
        return None
    found = _SYSTEM_BLOCK.match(text)
    return found.group(1) if found is not None and _PROBE not in found.group(1) else None


def served_template_path(model: Path) -> Path:
    """Where ``choose`` writes burnish's tool template for a model folder it serves with it."""
    return model.with_name(model.name + "-tools.jinja")


def served_template(model: Path) -> str | None:
    """The chat template vLLM serves a model folder with, where it is not the folder's own
    (burnish's tool template, written by ``choose``); None: the model's own. The trainer renders
    demonstrations and teacher prompts with it, so they are the tokens vLLM reads."""
    path = served_template_path(model)
    return path.read_text() if path.is_file() else None


def own_template(model: Path) -> str | None:
    """The chat template in a Hugging Face model folder (chat_template.jinja, or
    tokenizer_config.json's, where a list of named templates counts as all of them)."""
    jinja = model / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = model / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else None


def call_parser(template: str) -> str | None:
    """The parser for a template that renders tools, by the call format it writes."""
    if "tools" not in template:
        return None
    return next((parser for mark, parser in CALL_FORMATS if mark in template), None)


def named_by_user(vllm_args: Sequence[str]) -> bool:
    return any(arg.split("=", 1)[0] in USER_FLAGS for arg in vllm_args)


def choose(model: Path | None, vllm_args: Sequence[str], *, converted: bool = False) -> ToolCalling:
    """What vLLM is started with for tool calls. ``model``: the local folder served (None for a
    hub id whose files are not here); ``converted``: the folder came from a GGUF file."""
    if named_by_user(vllm_args):
        return ToolCalling(None, None, "tool calls: the parser and template given with --vllm-arg")
    template = own_template(model) if model is not None else None
    parser = call_parser(template) if template else None
    if parser is not None:
        return ToolCalling(parser, None, f"tool calls: the model's own chat template, parser {parser}")
    if converted and template is not None and "<|im_start|>" in template and model is not None:
        path = tool_template(default_system(template), served_template_path(model))
        note = f"tool calls: burnish's ChatML tool template ({path}; the model's own renders no tools), parser hermes, arguments held to each tool's schema"
        return ToolCalling("hermes", path, note, strict=True)
    why = "its chat template renders no tools" if template else "no chat template was found for it here"
    return ToolCalling(
        None,
        None,
        f"tool calls: none ({why}): vLLM answers a call with tools 400; name a parser and a template that shows tools: "
        "--vllm-arg=--tool-call-parser=NAME --vllm-arg=--chat-template=FILE",
    )
