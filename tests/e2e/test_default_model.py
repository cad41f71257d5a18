"""What a new user runs: the default ``burnish up`` (SmolLM2-135M-Instruct on vLLM's CPU build),
and the clients people use, with tools, pointed at it by their base URL alone.

Each client plays a whole tool loop: a forced call (``required`` or a named tool), the tool's
result sent back in the client's own form, and the model's answer to it. Every call must be
served (no 400 for ``tools``), recorded with vLLM's token ids, and trainable: the group's
calls, read as the trainer reads them, give sequences with no call skipped. The model's answers
are not judged here (a 135M model answering a tool result is what training is for); the calls'
arguments are: under burnish's template and ``--tool-strict-level parameter`` a forced call
always parses and fits its tool's schema (serving/tool_calling.py).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from burnish_server.core.learning.policies import TrainSettings
from tests.conftest import Up, burnish_up, real_model_parts

GROUP = "default"
# What SmolLM2-Instruct's own template says when a conversation has no system message.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTION = "What is the secret number of the word apple?"
# Arguments with a type, a bound and an enum: a forced call must fit all of it.
PARAMETERS = {
    "type": "object",
    "properties": {"word": {"type": "string", "maxLength": 12}, "language": {"type": "string", "enum": ["en", "fr"]}, "times": {"type": "integer"}},
    "required": ["word", "language"],
    "additionalProperties": False,
}
DESCRIPTION = "The secret number of a word."
CHAT_TOOL = {"type": "function", "function": {"name": "lookup", "description": DESCRIPTION, "parameters": PARAMETERS}}
CHAT_FORCED = {"type": "function", "function": {"name": "lookup"}}
RESPONSES_TOOL = {"type": "function", "name": "lookup", "description": DESCRIPTION, "parameters": PARAMETERS}
ANTHROPIC_TOOL = {"name": "lookup", "description": DESCRIPTION, "input_schema": PARAMETERS}
CALL_MAX = 64  # a forced call closes in 30-45 tokens
ANSWER_MAX = 24
GREEDY = {"temperature": 0}
BARE_TEACHER = 6  # of 8 held-out products answered as a bare number by the teacher (measured: 8; the base: 1)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    real_model_parts()
    with burnish_up(tmp_path_factory.mktemp("default-up")) as running:
        yield running


def client(up: Up, trajectory: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{up.url}/g/{GROUP}/t/{trajectory}/v1", api_key="x", max_retries=0, timeout=120)


def fits(arguments: str | dict[str, Any]) -> dict[str, Any]:
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(parsed, PARAMETERS)
    return parsed


def recorded(up: Up, trajectory: str, count: int) -> list[dict[str, Any]]:
    """The trajectory's ``count`` calls, each served by the policy and recorded with vLLM's ids."""
    calls = httpx.get(f"{up.url}/v1/trajectories/{trajectory}").json()["calls"]
    assert len(calls) == count, [(c["endpoint"], c["status"], c.get("error")) for c in calls]
    for call in calls:
        assert call["status"] == "ok" and call["policy"] == "agent" and call["upstream_model"] == "smollm2", call.get("error")
        tokens = call["tokens"]
        assert tokens["prompt_token_ids"] and tokens["completion_token_ids"][0], call["endpoint"]
        assert [len(lp) for lp in tokens["completion_logprobs"]] == [len(ids) for ids in tokens["completion_token_ids"]]
    return calls


def test_burnish_up_says_which_template_and_parser_it_serves_tools_with(up: Up) -> None:
    """The template is the packaged one, with SmolLM2's default system prompt set above it."""
    from burnish_server.serving.tool_calling import CHATML_TOOLS

    # The embedded GGUF file, converted once into a folder vLLM and the trainer read.
    converted = up.data / "models" / "smollm2"
    assert "converting" in up.log and (converted / "config.json").exists() and (converted / "model.safetensors").exists()
    assert not converted.with_name(converted.name + ".partial").exists()
    written = up.data / "models" / "smollm2-tools.jinja"
    assert f"tool calls: burnish's ChatML tool template ({written}" in up.log
    assert "parser hermes, arguments held to each tool's schema" in up.log
    first, rest = written.read_text().split("\n", 1)
    assert rest == CHATML_TOOLS.read_text() and json.dumps(SMOLLM2_SYSTEM) in first


