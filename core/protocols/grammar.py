"""Whether a recorded call was sampled under a grammar, read from the request its client sent.

vLLM applies a structured-output grammar to the logits before it samples and before it
computes the logprobs it returns (``--logprobs-mode`` chooses only what comes after), so a
token sampled under one is recorded with its logprob renormalised over the tokens the
grammar allowed: higher than the model's own, and 0 where one token was allowed. The trainer
computes the model's own. Such a call's recorded logprobs are therefore of another
distribution than the trainer's, and no ratio between the two says how far the policy moved
(docs/trainer.md, "The ratio under a grammar").

vLLM 0.32 holds a call to a grammar when it asks for
- a tool call: ``tool_choice`` "required" or a named tool (Anthropic's "any" or "tool"), with
  tools; or tools offered under "auto": the call the model chooses to write is held by the
  structural tag where a tool is ``strict``, and wherever the server was started with
  ``--tool-strict-level function`` or ``parameter``, as ``burnish up`` starts it for a model
  that takes its tool template (serving/tool_calling.py). The request cannot say which server
  sampled it, so tools offered are held unless ``tool_choice`` is "none";
- a format: ``response_format`` (Responses: ``text.format``; Anthropic: ``output_format``) of
  type ``json_schema`` or ``json_object``;
- vLLM's own fields: ``structured_outputs``, or the older ``guided_*`` ones.

The answer errs towards "held": a call wrongly held trains with a ratio against the trainer's
own logprob (1 at staleness 0), which costs only the correction for how far vLLM's numerics
differ from the trainer's; a call wrongly free trains with the grammar's bias.
"""

from __future__ import annotations

from typing import Any

import msgspec

_FORMATS = {"json_schema", "json_object"}
_VLLM_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend")


def held(request: bytes) -> bool:
    """Whether the request (any surface's: chat completions, completions, Responses, Messages)
    asked vLLM for a grammar. An unreadable request is held: see the module's note."""
    try:
        body = msgspec.json.decode(request)
    except msgspec.DecodeError:
        return True
    if not isinstance(body, dict):
        return True
    if any(body.get(name) is not None for name in _VLLM_FIELDS):
        return True
    if _format(body.get("response_format")) or _format(body.get("output_format")):
        return True
    text = body.get("text")
    if isinstance(text, dict) and _format(text.get("format")):
        return True
    return _tools_held(body.get("tools"), body.get("tool_choice"))


def _format(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") in _FORMATS


def _tools_held(tools: Any, choice: Any) -> bool:
    if not isinstance(tools, list) or not tools:
        return False
    kind = choice.get("type") if isinstance(choice, dict) else choice
    return kind != "none"
