"""Any agent is trainable, changing only its base_url: the clients people use, against real vLLM.

Each client below talks to a gateway in front of the session's vLLM (the CPU build serving
the tiny random model) with nothing changed but its base URL, which carries a group and a
trajectory (``/g/clients/t/<trajectory>/v1``). For each, every call is recorded with
vLLM's exact token ids (prompt, completion, and logprobs aligned with the completion), on
every surface (chat completions, completions, the Responses API, Anthropic Messages), plain
and streamed, with tools. Where it is cheap, the recorded ids are compared with what vLLM
itself samples for the chat request the gateway sends (see ``core/protocols/translate``).

Then the trainer's view: the recorded calls, read as the trainer reads them
(``store/training.py: group_calls``), go through ``trainer/sequences.py: training_batch``;
every call contributes, and the tokens a sequence trains on (mask 1) are exactly the ids
vLLM sampled. The last test rewards the group the clients' trajectories share and takes one
real GRPO step on it with the trainer (in this process, as tests/trainer/test_admin_training.py).

A random model calls no tool on its own, so tool calls are forced: a named ``tool_choice``,
or ``required`` with one call at a time. vLLM constrains the call with xgrammar: for a
``strict`` tool, its arguments follow the schema (the tool below takes none, so ``{}``);
for a tool that is not strict (Anthropic's tools reach vLLM without ``strict``; the Agents
SDK's tool here), any JSON value, and the random model writes a number. Which prompt makes
the random model close its call within ``TOOL_MAX`` tokens was found by trying: the model is
fixed (seed 0) and decoding greedy, so the same prompts give the same calls every time.
Text answers are cut by ``max_tokens``; a stream that must complete (the Responses stream
helper wants ``response.completed``) asks for a structured answer, which the grammar ends.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from burnish_server.core.learning.policies import TrainSettings
from burnish_server.core.platform.settings import Settings
from burnish_server.gateway.app import create_app
from burnish_server.serving.process import VLLMServer
from burnish_server.store.database import Database
from burnish_server.store.training import TrainingCall, group_calls
from tests.conftest import ADMIN_TOKEN, Gateway
from tests.servers import ServerThread

GROUP = "clients"
SYSTEM = "Answer with digits."
QUESTION = "What is 12*7?"
TEXT_MAX = 12  # a text answer, cut by max_tokens
TOOL_MAX = 96  # a forced tool call: the random model closes the calls below in 47 to 70 tokens
ANSWER_MAX = 16  # a structured answer: {"answer":"42"} and the end of the text are 13 tokens

# A strict tool without arguments: vLLM's grammar makes the random model's call ``{}``.
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}
DESCRIPTION = "evaluate an arithmetic expression"
CHAT_TOOL = {"type": "function", "function": {"name": "calculator", "description": DESCRIPTION, "parameters": NO_ARGS, "strict": True}}
CHAT_FORCED = {"type": "function", "function": {"name": "calculator"}}
RESPONSES_TOOL = {"type": "function", "name": "calculator", "description": DESCRIPTION, "parameters": NO_ARGS, "strict": True}
RESPONSES_FORCED = {"type": "function", "name": "calculator"}
ANTHROPIC_TOOL = {"name": "calculator", "description": DESCRIPTION, "input_schema": NO_ARGS}
# The chat tool the gateway makes of ANTHROPIC_TOOL (core/protocols/translate/messages.py: _tool).
ANTHROPIC_AS_CHAT = {"type": "function", "function": {"name": "calculator", "parameters": NO_ARGS, "description": DESCRIPTION}}
# A structured answer (xgrammar): the grammar ends it, so the stream completes.
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["84", "42"]}}, "required": ["answer"], "additionalProperties": False}
ANSWER_FORMAT = {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}
ANSWER_AS_CHAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}


# ---- the gateway, shared by every client (its trajectories form one group) -----------------


@pytest.fixture(scope="module")
def gw(vllm: VLLMServer, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway on SQLite in front of the session's vLLM, with policy ``agent`` on the tiny
    model (LoRA settings for the random model, one group per step). Module-scoped: the
    clients' trajectories accumulate in group ``clients`` for the last test's step."""
    settings = Settings.load(
        {},
        upstream=vllm.url,
        data_dir=str(tmp_path_factory.mktemp("clients")),
        database_url="",
        upstream_timeout=120,
        retry_initial_wait=0.01,
        retry_max_wait=0.05,
        admin_token=ADMIN_TOKEN,
    )
    with ServerThread(create_app(settings)) as server:
        gateway = Gateway(server.url, settings)
        train = {"learning_rate": 5e-3, "groups_per_step": 1}
        gateway.create_policy("agent", "tiny", model_path=str(tiny_model), lora={"rank": 8, "alpha": 16}, train=train)
        yield gateway


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture(scope="module")
def direct(vllm: VLLMServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm.url + "/v1", api_key="none", max_retries=0)