def test_burnish_up_gives_its_policy_a_budget_for_calls_that_ask_none_and_says_so(up: Up) -> None:
    """On the CPU build a Codex call (which never asks a budget) would sample for minutes: the
    policy burnish up makes serves it at most CPU_MAX_TOKENS, printed at start (docs/coding-agents.md)."""
    from burnish_server.core.learning.defaults import CPU_MAX_TOKENS

    assert f"a call that asks for no budget gets at most {CPU_MAX_TOKENS} tokens (serving.max_tokens)" in up.log
    policy = httpx.get(f"{up.url}/admin/policies/agent", headers=up.admin, timeout=30).json()
    assert policy["serving"]["max_tokens"] == CPU_MAX_TOKENS
    # A Responses call without max_output_tokens, as Codex sends it: cut at the budget.
    r = httpx.post(f"{up.url}/t/budget/v1/responses", json={"model": "agent", "input": "Write a long story about the sea."}, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] <= CPU_MAX_TOKENS


def test_a_gguf_file_named_by_path_gets_what_the_embedded_default_gets(up: Up, tmp_path: Path) -> None:
    """The same SmolLM2, named by its GGUF path or left to the default: the same training
    defaults, and the same tool template with SmolLM2's own default system prompt. Both read
    the folder this module's ``burnish up`` converted (a conversion is kept once)."""
    from burnish_server.cli.up import prepare_model
    from burnish_server.core.platform.settings import Settings
    from burnish_server.serving.models import embedded_gguf

    settings = Settings.load(None, data_dir=str(tmp_path))
    gguf = embedded_gguf()
    (tmp_path / "models").mkdir()
    for name in ("smollm2", gguf.name.removesuffix(".gguf")):
        (tmp_path / "models" / name).symlink_to(up.data / "models" / "smollm2")
    embedded = prepare_model(settings, None, 8000, [])
    by_path = prepare_model(settings, str(gguf), 8000, [])
    assert by_path.defaults == embedded.defaults and by_path.defaults.train.learning_rate == 5.3e-4
    assert embedded.tools.template is not None and by_path.tools.template is not None
    assert by_path.tools.template.read_text() == embedded.tools.template.read_text()
    assert json.dumps(SMOLLM2_SYSTEM) in by_path.tools.template.read_text().split("\n", 1)[0]


def test_without_tools_smollm2_sees_what_its_own_template_shows_it(up: Up) -> None:
    """burnish's template adds tools and changes nothing else: the demo's prompts are the ones
    SmolLM2's own template writes, token for token, as vLLM served them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(up.data / "models" / "smollm2"))
    ours = (up.data / "models" / "smollm2-tools.jinja").read_text()
    conversations = [
        [{"role": "user", "content": "What is 13 + 14? Reply with only the number."}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "bye"},
        ],
    ]
    for messages in conversations:
        own = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=ours) == own
    assert SMOLLM2_SYSTEM in tokenizer.apply_chat_template(conversations[0], tokenize=False)  # a conversation without a system prompt gets SmolLM2's
    client(up, "plain").chat.completions.create(model="agent", messages=conversations[0], max_tokens=4, **GREEDY)
    (call,) = recorded(up, "plain", 1)
    assert call["tokens"]["prompt_token_ids"] == tokenizer.apply_chat_template(conversations[0], tokenize=True, add_generation_prompt=True, return_dict=False)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_tool_call_parses_and_fits_its_schema(up: Up, choice: str) -> None:
    """Sampled at temperature 1, plain and streamed: every forced call's arguments are JSON
    that the tool's schema accepts (types, enum, maxLength, no other keys)."""
    tool_choice = "required" if choice == "required" else CHAT_FORCED
    llm = client(up, f"forced-{choice}")
    messages = [{"role": "user", "content": QUESTION}]

    def plain(seed: int) -> None:
        reply = llm.chat.completions.create(
            model="agent", messages=messages, tools=[CHAT_TOOL], tool_choice=tool_choice, max_tokens=CALL_MAX, temperature=1.0, seed=seed
        )
        calls = reply.choices[0].message.tool_calls or []
        assert calls and all(c.function.name == "lookup" for c in calls), reply
        for call in calls:
            fits(call.function.arguments)

    def streamed(seed: int) -> None:
        stream = llm.chat.completions.create(
            model="agent", messages=messages, tools=[CHAT_TOOL], tool_choice=tool_choice, max_tokens=CALL_MAX, temperature=1.0, seed=seed, stream=True
        )
        pieces = [d for chunk in stream if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
        assert pieces and pieces[0].function and pieces[0].function.name == "lookup"
        fits("".join(d.function.arguments or "" for d in pieces if d.index == 0 and d.function))

    # Each call takes 5-15 s on two cores: the four go at once, and vLLM batches them.
    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(play, seed) for play in (plain, streamed) for seed in range(2)]:
            done.result()
    recorded(up, f"forced-{choice}", 4)


