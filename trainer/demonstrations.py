"""A posted demonstration (core/learning/demonstrations.py) as a training sequence: the conversation
rendered with the chat template vLLM serves the model with, its assistant turns the only
tokens trained.

    messages ──(for each assistant turn i)──▶ render(messages[:i], add_generation_prompt)   the context
                                              render(messages[:i + 1])                       + the turn
    the turn's tokens: what the second render adds to the first, up to the end-of-turn token

Each render must extend the one before it (the template writes earlier turns the same way
whatever follows them), or the conversation has no one tokenisation to train: the
demonstration is skipped and counted with the untokenized calls, never guessed. A turn's
tokens stop at the template's end-of-turn token (the tokenizer's end of sequence, where a
generation stops): what follows it is the template's, never sampled by the model. Tool
results, user turns and system prompts are context (mask 0).
"""

from __future__ import annotations

from typing import Any

from burnish_server.core.protocols.records import CallRecord
from burnish_server.core.protocols.transcript import UnreadableCall, exchange
from burnish_server.trainer.sequences import Sequence


class Demonstrations:
    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tokenizer, self.template = tokenizer, template  # template: vLLM's where not the tokenizer's (serving/tool_calling.py: served_template)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=prompt, tokenize=True, return_dict=False, chat_template=self.template
        )
        return list(ids)

    def sequence(self, call: CallRecord) -> Sequence | None:
        """The demonstration's sequence, imitated and nothing else; None where it cannot be rendered faithfully."""
        try:
            turn = exchange(call)
        except UnreadableCall:
            return None
        messages = [m.chat() for m in [*turn.prompt, *turn.answers[:1]]]
        out = Sequence(grpo=False, imitate=True)
        end = self.tokenizer.eos_token_id
        try:
            for i, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                context, whole = self.render(messages[:i], turn.tools, True), self.render(messages[: i + 1], turn.tools, False)
                if context[: len(out.tokens)] != out.tokens or whole[: len(context)] != context:
                    return None  # a template that rewrites earlier turns: no one tokenisation
                said = whole[len(context) :]
                if end in said:
                    said = said[: said.index(end) + 1]
                out.add(context[len(out.tokens) :], said, None)
        except Exception:  # a template that refuses the conversation (jinja's own errors)
            return None
        return out if out.sampled else None