def base_url(gw: Gateway, trajectory: str, v1: bool = True) -> str:
    """The one thing a client changes: its base URL, with the group and the trajectory in it."""
    return f"{gw.url}/g/{GROUP}/t/{trajectory}" + ("/v1" if v1 else "")


def openai_client(gw: Gateway, trajectory: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(gw, trajectory), api_key="x", max_retries=0, timeout=120)


# ---- what every client's calls must show -----------------------------------------------------


def recorded(gw: Gateway, trajectory: str, count: int) -> list[dict[str, Any]]:
    """The trajectory's calls: ``count`` of them, each a policy call recorded with vLLM's ids,
    the completion's logprobs aligned with its ids."""
    calls = gw.trajectory(trajectory)["calls"]
    assert len(calls) == count, [(c["endpoint"], c["status"], c.get("error")) for c in calls]
    for call in calls:
        where = f"{trajectory} call {call['id']} ({call['endpoint']})"
        assert call["status"] == "ok" and call["policy"] == "agent" and call["upstream_model"] == "tiny", where
        tokens = call["tokens"]
        assert tokens["prompt_token_ids"], where
        completions, logprobs = tokens["completion_token_ids"], tokens["completion_logprobs"]
        assert len(completions) == 1 and completions[0], where  # one choice, not empty
        assert [len(lp) for lp in logprobs] == [len(ids) for ids in completions], where
    return calls


def sampled_by_vllm(direct: openai.OpenAI, **chat: Any) -> dict[str, Any]:
    """What vLLM itself samples for a chat request, with its token ids and logprobs."""
    answer = direct.chat.completions.create(model="tiny", logprobs=True, extra_body={"return_token_ids": True}, **chat)
    dumped = answer.model_dump()
    choice = dumped["choices"][0]
    return {
        "prompt": dumped["prompt_token_ids"],
        "completion": choice["token_ids"],
        "logprobs": [e["logprob"] for e in choice["logprobs"]["content"]],
        "message": choice["message"],
        "finish_reason": choice["finish_reason"],
    }


def assert_as_vllm_samples(call: dict[str, Any], want: dict[str, Any]) -> None:
    tokens = call["tokens"]
    assert tokens["prompt_token_ids"] == want["prompt"]
    assert tokens["completion_token_ids"] == [want["completion"]]
    assert tokens["completion_logprobs"] == [pytest.approx(want["logprobs"], abs=1e-4)]


def assert_text(tokenizer: Any, call: dict[str, Any], text: str | None) -> None:
    """The recorded completion ids, decoded, are the text the client was given. The random
    model writes arbitrary bytes: where its last token ends inside a UTF-8 character, vLLM
    holds that piece back (the decoder shows U+FFFD there), so trailing U+FFFD are left out."""
    decoded = tokenizer.decode(call["tokens"]["completion_token_ids"][0], skip_special_tokens=True)
    assert text is not None and decoded.rstrip("\ufffd") == text.rstrip("\ufffd")