def test_openai_chat_tool_loop(up: Up) -> None:
    llm = client(up, "openai-chat")
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = llm.chat.completions.create(model="agent", messages=messages, tools=[CHAT_TOOL], tool_choice="required", max_tokens=CALL_MAX, **GREEDY)
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls" and fits(call.function.arguments)["word"]
    messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "41"}]
    chunks = list(llm.chat.completions.create(model="agent", messages=messages, tools=[CHAT_TOOL], max_tokens=ANSWER_MAX, stream=True, **GREEDY))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    calls = recorded(up, "openai-chat", 2)
    assert calls[1]["request"]["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": "41"}
    # The call came back as the template writes it: the same text, and where its tokens differ
    # from the sampled ones, the view says so (core/learning/drift.py).
    assert calls[1]["split_reason"] == (None if calls[1]["extends_previous"] else "tool_call_rerendered")


def test_openai_responses_tool_loop(up: Up) -> None:
    llm = client(up, "responses")
    question = {"type": "message", "role": "user", "content": QUESTION}
    with llm.responses.stream(
        model="agent", input=[question], tools=[RESPONSES_TOOL], tool_choice={"type": "function", "name": "lookup"}, max_output_tokens=CALL_MAX, **GREEDY
    ) as stream:
        first = stream.get_final_response()
    (call,) = [item for item in first.output if item.type == "function_call"]
    fits(call.arguments)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "41"}
    answer = llm.responses.create(model="agent", previous_response_id=first.id, input=[output], tools=[RESPONSES_TOOL], max_output_tokens=ANSWER_MAX, **GREEDY)
    assert answer.status in ("completed", "incomplete")
    recorded(up, "responses", 2)


def test_anthropic_tool_loop(up: Up) -> None:
    import anthropic

    llm = anthropic.Anthropic(base_url=f"{up.url}/g/{GROUP}/t/anthropic", api_key="x", max_retries=0, timeout=120)
    question = {"role": "user", "content": QUESTION}
    used = llm.messages.create(model="agent", max_tokens=CALL_MAX, messages=[question], tools=[ANTHROPIC_TOOL], tool_choice={"type": "any"}, extra_body=GREEDY)
    (use,) = [b for b in used.content if b.type == "tool_use"]
    assert used.stop_reason == "tool_use" and fits(use.input)
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "41"}]}
    with llm.messages.stream(
        model="agent",
        max_tokens=ANSWER_MAX,
        messages=[question, {"role": "assistant", "content": used.content}, result],
        tools=[ANTHROPIC_TOOL],
        extra_body=GREEDY,
    ) as stream:
        answer = stream.get_final_message()
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    recorded(up, "anthropic", 2)


def test_langchain_tool_loop(up: Up) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="agent", base_url=f"{up.url}/g/{GROUP}/t/langchain/v1", api_key="x", temperature=0, max_tokens=CALL_MAX, max_retries=0, timeout=120)
    question = HumanMessage(QUESTION)
    reply = llm.bind_tools([CHAT_TOOL], tool_choice="lookup").invoke([question])
    (call,) = reply.tool_calls
    assert call["name"] == "lookup" and fits(call["args"])
    llm.bind_tools([CHAT_TOOL]).invoke([question, reply, ToolMessage("41", tool_call_id=call["id"])])
    recorded(up, "langchain", 2)


@pytest.mark.parametrize("kind", ["chat_completions", "responses"])
async def test_openai_agents_sdk_tool_loop(up: Up, kind: str) -> None:
    """An Agent whose first turn must call its tool (``required``; the SDK then lets the model
    choose), which reads the tool's result and answers: a run of two model calls."""
    import agents
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
    from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem

    agents.set_tracing_disabled(True)  # its tracing would export to OpenAI: nothing outside is reachable
    trajectory = f"agents-{kind}"
    llm = openai.AsyncOpenAI(base_url=f"{up.url}/g/{GROUP}/t/{trajectory}/v1", api_key="x", max_retries=0, timeout=120)
    model = OpenAIChatCompletionsModel("agent", llm) if kind == "chat_completions" else OpenAIResponsesModel("agent", llm)
    seen: list[dict[str, Any]] = []

    @function_tool
    def lookup(word: str, language: str) -> str:
        """The secret number of a word."""
        seen.append({"word": word, "language": language})
        return "41"

    agent = Agent(
        name="lookup",
        instructions="Answer with the secret number.",
        model=model,
        tools=[lookup],
        model_settings=ModelSettings(tool_choice="required", max_tokens=CALL_MAX, **GREEDY),
    )
    result = await Runner.run(agent, QUESTION, max_turns=3)
    await llm.close()
    assert [type(item) for item in result.new_items] == [ToolCallItem, ToolCallOutputItem, MessageOutputItem]
    assert len(seen) == 1 and seen[0]["language"] in ("en", "fr")
    await asyncio.to_thread(recorded, up, trajectory, 2)


