"""Serving the Responses API and Anthropic Messages for a policy, through chat completions.

vLLM's own ``/v1/responses`` and ``/v1/messages`` do not return token ids, and a call
without them cannot be trained on exactly. So for a policy call on those surfaces the
gateway asks vLLM for a chat completion (with token ids and logprobs, as on
``/v1/chat/completions``) and answers in the protocol the client spoke::

    Responses / Messages request ──chat_request()──▶ chat completions body ──▶ vLLM
    client ◀── events / answer ◀──Translator.feed()/finish()── chat chunks (or one completion)

Each surface is one module with the same three parts:

- ``chat_request(request, ...)``: the client's request (``core/protocols/wire.py``) as a chat
  completions body; ``Invalid`` for what the protocol allows but a chat model cannot
  serve (a hosted tool such as web search).
- ``Translator``: folds chat completion chunks into the protocol's stream events, and
  knows the answer they add up to. A plain (non-streamed) call goes through the same
  translator as a single chunk, so a streamed answer and a plain one are built by one
  code path and carry the same ids.
- the protocol's output shapes, as msgspec structs.

Pure functions of their input: no I/O, no framework; the gateway (``gateway/routes/
translated.py``) sends, records and relays.
"""
