"""A tiny causal LM made locally: Qwen2 architecture, random weights, a byte-level BPE
tokenizer trained on a small built-in corpus, and a ChatML chat template with tools.

Nothing is downloaded. vLLM, transformers and peft load the result like any hub model,
which is what lets the whole loop (serving, LoRA hot swap, training) run on a laptop
and in CI. The same seed writes the same files.

Why these numbers: at transformers' default ``initializer_range`` (0.02) the output
distribution of a random model is nearly flat and out of a LoRA's reach; at 0.1 a
40-step GRPO run on the digit-share task rose from 0.06 to 0.5.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Fixed ids: the special tokens come first in the vocabulary.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Single tokens so that vLLM's hermes tool-call parser can find them.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# ChatML, as Qwen2.5 writes it, with tools in <tools> and calls in <tool_call>. Every piece
# of output is an expression, so Jinja's whitespace control cannot eat a newline.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures are within <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return a JSON object with name and arguments within <tool_call></tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A small corpus: enough text, digits, JSON and chat markup for a BPE worth having.
_CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "An agent reads the task, calls a tool, reads the result and answers.",
    "Count from one to ten: 1 2 3 4 5 6 7 8 9 10.",
    "The answer is 42. The total is 1337. Call 555-0199 at 09:30.",
    '{"name": "search", "arguments": {"query": "weather in Paris"}}',
    '{"name": "calculator", "arguments": {"expression": "12 * 7"}}',
    "user: What is two plus two? assistant: Two plus two is four, 4.",
    "Reinforcement learning rewards the answers that reach the goal.",
    "Write a short reply. Be brief, be correct, and use digits where you can.",
    "def add(a, b):\n    return a + b\n",
    "SELECT id, reward FROM trajectories WHERE group_id = 'g1';",
    "Once upon a time there was a small model that learned from its own traffic.",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday",
    "January February March April May June July August September October November December",
    "yes no maybe ok done error retry success failure true false null",
    '<tool_call>\n{"name": "lookup", "arguments": {"id": 7}}\n</tool_call>',
    '<tool_response>\n{"result": 49}\n</tool_response>',
]


def corpus() -> list[str]:
    """The built-in training text for the tokenizer (and a brief pre-training, if wanted)."""
    digits = [" ".join(str(i * j) for j in range(1, 13)) for i in range(1, 13)]
    return _CORPUS_LINES * 4 + digits


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2  # head_dim 64: supported by every vLLM CPU attention backend
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    initializer_range: float = 0.1


def build_tokenizer(vocab_size: int):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + TOOL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=4096,
    )


def make_tiny_model(path: str | Path, *, seed: int = 0, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write the model to ``path`` (a directory) and return it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "burnish-tiny-model.json").write_text(json.dumps({"seed": seed, **spec.__dict__}, indent=2) + "\n")
    return path