def test_every_call_of_every_client_trains(up: Up) -> None:
    """Last: the group's calls, as the trainer reads them, make a batch that skips none."""
    from burnish_server.store.database import Database
    from burnish_server.store.training import group_calls
    from burnish_server.trainer.sequences import training_batch

    async def rows() -> list[Any]:
        db = Database(f"sqlite+aiosqlite:///{up.data / 'burnish.db'}")
        try:
            return await db.read(group_calls, [GROUP])
        finally:
            await db.dispose()

    training = asyncio.run(rows())
    trajectories = sorted({r.trajectory_id for r in training})
    assert {"openai-chat", "responses", "anthropic", "langchain", "agents-chat_completions", "agents-responses"} <= set(trajectories)
    rank = {t: float(i) for i, t in enumerate(trajectories)}  # any distinct rewards: the tokens are what is checked
    batch = training_batch([r._replace(reward=rank[r.trajectory_id]) for r in training], TrainSettings())
    assert batch.untokenized == 0 and sum(seq.calls for seq, _ in batch.items) == len(training)
    assert all(seq.sampled > 0 and seq.has_behaviour_logprobs for seq, _ in batch.items)


def test_a_reasoning_gym_task_is_scored_taught_and_trained_by_the_documented_commands(up: Up, tmp_path: Path) -> None:
    """docs/environments.md's commands on the default: the base and the teach lever's teacher
    scored on held-out products, then a round played, trained and held out by version."""
    from burnish.tasks.cli import main as burnish_tasks

    # Its own policy on the same base, so the module's other tests keep agent at step 0.
    model = str(up.data / "models" / "smollm2")
    r = httpx.post(f"{up.url}/admin/policies", headers=up.admin, json={"name": "tasks", "base_model": "smollm2", "model_path": model})
    assert r.status_code == 201, r.text
    products = ["reasoning-gym", "products", "--set", "min_digits=1", "--set", "max_digits=1", "--held-out", "8", "--policy", "tasks"]
    where = ["--gateway", up.url, "--data-dir", str(up.data)]
    out = tmp_path / "figures.json"
    burnish_tasks(["eval", *products, "--step", "0", "--teacher", *where, "--out", str(out)])
    scores = json.loads(out.read_text())
    base, teacher = scores["scores"]["0"]["replies"], scores["teacher"]["replies"]
    # The base writes its working ("5 * 9 = 45", "The answer is 8."); shown three bare products,
    # the teacher writes the bare number the verifier wants.
    bare = [sum(reply.strip().isdigit() for reply, _ in replies) for replies in (base, teacher)]
    assert len(base) == len(teacher) == 8 and bare[1] >= BARE_TEACHER > bare[0], (base, teacher)
    burnish_tasks(["train", *products, "--rounds", "1", *where, "--out", str(out)])
    curve = json.loads(out.read_text())
    assert [e["round"] for e in curve["evals"]] == [0, 1] and len(curve["round_reward"]) == 1