def training_rows(gw: Gateway, group: str = GROUP) -> list[TrainingCall]:
    """The group's calls as the trainer reads them (``store/training.py: group_calls``)."""

    async def read() -> list[TrainingCall]:
        db = Database(gw.settings.resolved_database_url)
        try:
            return await db.read(group_calls, [group])
        finally:
            await db.dispose()

    return asyncio.run(read())


TRAINABLE: list[str] = []  # the trajectories the tests above found trainable, for the last test


def assert_trainable(gw: Gateway, trajectories: list[str], rows: list[TrainingCall] | None = None) -> Any:
    """Build the trainer's batch from these trajectories' recorded calls, as the trainer does
    (``group_calls`` then ``training_batch``), and check it: no call skipped, every call in
    exactly one sequence, and each sequence's trained tokens (mask 1) exactly the completion
    ids recorded for its calls, with their logprobs; its context, the last call's prompt.
    Where a sequence starts agrees with the trajectory view's ``extends_previous``."""
    from burnish_server.trainer.sequences import training_batch

    rows = [r for r in (training_rows(gw) if rows is None else rows) if r.trajectory_id in trajectories]
    if any(r.reward is None for r in rows):  # not rewarded yet: any distinct rewards will do for the tokens
        rank = {t: float(i) for i, t in enumerate(trajectories)}
        rows = [r._replace(reward=rank[r.trajectory_id]) for r in rows]
    order = list(dict.fromkeys(r.trajectory_id for r in rows))
    assert sorted(order) == sorted(trajectories)
    views = {t: gw.trajectory(t)["calls"] for t in order}
    assert len(rows) == sum(len(v) for v in views.values())  # every recorded call is a training call

    batch = training_batch(rows, TrainSettings())
    assert batch.untokenized == 0
    assert sum(seq.calls for seq, _ in batch.items) == len(rows)  # every call contributed

    # Walk the sequences in order against each trajectory's calls.
    queue = [(t, i) for t in order for i in range(len(views[t]))]
    splits = 0
    for seq, _ in batch.items:
        (trajectory, first), queue = queue[0], queue[seq.calls :]
        calls = views[trajectory][first : first + seq.calls]
        assert len(calls) == seq.calls
        ids = [c["tokens"] for c in calls]
        trained = [tok for tok, m in zip(seq.tokens, seq.mask) if m]
        assert trained == [tok for t in ids for tok in t["completion_token_ids"][0]], trajectory
        trained_lps = [lp for lp, m in zip(seq.behaviour_logprobs, seq.mask) if m]
        assert trained_lps == pytest.approx([lp for t in ids for lp in t["completion_logprobs"][0]], abs=1e-5)
        assert seq.has_behaviour_logprobs
        assert seq.tokens == ids[-1]["prompt_token_ids"] + ids[-1]["completion_token_ids"][0]  # the last call's context
        assert seq.tokens[: len(ids[0]["prompt_token_ids"])] == ids[0]["prompt_token_ids"]
        assert all(c["extends_previous"] for c in calls[1:])  # merged calls extend the one before
        if first > 0:  # a trajectory's later sequence starts where its prompt did not extend
            assert calls[0]["extends_previous"] is False
            splits += 1
    assert queue == []
    assert batch.splits == splits
    TRAINABLE.extend(t for t in trajectories if t not in TRAINABLE)
    return batch


# ---- openai: chat completions and completions -----------------------------------------------

