"""vLLM as a teacher: the log-probability a model it serves gives each token of a sequence.

``logprobs`` asks ``/v1/completions`` for ``prompt_logprobs``: vLLM's log-probability of every
prompt token given the ones before it, the token itself always among those returned. The
teacher reads the ids the policy sampled, so it must share the policy's tokenizer (the
gateway checks it when a teacher is set: gateway/policies/teachers.py).
"""

from __future__ import annotations

from typing import Any

import httpx

from burnish_server.core.platform.errors import Unavailable

# Prompts per request: one forward pass of vLLM's over a batch of sequences.
PER_REQUEST = 32


class ScoringError(Unavailable, RuntimeError):
    """vLLM did not score a sequence (the model is not served, or it refused the request)."""

    default_code = "scoring_failed"


class VLLMScorer:
    def __init__(self, base_url: str, *, api_key: str = "", timeout_s: float = 120.0) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/").removesuffix("/v1"), timeout=timeout_s, headers=headers)
        self.requests = 0

    def close(self) -> None:
        self.http.close()

    def logprobs(self, model: str, sequences: list[tuple[list[int], int]]) -> list[list[float]]:
        """For each (ids, start): log p(ids[t] | ids[:t]) under ``model`` for t from ``start`` on."""
        out: list[list[float]] = []
        for first in range(0, len(sequences), PER_REQUEST):
            out += prompt_logprobs(self.http, model, sequences[first : first + PER_REQUEST])
            self.requests += 1
        return out


def prompt_logprobs(http: httpx.Client, model: str, sequences: list[tuple[list[int], int]]) -> list[list[float]]:
    """One request: for each (ids, start), log p(ids[t] | ids[:t]) under ``model`` for t from
    ``start`` on. Safe beside LoRA calls only where vLLM serves no LoRA on the LM head
    (serving/process.py: SERVED_LORA_MODULES)."""
    body = {"model": model, "prompt": [ids for ids, _ in sequences], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    r = http.post("/v1/completions", json=body)
    if r.status_code != 200:
        raise ScoringError(f"vLLM did not score with {model}: {r.status_code} {r.text[:300]}")
    choices: list[dict[str, Any]] = sorted(r.json()["choices"], key=lambda c: c["index"])
    out: list[list[float]] = []
    for (ids, start), choice in zip(sequences, choices):
        entries = choice["prompt_logprobs"]
        out.append([float(entries[t][str(ids[t])]["logprob"]) for t in range(start, len(ids))])
    return out