def test_traffic_answered_once_trains_and_a_verdict_that_never_comes_expires(up: Up) -> None:
    """Production traffic on the default: each request once, by the plain openai client at the
    base URL alone (no ids). The rewarded ones, one late, train a step against their kind's
    baseline; those never rewarded expire, block nothing, and keep a late reward untrained."""
    import time

    model = str(up.data / "models" / "smollm2")
    # A verdict may take group_idle_close_s from its answer: long beside a CPU's answers.
    train = {"groups_per_step": 1, "lone_per_group": 4, "group_idle_close_s": 40}
    r = httpx.post(f"{up.url}/admin/policies", headers=up.admin, json={"name": "lone", "base_model": "smollm2", "model_path": model, "train": train})
    assert r.status_code == 201, r.text
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0)

    def post(trajectory: str, value: float) -> dict[str, Any]:
        answer = httpx.post(f"{up.url}/v1/trajectories/{trajectory}/reward", json={"reward": value})
        assert answer.status_code == 200, answer.text
        return answer.json()

    ids = []
    for a, value in enumerate((1.0, 0.0, 0.5, 0.2, None, None)):
        raw = client.chat.completions.with_raw_response.create(
            model="lone", messages=[{"role": "user", "content": f"What is {a} + 3? Reply with only the number."}], max_tokens=12, temperature=1.0
        )
        ids.append(raw.headers["x-trajectory-id"])
        if value is not None and a < 3:
            assert post(ids[-1], value)["expired"] is False
    time.sleep(5)  # a verdict that comes late, but in time
    assert post(ids[3], 0.2)["expired"] is False

    def status() -> dict[str, Any]:
        return httpx.get(f"{up.url}/admin/policies/lone", headers=up.admin).json()

    deadline = time.monotonic() + 600
    while status()["last_step"] is None or status()["lone"]["expired"] < 2:
        assert time.monotonic() < deadline, status()
        time.sleep(2)
    done = status()
    assert done["last_step"]["metrics"]["lone"] == 4 and done["lone"]["trained"] == 4, done
    assert done["lone"] == {"waiting": 0, "ready": 0, "trained": 4, "expired": 2, "judged": 0, "unreadable": 0}
    assert post(ids[4], 1.0)["expired"] is True  # kept, and said to be too late


def test_the_users_next_message_alone_trains_judged_and_as_a_hint(up: Up) -> None:
    """No verdict at all, only the user's next message, each request sent with no ids: SmolLM2,
    as burnish up serves it, judges each answer by the reply that followed (a reward), and the
    base, shown that reply, teaches the answer (hindsight); a step trains on both."""
    import time

    model = str(up.data / "models" / "smollm2")
    train = {"groups_per_step": 1, "lone_per_group": 3, "objective": {"grpo": 1, "distill": 1}, "teacher": {"hindsight": True}}
    body = {"name": "next", "base_model": "smollm2", "model_path": model, "train": train, "ruler": {"next_message": True}}
    r = httpx.post(f"{up.url}/admin/policies", headers=up.admin, json=body)
    assert r.status_code == 201, r.text
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0)
    for a, reply in ((2, "Thanks."), (4, "No, 4 + 3 is 7."), (6, "Great, thank you!")):
        question = [{"role": "user", "content": f"What is {a} + 3? Reply with only the number."}]
        answer = client.chat.completions.create(model="next", messages=question, max_tokens=12, temperature=1.0).choices[0].message.content
        turns = [*question, {"role": "assistant", "content": answer}, {"role": "user", "content": reply}]
        client.chat.completions.create(model="next", messages=turns, max_tokens=12)

    def status() -> dict[str, Any]:
        return httpx.get(f"{up.url}/admin/policies/next", headers=up.admin).json()

    deadline = time.monotonic() + 600
    while status()["last_step"] is None:
        assert time.monotonic() < deadline, status()
        time.sleep(2)
    done = status()
    assert done["lone"]["judged"] + done["lone"]["unreadable"] == 3 and done["lone"]["judged"] >= 2, done["lone"]
    metrics = done["last_step"]["metrics"]
    assert metrics["distill_tokens"] > 0 and metrics["lone"] >= 1, metrics  # taught by the hint, and trained on the judge's reward


def test_the_dashboard_shows_a_trajectory_of_smollm2_down_to_its_tokens(up: Up) -> None:
    """The dashboard on the default model: the chat tool loop as one conversation, and the
    forced call's tokens as SmolLM2's tokenizer writes them (asked of vLLM), marked trained or not."""
    import html
    import re

    with httpx.Client(base_url=up.url, headers=up.admin, timeout=60) as c:
        page = c.get("/ui/trajectories/openai-chat")
        assert page.status_code == 200 and page.text.count('class="call"') == 2
        assert "lookup" in page.text and "role-tool" in page.text
        tokens = c.get("/ui/trajectories/openai-chat/calls/0/tokens", headers={"hx-request": "true"})
        assert tokens.status_code == 200
    pieces = [html.unescape(p) for p in re.findall(r'<span class="tok[^"]*"[^>]*>(.*?)</span>', tokens.text, re.S)]
    assert pieces and not any(re.fullmatch(r"‹\d+›", p) for p in pieces)  # text, not ids
    assert "lookup" in "".join(pieces)
    assert 'class="tok trained"' in tokens.text