QUESTION_MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def test_openai_chat_plain_stream_and_tools(gw: Gateway, direct: openai.OpenAI, tokenizer: Any) -> None:
    """A conversation on chat completions: a plain turn, a streamed one that continues it,
    then a forced tool call and the tool's result sent back. The first two turns answer
    from a choice (vLLM's ``structured_outputs``), which the chat template writes back as
    the same ids: the second prompt extends the first call, and the two train as one
    sequence. The tool call does not: the template writes the call in its own layout."""
    client = openai_client(gw, "openai-chat")
    choice = {"structured_outputs": {"choice": ["84", "42"]}}
    messages: list[dict[str, Any]] = list(QUESTION_MESSAGES)
    first = client.chat.completions.create(model="agent", messages=messages, max_tokens=TEXT_MAX, temperature=0, extra_body=choice)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "And 3+4?"}]
    chunks = list(client.chat.completions.create(model="agent", messages=messages, max_tokens=TEXT_MAX, temperature=0, stream=True, extra_body=choice))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert all(c.model_dump().get("prompt_token_ids") is None for c in chunks)  # what the gateway asked for is scrubbed

    tooled = client.chat.completions.create(
        model="agent", messages=QUESTION_MESSAGES, tools=[CHAT_TOOL], tool_choice=CHAT_FORCED, max_tokens=TOOL_MAX, temperature=0
    )
    (tool_call,) = tooled.choices[0].message.tool_calls or []
    assert tool_call.function.name == "calculator" and json.loads(tool_call.function.arguments) == {}
    back = [
        *QUESTION_MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [tool_call.model_dump()]},
        {"role": "tool", "tool_call_id": tool_call.id, "content": "84"},
    ]
    client.chat.completions.create(model="agent", messages=back, tools=[CHAT_TOOL], max_tokens=TEXT_MAX, temperature=0)

    calls = recorded(gw, "openai-chat", 4)
    assert [c["stream"] for c in calls] == [False, True, False, False]
    assert_text(tokenizer, calls[0], first.choices[0].message.content)
    assert_text(tokenizer, calls[1], streamed)
    want = sampled_by_vllm(direct, messages=QUESTION_MESSAGES, tools=[CHAT_TOOL], tool_choice=CHAT_FORCED, max_tokens=TOOL_MAX, temperature=0)
    assert_as_vllm_samples(calls[2], want)
    assert calls[3]["request"]["messages"][-1] == {"role": "tool", "tool_call_id": tool_call.id, "content": "84"}
    assert [c["extends_previous"] for c in calls] == [True, True, False, False]
    batch = assert_trainable(gw, ["openai-chat"])
    assert [seq.calls for seq, _ in batch.items] == [2, 1, 1] and batch.splits == 2


def test_openai_completions_plain_and_stream(gw: Gateway, tokenizer: Any) -> None:
    client = openai_client(gw, "openai-completions")
    asked = dict(model="agent", prompt="Count: 1 2 3", max_tokens=TEXT_MAX, temperature=0)
    plain = client.completions.create(**asked)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**asked, stream=True))
    assert streamed == plain.choices[0].text
    calls = recorded(gw, "openai-completions", 2)
    assert calls[0]["tokens"] == calls[1]["tokens"]
    assert_text(tokenizer, calls[0], plain.choices[0].text)
    assert_trainable(gw, ["openai-completions"])


# ---- openai: the Responses API ----------------------------------------------------------------


