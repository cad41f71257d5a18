"""Which chat template and tool-call parser ``burnish up`` starts vLLM with, per model
(serving/tool_calling.py), and what burnish's ChatML tool template writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from burnish_server.serving.tool_calling import CHATML_TOOLS, choose, default_system, tool_template
from burnish_server.trainer.tiny_model import CHAT_TEMPLATE as TINY_TEMPLATE

CHATML = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
LLAMA3 = "{% if tools %}{{ tools | tojson }}{% endif %}{{ '<|python_tag|>' }}"


def folder(tmp_path: Path, template: str | None = None, config: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    if template is not None:
        (path / "chat_template.jinja").write_text(template)
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_a_model_whose_own_template_renders_tools_keeps_it_with_the_parser_its_format_names(tmp_path: Path) -> None:
    tools = choose(folder(tmp_path, TINY_TEMPLATE), [])
    assert (tools.parser, tools.template, tools.strict) == ("hermes", None, False)
    assert tools.flags() == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert "own chat template, parser hermes" in tools.note


def test_a_template_list_in_the_tokenizer_config_counts(tmp_path: Path) -> None:
    config = {"chat_template": [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": LLAMA3}]}
    assert choose(folder(tmp_path, config=config), []).parser == "llama3_json"


def test_what_the_user_names_is_used_as_given(tmp_path: Path) -> None:
    for args in (["--tool-call-parser=pythonic"], ["--chat-template", "t.jinja"], ["--enable-auto-tool-choice"]):
        tools = choose(folder(tmp_path, TINY_TEMPLATE) if not (tmp_path / "model").exists() else tmp_path / "model", args)
        assert tools.flags() == [] and "given with --vllm-arg" in tools.note


def test_a_converted_chatml_model_without_tools_gets_burnishs_template(tmp_path: Path) -> None:
    model = folder(tmp_path, CHATML)
    tools = choose(model, [], converted=True)
    assert tools.parser == "hermes" and tools.strict and tools.template == tmp_path / "model-tools.jinja"
    assert tools.template.read_text() == CHATML_TOOLS.read_text()  # no default system prompt of its own
    assert tools.flags()[-2:] == ["--tool-strict-level", "parameter"]


# A ChatML template that adds a system prompt of its own when a conversation has none, as
# SmolLM2-Instruct's does (written with the dict access and loop variables such templates use).
CHATML_DEFAULT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are \"helpful\".<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_converted_model_keeps_the_default_system_prompt_its_own_template_adds(tiny_model: Path, tmp_path: Path) -> None:
    """Whatever path loaded it (the embedded default or a GGUF file named by path): without
    tools, burnish's template renders a conversation as the model's own does, its default
    system prompt included."""
    from transformers import AutoTokenizer

    assert default_system(CHATML_DEFAULT) == 'You are "helpful".'
    assert default_system(CHATML) is None and default_system("{{ raise_exception('no') }}") is None and default_system("{% if %}") is None
    tools = choose(folder(tmp_path, CHATML_DEFAULT), [], converted=True)
    assert tools.template is not None
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    for messages in ([{"role": "user", "content": "hi"}], [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]):
        own = tokenizer.apply_chat_template(messages, chat_template=CHATML_DEFAULT, tokenize=False, add_generation_prompt=True)
        assert tokenizer.apply_chat_template(messages, chat_template=tools.template.read_text(), tokenize=False, add_generation_prompt=True) == own


@pytest.mark.parametrize("template", [CHATML, None])
def test_a_named_model_that_shows_no_tools_gets_no_parser_and_says_how_to_name_one(tmp_path: Path, template: str | None) -> None:
    tools = choose(folder(tmp_path, template), [])
    assert tools.flags() == [] and "--vllm-arg=--tool-call-parser=NAME" in tools.note


def test_burnishs_template_renders_tools_calls_and_results_as_the_hermes_parser_reads_them(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    template = tool_template("Default.", tmp_path / "t.jinja").read_text()
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}
    messages = [
        {"role": "user", "content": "Q"},
        # As vLLM hands them to the template: arguments parsed into a dict (and a string stays as sent).
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"word": "a b"}}}]},
        {"role": "tool", "content": "1"},
        {
            "role": "assistant",
            "content": "Two.",
            "tool_calls": [{"function": {"name": "lookup", "arguments": '{"word":"c"}'}}, {"function": {"name": "lookup", "arguments": {}}}],
        },
        {"role": "tool", "content": "2"},
        {"role": "tool", "content": "3"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=[tool], chat_template=template, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nDefault.\n\nYou can call these tools.")
    assert '\n<tools>\n{"name": "lookup", "parameters": ' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "lookup", "arguments": {"word": "a b"}}\n</tool_call><|im_end|>\n' in text
    assert (
        '<|im_start|>assistant\nTwo.<tool_call>\n{"name": "lookup", "arguments": {"word":"c"}}\n</tool_call><tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    # No system prompt, no default, no tools: no system turn at all.
    bare = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}], chat_template=CHATML_TOOLS.read_text(), tokenize=False)
    assert bare == "<|im_start|>user\nQ<|im_end|>\n"