# A trained version out of burnish, in each format, answers as vLLM served it: the same greedy
# tokens, and their logprobs within this (vLLM's float32 LoRA kernels against a merged or
# peft-applied float32 model on the CPU).
LOGPROB_TOLERANCE = 2e-3
EXPORT_PROMPTS = ["What is 13 + 14? Reply with only the number.", "Name a colour."]


def _served(url: str, model: str) -> list[tuple[list[str], list[float]]]:
    """Greedy answers of ``model`` at ``url`` (OpenAI-compatible): each sampled token and its logprob."""
    out = []
    for prompt in EXPORT_PROMPTS:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "logprobs": True, **GREEDY},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["logprobs"]["content"]
        out.append(([t["token"] for t in content], [t["logprob"] for t in content]))
    return out


def _generated(model: Any, tokenizer: Any) -> list[tuple[list[str], list[float]]]:
    """The same greedy answers from a transformers model, as vLLM's chat template renders the prompt."""
    import torch

    out = []
    for prompt in EXPORT_PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)[
            "input_ids"
        ]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=8, do_sample=False, output_scores=True, return_dict_in_generate=True)
        new = gen.sequences[0, ids.shape[1] :]
        logprobs = [torch.log_softmax(score[0].float(), -1)[t].item() for score, t in zip(gen.scores, new)]
        out.append(([tokenizer.decode([int(t)]) for t in new], logprobs))
    return out


def _same(ours: list[tuple[list[str], list[float]]], served: list[tuple[list[str], list[float]]], what: str) -> None:
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(ours, served):
        assert tokens == want_tokens, (what, tokens, want_tokens)  # vLLM names each token by its text
        assert max(abs(a - b) for a, b in zip(logprobs, want_logprobs)) < LOGPROB_TOLERANCE, (what, logprobs, want_logprobs)


def test_a_trained_version_exported_in_every_format_answers_as_vllm_served_it(up: Up, tmp_path) -> None:
    """SmolLM2 trained one step (the trainer's logprobs of vLLM's samples are vLLM's), then `burnish export` as an adapter (peft loads it on the base),
    merged weights (transformers loads them; vLLM serves them with no LoRA) and a GGUF file (read
    back by transformers, as `burnish convert-gguf` reads it): the greedy answers and their
    logprobs are vLLM's for that version."""
    import subprocess
    import sys

    from burnish_server.serving.process import VLLMServer
    from tests.servers import free_port

    base = up.data / "models" / "smollm2"
    # Its own policy on the same base, so the module's other tests keep agent at step 0.
    r = httpx.post(f"{up.url}/admin/policies", headers=up.admin, json={"name": "exported", "base_model": "smollm2", "model_path": str(base)})
    assert r.status_code == 201, r.text
    llm = openai.OpenAI(base_url=f"{up.url}/v1", api_key="x", max_retries=0, timeout=120)
    for i, reward in enumerate((0.0, 1.0)):
        llm.chat.completions.create(
            model="exported",
            messages=[{"role": "user", "content": EXPORT_PROMPTS[0]}],
            max_tokens=8,
            temperature=1.0,
            extra_headers={"x-trajectory-id": f"e-{i}", "x-group-id": "export", "x-group-size": "2"},
        )
        assert httpx.post(f"{up.url}/v1/trajectories/e-{i}/reward", json={"reward": reward}).status_code == 200
    assert httpx.post(f"{up.url}/admin/policies/exported/train", headers=up.admin).status_code in (200, 202)
    from burnish import Client

    assert Client(up.url).wait_for_step("exported", 1, timeout=300) == 1
    (metrics,) = httpx.get(f"{up.url}/admin/policies/exported/metrics", headers=up.admin).json()["data"]
    assert metrics["sequences"] == 2 and metrics["untokenized_calls"] == 0 and metrics["staleness_max"] == 0
    # Same weights in both engines (fp32): the trainer's logprobs of vLLM's samples match vLLM's.
    assert metrics["logprob_diff_mean"] < 0.02 and metrics["outside_clip_fraction"] == 0, metrics
    served = _served(up.url, "exported@1")

    env = {**os.environ, "BURNISH_DATA_DIR": str(up.data)}
    written: dict[str, str] = {}

    def export(fmt: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "burnish_server.cli", "export", "exported@1", str(tmp_path / fmt), "--format", fmt], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        written[fmt] = done.stdout.strip().rsplit(": ", 1)[1]

    # The merged folder first: vLLM starts on it while the rest is exported and compared.
    export("merged")
    vllm = VLLMServer(
        model=written["merged"], served_model_name="merged", log_path=tmp_path / "merged-vllm.log", port=free_port(), dtype="float32", max_model_len=2048
    ).start()
    try:
        for fmt in ("adapter", "gguf"):
            export(fmt)
        _compare_exports(up, written, served)
        # vLLM serves the merged folder as a plain model, with no LoRA.
        vllm.wait_healthy(timeout=300)
        _same(_served(vllm.url, "merged"), served, "merged in vLLM")
    finally:
        vllm.stop()