def test_openai_responses_plain_and_stream(gw: Gateway, direct: openai.OpenAI, tokenizer: Any) -> None:
    """``responses.create``, then the ``responses.stream`` helper with a structured answer
    (the grammar ends it, so the stream completes and ``get_final_response`` has it)."""
    client = openai_client(gw, "openai-responses")
    plain = client.responses.create(model="agent", instructions=SYSTEM, input=QUESTION, max_output_tokens=TEXT_MAX, temperature=0)
    with client.responses.stream(model="agent", input=QUESTION, text={"format": ANSWER_FORMAT}, max_output_tokens=ANSWER_MAX, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert json.loads(final.output_text)["answer"] in ("84", "42")

    calls = recorded(gw, "openai-responses", 2)
    assert [c["endpoint"] for c in calls] == ["responses", "responses"] and calls[1]["stream"] is True
    assert calls[0]["response"]["id"] == plain.id and calls[1]["response"]["id"] == final.id
    # Each request, sent to vLLM as the chat request the gateway makes of it.
    want = sampled_by_vllm(direct, messages=QUESTION_MESSAGES, max_tokens=TEXT_MAX, temperature=0)
    assert_as_vllm_samples(calls[0], want)
    assert plain.output_text == want["message"]["content"]
    assert plain.status == ("incomplete" if want["finish_reason"] == "length" else "completed")
    assert_text(tokenizer, calls[0], plain.output_text)
    want = sampled_by_vllm(direct, messages=[{"role": "user", "content": QUESTION}], response_format=ANSWER_AS_CHAT, max_tokens=ANSWER_MAX, temperature=0)
    assert_as_vllm_samples(calls[1], want)
    assert final.output_text == want["message"]["content"]
    assert_trainable(gw, ["openai-responses"])


def test_openai_responses_tool_round_trip(gw: Gateway, direct: openai.OpenAI) -> None:
    """A forced function call through the ``responses.stream`` helper, then its
    ``function_call_output`` sent back: once with the whole input list, once with
    ``previous_response_id``. The model sees the same conversation either way."""
    question = {"type": "message", "role": "user", "content": QUESTION}
    firsts = {}
    for trajectory in ("responses-input", "responses-previous"):
        with openai_client(gw, trajectory).responses.stream(
            model="agent",
            instructions=SYSTEM,
            input=[question],
            tools=[RESPONSES_TOOL],
            tool_choice=RESPONSES_FORCED,
            max_output_tokens=TOOL_MAX,
            temperature=0,
        ) as stream:
            kinds = [event.type for event in stream]
            firsts[trajectory] = stream.get_final_response()
        assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"

    # The answer to the tool's output: structured, so that it completes.
    answer = {"tools": [RESPONSES_TOOL], "tool_choice": "none", "text": {"format": ANSWER_FORMAT}, "max_output_tokens": ANSWER_MAX, "temperature": 0}
    first = firsts["responses-input"]
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "calculator" and json.loads(call.arguments) == {}
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "84"}
    again = openai_client(gw, "responses-input").responses.create(model="agent", input=[question, *first.output, output], **answer)
    assert again.status == "completed" and again.previous_response_id is None

    first_p = firsts["responses-previous"]
    (call_p,) = [item for item in first_p.output if item.type == "function_call"]
    output_p = {"type": "function_call_output", "call_id": call_p.call_id, "output": "84"}
    with openai_client(gw, "responses-previous").responses.stream(model="agent", previous_response_id=first_p.id, input=[output_p], **answer) as stream:
        continued = stream.get_final_response()
    assert continued.previous_response_id == first_p.id and continued.output_text == again.output_text

    by_input, by_previous = recorded(gw, "responses-input", 2), recorded(gw, "responses-previous", 2)
    want = sampled_by_vllm(direct, messages=QUESTION_MESSAGES, tools=[CHAT_TOOL], tool_choice=CHAT_FORCED, max_tokens=TOOL_MAX, temperature=0)
    assert_as_vllm_samples(by_input[0], want)
    assert by_previous[0]["tokens"] == by_input[0]["tokens"]
    # previous_response_id is recorded with the whole conversation, and the model saw what
    # the input list showed it. (The earlier instructions are not carried over, as the API defines.)
    assert [i["type"] for i in by_previous[1]["request"]["input"]] == ["message", "function_call", "function_call_output"]
    assert by_previous[1]["tokens"] == by_input[1]["tokens"]
    assert_trainable(gw, ["responses-input", "responses-previous"])


# ---- anthropic: Messages ----------------------------------------------------------------------


