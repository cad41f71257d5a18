"""A teacher vLLM serves must read token ids as the policy does: checked when it is set.

The trainer asks the teacher for its logprobs of the very ids the policy sampled (trainer/
teacher.py); under another tokenizer those ids would be other text, and the step would
quietly learn nonsense. So when a policy's ``train.teacher.model`` is set (created or
changed), the gateway asks vLLM's ``/tokenize`` to tokenize one probe text under the teacher
and under the policy's base model, and refuses the setting unless the ids are the same.
"""

from __future__ import annotations

import msgspec

from burnish_server.core.learning.policies import Policy
from burnish_server.core.platform.errors import Invalid
from burnish_server.gateway.upstream.client import Upstream, UpstreamError

# Words, digits, spaces, punctuation, accents and an emoji: tokenizers that differ differ here.
PROBE = "The teacher's tokens: 12345 + 678 = 13023; naïve café, 東京, emoji 🙂, tabs\tand\nnew lines."
TIMEOUT_S = 10.0
_HEADERS = [(b"content-type", b"application/json")]


class _Tokens(msgspec.Struct):
    tokens: list[int]


async def _tokens(upstream: Upstream, model: str) -> list[int] | str:
    """The probe's ids under ``model``, or why vLLM gave none."""
    replica = next((r.url for r in upstream.replicas.order(None, model) if r.healthy), None)
    if replica is None:
        return "no vLLM replica answers"
    body = msgspec.json.encode({"model": model, "prompt": PROBE, "add_special_tokens": False})
    try:
        response = await upstream.request("POST", replica, "/tokenize", body, _HEADERS, timeout=TIMEOUT_S)
        try:
            data = await response.aread()
        finally:
            await response.aclose()
    except UpstreamError as exc:
        return f"vLLM did not answer ({exc.message})"
    if response.status_code != 200:
        return f"vLLM does not serve it ({response.status_code}: {data[:200].decode(errors='replace')})"
    return msgspec.json.decode(data, type=_Tokens).tokens


async def check_teacher(upstream: Upstream, policy: Policy) -> None:
    """``Invalid`` (400 ``teacher_tokenizer``) unless the policy's served teacher, if any, tokenizes as its base model."""
    teacher = policy.train.teacher
    if teacher is None or teacher.model is None or teacher.model == policy.base_model:
        return
    theirs, ours = await _tokens(upstream, teacher.model), await _tokens(upstream, policy.base_model)
    for name, got in ((teacher.model, theirs), (policy.base_model, ours)):
        if isinstance(got, str):
            raise Invalid(f"train.teacher.model: could not check the tokenizer of {name!r}: {got}", "teacher_tokenizer", "train.teacher.model")
    if theirs != ours:
        raise Invalid(
            f"train.teacher.model: {teacher.model!r} tokenizes otherwise than the policy's base {policy.base_model!r}: "
            "a teacher scores the very token ids the policy sampled, so it must share its tokenizer (a sibling of the same family)",
            "teacher_tokenizer",
            "train.teacher.model",
        )