def _compare_exports(up: Up, written: dict[str, str], served: list[tuple[list[str], list[float]]]) -> None:
    """The adapter over the API and the dashboard is the exported one; each format, loaded by
    peft or transformers, answers as vLLM served the version."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = up.data / "models" / "smollm2"
    # The same adapter over the admin API and from the dashboard's version row, as a zip.
    for path in ("/admin/policies/exported/checkpoints/1/adapter", "/ui/policies/exported/versions/1/adapter"):
        r = httpx.get(up.url + path, headers=up.admin)
        assert r.status_code == 200 and r.headers["content-type"] == "application/zip", r.text[:300]
        with zipfile.ZipFile(io.BytesIO(r.content)) as z:
            assert sorted(z.namelist()) == ["adapter_config.json", "adapter_model.safetensors"]
            for name in z.namelist():
                assert z.read(name) == (Path(written["adapter"]) / name).read_bytes(), name
    assert httpx.get(f"{up.url}/admin/policies/exported/checkpoints/7/adapter", headers=up.admin).json()["error"]["code"] == "checkpoint_not_found"
    assert httpx.get(f"{up.url}/admin/policies/exported/checkpoints/0/adapter", headers=up.admin).status_code == 400
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), written["adapter"])
    _same(_generated(adapter, tokenizer), served, "adapter")
    _same(
        _generated(AutoModelForCausalLM.from_pretrained(written["merged"], dtype=torch.float32), AutoTokenizer.from_pretrained(written["merged"])),
        served,
        "merged",
    )
    gguf = Path(written["gguf"])
    from_gguf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    _same(_generated(from_gguf, AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)), served, "gguf")


def test_smollm2_distills_and_imitates_with_tools_rendered_as_vllm_serves_them(up: Up) -> None:
    """SmolLM2's step of distillation and SFT through the default `burnish up`: its own calls
    (one with a forced tool call under burnish's tool template) scored by its base shown a
    context, and a posted demonstration with a tool call. Every call reaches the teacher and
    every demonstration renders (the trainer renders with the template vLLM serves): none is
    skipped."""
    base = up.data / "models" / "smollm2"
    teacher = {"context": [{"role": "user", "content": "Say the word apple."}, {"role": "assistant", "content": "apple"}]}
    train = {"objective": {"grpo": 0, "sft": 1, "distill": 1}, "teacher": teacher, "groups_per_step": 2}
    r = httpx.post(f"{up.url}/admin/policies", headers=up.admin, json={"name": "taught", "base_model": "smollm2", "model_path": str(base), "train": train})
    assert r.status_code == 201, r.text
    llm = openai.OpenAI(base_url=f"{up.url}/g/taught-g/t/taught-1/v1", api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": QUESTION}]
    llm.chat.completions.create(model="taught", messages=messages, max_tokens=8, temperature=1.0)
    llm.chat.completions.create(model="taught", messages=messages, tools=[CHAT_TOOL], tool_choice="required", max_tokens=CALL_MAX, temperature=1.0)
    assert httpx.post(f"{up.url}/v1/groups/taught-g/close").status_code == 200
    demonstration = [
        *messages,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "apple", "language": "en"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "7"},
        {"role": "assistant", "content": "The secret number of apple is 7."},
    ]
    posted = httpx.post(f"{up.url}/v1/demonstrations", json={"policy": "taught", "data": [{"messages": demonstration, "tools": [CHAT_TOOL]}]})
    assert posted.status_code == 201 and posted.json()["trains"] is True, posted.text
    from burnish import Client

    assert Client(up.url).wait_for_step("taught", 1, timeout=600) == 1
    (metrics,) = httpx.get(f"{up.url}/admin/policies/taught/metrics", headers=up.admin).json()["data"]
    assert metrics["teacher_unrendered_calls"] == 0 and metrics["untokenized_calls"] == 0, metrics
    assert metrics["distill_tokens"] > 0 and metrics["sft_tokens"] > 0 and metrics["groups"] == 2, metrics


# ---- nothing burnish sends crashes vLLM ----------------------------------------------------

LORA_CALLS = 8


def random_adapter(model: Path, path: Path) -> Path:
    """A LoRA adapter for SmolLM2 on its projections, as the trainer makes one, with random weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from burnish_server.core.learning.defaults import LLAMA_PROJECTIONS

    torch.manual_seed(0)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model), LoraConfig(r=8, lora_alpha=16, target_modules=list(LLAMA_PROJECTIONS), task_type="CAUSAL_LM")
    )
    for name, weight in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(weight, std=0.02)
    peft_model.save_pretrained(path)
    return path