def test_anthropic_messages(gw: Gateway, direct: openai.OpenAI, tokenizer: Any) -> None:
    """``messages.create`` with a system prompt, then with a forced tool use; its
    ``tool_result`` sent back through ``messages.stream``. (This SDK has no ``temperature``
    argument: it goes in extra_body.)"""
    import anthropic

    client = anthropic.Anthropic(base_url=base_url(gw, "anthropic", v1=False), api_key="x", max_retries=0, timeout=120)
    greedy = {"extra_body": {"temperature": 0}}
    question = {"role": "user", "content": QUESTION}
    plain = client.messages.create(model="agent", max_tokens=TEXT_MAX, system=SYSTEM, messages=[question], **greedy)
    used = client.messages.create(
        model="agent",
        max_tokens=TOOL_MAX,
        system=SYSTEM,
        messages=[question],
        tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "tool", "name": "calculator"},
        **greedy,
    )
    (use,) = [b for b in used.content if b.type == "tool_use"]
    assert use.name == "calculator" and used.stop_reason == "tool_use"
    # Not strict (see the module's docstring): the random model's arguments are a number, which
    # the gateway hands over as {"_raw": <the text>}, since Anthropic's input is an object.
    assert isinstance(use.input, dict) and list(use.input) == ["_raw"]
    with client.messages.stream(
        model="agent",
        max_tokens=TEXT_MAX,
        system=SYSTEM,
        tools=[ANTHROPIC_TOOL],
        messages=[
            question,
            {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "84"}]},
        ],
        **greedy,
    ) as stream:
        kinds = [event.type for event in stream]
        answer = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and answer.stop_reason in ("max_tokens", "end_turn")

    calls = recorded(gw, "anthropic", 3)
    assert [c["endpoint"] for c in calls] == ["messages"] * 3 and [c["stream"] for c in calls] == [False, False, True]
    want = sampled_by_vllm(direct, messages=QUESTION_MESSAGES, max_tokens=TEXT_MAX, temperature=0)
    assert_as_vllm_samples(calls[0], want)
    assert [b.text for b in plain.content if b.type == "text"] == [want["message"]["content"]]
    assert_text(tokenizer, calls[0], want["message"]["content"])
    assert plain.usage.input_tokens == len(want["prompt"]) and plain.usage.output_tokens == len(want["completion"])
    want = sampled_by_vllm(direct, messages=QUESTION_MESSAGES, tools=[ANTHROPIC_AS_CHAT], tool_choice=CHAT_FORCED, max_tokens=TOOL_MAX, temperature=0)
    assert_as_vllm_samples(calls[1], want)
    assert calls[2]["request"]["messages"][-1]["content"][0]["type"] == "tool_result"
    assert_trainable(gw, ["anthropic"])


def test_anthropic_stream_of_a_tool_use_whose_arguments_are_not_an_object(gw: Gateway) -> None:
    """Not strict, the tool's arguments are any JSON value; here the random model writes a
    number (``121E67996799555511167``). Anthropic's ``input`` is an object, so the gateway
    answers ``{"_raw": <the text>}``, and streams it the same way: as one ``input_json_delta``
    when the block closes (relaying the pieces made the SDK's stream raise ``Unable to
    parse tool parameter JSON`` at ``121E``). The client gets what was recorded.
    (Outside the group: its trajectory is not trained.)"""
    import anthropic

    client = anthropic.Anthropic(base_url=f"{gw.url}/t/anthropic-streamed-tool", api_key="x", max_retries=0, timeout=120)
    with client.messages.stream(
        model="agent",
        max_tokens=TOOL_MAX,
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "tool", "name": "calculator"},
        extra_body={"temperature": 0},
    ) as stream:
        used = stream.get_final_message()
    (use,) = [b for b in used.content if b.type == "tool_use"]
    assert isinstance(use.input, dict)
    (call,) = gw.trajectory("anthropic-streamed-tool")["calls"]
    assert [b["input"] for b in call["response"]["content"] if b["type"] == "tool_use"] == [use.input]


# ---- LangChain, litellm -----------------------------------------------------------------------