def scoring_beside_lora_calls(url: str, adapter: Path) -> tuple[list[int], bool]:
    """LoRA calls in flight (sampling 96 tokens each), then what burnish itself asks vLLM for
    prompt logprobs: a served teacher's scoring (the base) and the fidelity probe (the adapter).
    Every answer's status, and whether vLLM still answers after."""
    from burnish_server.core.learning.fidelity import Probe
    from burnish_server.serving.adapters import AdapterError, VLLMAdapters
    from burnish_server.serving.scoring import ScoringError, VLLMScorer

    assert httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "random@1", "lora_path": str(adapter)}).status_code == 200
    ids = list(range(100, 140))
    body = {"model": "random@1", "prompt": "Once upon a time", "max_tokens": 96, "min_tokens": 96, "temperature": 1.0, "logprobs": 0}
    with ThreadPoolExecutor(LORA_CALLS + 2) as pool:
        calls = [pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=300) for _ in range(LORA_CALLS)]
        scorer, adapters = VLLMScorer(url, timeout_s=300), VLLMAdapters(url, timeout_s=300)
        statuses = []
        for _ in range(3):  # while the calls decode
            try:
                scorer.logprobs("smollm2", [(ids, 1), (ids[:20], 1)])
                adapters.fidelity("random@1", Probe(sequences=[ids], logprobs=[[0.0] * (len(ids) - 1)], dtype="float32"))
                statuses.append(200)
            except (ScoringError, AdapterError, httpx.TransportError):
                statuses.append(500)
        scorer.close(), adapters.close()
        statuses += [call.result().status_code for call in calls]
    try:
        alive = httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        alive = False
    return statuses, alive


def test_scoring_beside_lora_calls_leaves_the_vllm_burnish_up_serves_alive(up: Up, tmp_path: Path) -> None:
    """vLLM as ``burnish up`` starts it serves LoRA on the projections alone (serving/process.py),
    so prompt logprobs beside LoRA calls are safe."""
    vllm_url = next(line.split("(")[1].split(")")[0] for line in up.log.splitlines() if line.startswith("starting vLLM"))
    adapter = random_adapter(up.data / "models" / "smollm2", tmp_path / "adapter")
    statuses, alive = scoring_beside_lora_calls(vllm_url, adapter)
    httpx.post(vllm_url + "/v1/unload_lora_adapter", json={"lora_name": "random@1"})
    assert statuses == [200] * (3 + LORA_CALLS) and alive


def test_vllms_own_lora_modules_die_on_the_same_requests(up: Up, tmp_path: Path) -> None:
    """The crash this guards against, reproduced: vLLM 0.32's CPU build with its default LoRA
    modules (the LM head included) kills its engine on the first prompt-logprobs request
    batched with LoRA calls. Should a vLLM release fix it, this test says so."""
    from burnish_server.cli.up import COMPACT_JSON
    from burnish_server.serving.process import VLLMServer
    from tests.servers import free_port

    model = up.data / "models" / "smollm2"
    server = VLLMServer(
        model=str(model),
        served_model_name="smollm2",
        port=free_port(),
        log_path=tmp_path / "vllm.log",
        dtype="float32",
        lora_modules=(),
        extra_args=COMPACT_JSON,
    )
    server.start()
    try:
        server.wait_healthy(600)
        statuses, alive = scoring_beside_lora_calls(server.url, random_adapter(model, tmp_path / "adapter"))
    finally:
        server.stop()
    assert 500 in statuses and not alive, statuses
    assert "add_lora_logits" in (tmp_path / "vllm.log").read_text()