def test_langchain_chat_openai(gw: Gateway, direct: openai.OpenAI, tokenizer: Any) -> None:
    """``ChatOpenAI``: invoke, stream, and ``bind_tools`` with a forced tool whose result goes back."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    def chat_model(max_tokens: int) -> ChatOpenAI:
        return ChatOpenAI(model="agent", base_url=base_url(gw, "langchain"), api_key="x", temperature=0, max_tokens=max_tokens, max_retries=0, timeout=120)

    llm = chat_model(TEXT_MAX)
    messages = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
    invoked = llm.invoke(messages)
    streamed = "".join(str(chunk.content) for chunk in llm.stream(messages))
    reply = chat_model(TOOL_MAX).bind_tools([CHAT_TOOL], tool_choice="calculator").invoke(messages)
    (tool_call,) = reply.tool_calls
    assert tool_call["name"] == "calculator" and tool_call["args"] == {}
    llm.invoke([*messages, reply, ToolMessage("84", tool_call_id=tool_call["id"])])

    calls = recorded(gw, "langchain", 4)
    assert [c["stream"] for c in calls] == [False, True, False, False]
    assert invoked.content == streamed
    assert_text(tokenizer, calls[0], streamed)
    want = sampled_by_vllm(direct, messages=QUESTION_MESSAGES, tools=[CHAT_TOOL], tool_choice=CHAT_FORCED, max_tokens=TOOL_MAX, temperature=0)
    assert_as_vllm_samples(calls[2], want)
    assert_trainable(gw, ["langchain"])


def test_litellm(gw: Gateway, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The litellm SDK, as an OpenAI-compatible endpoint and as hosted vLLM; plain and streamed."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # read at import: no fetch of the cost map, nothing outside is reachable
    import litellm

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    texts = []
    for model in ("openai/agent", "hosted_vllm/agent"):
        common = dict(model=model, api_base=base_url(gw, "litellm"), api_key="x", messages=messages, max_tokens=TEXT_MAX, temperature=0, timeout=120)
        texts.append(litellm.completion(**common).choices[0].message.content)
        texts.append("".join(c.choices[0].delta.content or "" for c in litellm.completion(**common, stream=True) if c.choices))
    calls = recorded(gw, "litellm", 4)
    assert [c["stream"] for c in calls] == [False, True, False, True]
    assert texts == texts[:1] * 4
    assert_text(tokenizer, calls[0], texts[0])
    assert_trainable(gw, ["litellm"])


# ---- the OpenAI Agents SDK --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["chat_completions", "responses"])
async def test_openai_agents_sdk(gw: Gateway, kind: str) -> None:
    """An Agent with a function tool, on either model kind; it must call the tool
    (``required``, one call at a time) and stops at its first call."""
    import agents
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
    from agents.items import ToolCallItem, ToolCallOutputItem

    agents.set_tracing_disabled(True)  # the SDK's tracing would export to OpenAI: nothing outside is reachable
    trajectory = f"agents-{kind}"
    client = openai.AsyncOpenAI(base_url=base_url(gw, trajectory), api_key="x", max_retries=0, timeout=120)
    model = OpenAIChatCompletionsModel("agent", client) if kind == "chat_completions" else OpenAIResponsesModel("agent", client)

    @function_tool(strict_mode=False)
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return "84"

    agent = Agent(
        name="calc",
        instructions="Use the calculator.",
        model=model,
        tools=[calculator],
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=TOOL_MAX, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(agent, QUESTION, max_turns=2)
    # The random model's arguments are a number, not an object: the SDK hands its error
    # message to the run as the tool's output. Either way the tool was called, once.
    assert [type(item) for item in result.new_items] == [ToolCallItem, ToolCallOutputItem]
    assert isinstance(result.final_output, str)
    await client.close()

    calls = await asyncio.to_thread(recorded, gw, trajectory, 1)
    assert calls[0]["endpoint"] == ("chat.completions" if kind == "chat_completions" else "responses")
    assert calls[0]["request"]["tool_choice"] == "required" and calls[0]["request"]["parallel_tool_calls"] is False
    await asyncio.to_thread(assert_trainable, gw, [trajectory])


# ---- curl -------------------------------------------------------------------------------------


def test_curl(gw: Gateway) -> None:
    def curl(path: str, body: dict[str, Any], *headers: str) -> dict[str, Any]:
        args = ["curl", "-s", "-X", "POST", base_url(gw, "curl") + path, "-H", "content-type: application/json"]
        for h in headers:
            args += ["-H", h]
        out = subprocess.run([*args, "-d", json.dumps(body)], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout)

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    chat = curl("/chat/completions", {"model": "agent", "messages": messages, "max_tokens": TEXT_MAX, "temperature": 0})
    message = curl(
        "/messages",
        {"model": "agent", "system": SYSTEM, "messages": messages[1:], "max_tokens": TEXT_MAX, "temperature": 0},
        "x-api-key: x",
        "anthropic-version: 2023-06-01",
    )
    assert message["type"] == "message" and message["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    calls = recorded(gw, "curl", 2)
    assert calls[0]["tokens"] == calls[1]["tokens"]  # one chat request, however asked
    assert_trainable(gw, ["curl"])


# ---- one real step on all of it ---------------------------------------------------------------


async def test_one_trainer_step_on_every_client(gw: Gateway, vllm: VLLMServer) -> None:
    """The clients' trajectories are one group: reward each, close it, and let the trainer
    take a real GRPO step on it (in this process). No call was skipped or split off
    unaccounted, and the step trained exactly the sampled tokens."""
    from burnish_server.trainer.worker import TrainerWorker, WorkerSettings

    async def group_members(c: httpx.AsyncClient) -> list[str]:
        r = await c.get(f"/v1/groups/{GROUP}")
        return [m["id"] for m in r.json()["members"]] if r.status_code == 200 else []

    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as c:
        members = await group_members(c)
        if len(members) < 2:  # run alone: two members of its own
            for t in ("alone-chat", "alone-messages"):
                body = {"model": "agent", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": TEXT_MAX, "temperature": 0}
                path = "chat/completions" if t == "alone-chat" else "messages"
                assert (await c.post(f"/g/{GROUP}/t/{t}/v1/{path}", json=body)).status_code == 200
            members = await group_members(c)
        for i, t in enumerate(members):
            r = await c.post(f"/v1/trajectories/{t}/reward", json={"reward": i / (len(members) - 1)})
            assert r.status_code == 200, r.text
        r = await c.post(f"/v1/groups/{GROUP}/close")
        assert r.status_code == 200, r.text

    assert set(TRAINABLE) <= set(members)  # every client's trajectory, when the whole module ran
    rows = await asyncio.to_thread(training_rows, gw)
    batch = await asyncio.to_thread(assert_trainable, gw, members, rows)
    assert sorted(batch.rewards) == sorted(i / (len(members) - 1) for i in range(len(members)))

    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url)
    worker = TrainerWorker(settings, WorkerSettings(worker_id="clients"))
    await worker.recover()
    try:
        assert await worker.run_once()
        status = await asyncio.to_thread(gw.policy)
        assert (status["step"], status["head"]) == (1, 1) and status["last_step"]["groups"] == [GROUP]
        metrics = status["last_step"]["metrics"]
        assert metrics["untokenized_calls"] == 0 and metrics["sequence_splits"] == batch.splits
        # Every sampled token is trained, but those a grammar forced (forced tool calls, structured answers): context only.
        assert (
            metrics["tokens"] + metrics["forced_tokens"] == sum(seq.sampled for seq, _ in batch.items) == sum(len(r.call.tokens().completions[0]) for r in rows)
        )
        assert metrics["tokens"] == sum(sum(seq.trained()) for seq, _ in batch.items) and metrics["forced_tokens"] > 0
        assert metrics["sequences"] == len(batch.items)
        group = (await asyncio.to_thread(httpx.get, f"{gw.url}/v1/groups/{GROUP}")).json()
        assert group["state"] == "trained"
    finally:
        await worker.close()
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": "agent@1"}, timeout=60)
