"""The objectives beside GRPO (trainer/objectives.py, trainer/teacher.py): supervised steps and
on-policy distillation, on the tiny model, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from burnish_server.core.learning.policies import DEFAULT_TOP_K, LoraSettings, Objective, Teacher, TeacherTurn, TrainSettings
from burnish_server.core.protocols.packed import pack_floats, pack_ids
from burnish_server.store.training import TrainingCall
from burnish_server.trainer.objectives import distill_loss, sft_loss
from burnish_server.trainer.policy_model import PolicyModel, make_micro_batch
from burnish_server.trainer.sequences import Sequence, build_sequences, sampled_call, training_batch
from burnish_server.trainer.teacher import ContextTeacher, teacher_against_rewards
from tests.records import chat_call

LORA = LoraSettings(rank=8, alpha=16)


def _random_adapter(model: PolicyModel, seed: int) -> None:
    """LoRA weights away from peft's start (B = 0), where every gradient is generic."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.params:
            p.copy_(torch.randn(p.shape, generator=generator) * 0.05)


def test_the_distillation_gradient_is_the_reverse_kls_checked_by_finite_differences(tiny_model: Path) -> None:
    """At one position, the expected gradient of the per-token loss over the policy's own next
    token (sum over the vocabulary, weighted by the policy's probability) is the gradient of the
    exact reverse KL to the teacher: checked along a random direction by central differences."""
    model = PolicyModel(str(tiny_model), LORA, TrainSettings())
    _random_adapter(model, 0)
    model.model.eval()
    prompt = model.tokenizer.encode("the cat sat on", add_special_tokens=False)
    vocabulary = model.model.get_input_embeddings().weight.shape[0]
    teacher = torch.log_softmax(torch.randn(vocabulary, generator=torch.Generator().manual_seed(1)) * 2, -1)
    items = []
    for y in range(vocabulary):  # one sequence per possible next token
        seq = Sequence()
        seq.add(prompt, [y], None)
        items.append((seq, 0.0))
    batch = make_micro_batch(items, model.pad_id, 64, model.device)
    at = len(prompt)

    def policy() -> torch.Tensor:
        return model.token_logprobs(batch)[:, at]  # log pi(y) for every y

    def kl() -> float:
        with torch.no_grad():
            logp = policy().double()
            return float((logp.exp() * (logp - teacher.double())).sum())

    full = model.token_logprobs(batch)  # [vocabulary, positions], with the gradient
    pi = full[:, at].detach().exp()
    surrogate = torch.zeros(())
    for y in range(vocabulary):  # on-policy: the behaviour is the policy's own logprob (weight 1)
        row = full[y : y + 1]
        taught = torch.zeros_like(row).index_fill_(1, torch.tensor([at]), float(teacher[y]))
        surrogate = surrogate + pi[y] * distill_loss(row, row.detach(), taught, batch.sampled[y : y + 1], normaliser=1).loss
    surrogate.backward()
    generator = torch.Generator().manual_seed(2)
    direction = [torch.randn(p.shape, generator=generator) for p in model.params]
    analytic = sum(float((p.grad * d).sum()) for p, d in zip(model.params, direction))
    eps = 1e-3
    with torch.no_grad():
        for p, d in zip(model.params, direction):
            p.add_(eps * d)
        up = kl()
        for p, d in zip(model.params, direction):
            p.sub_(2 * eps * d)
        down = kl()
    numeric = (up - down) / (2 * eps)
    assert abs(numeric) > 1e-3  # a direction that moves the KL
    assert analytic == pytest.approx(numeric, rel=2e-2)


def _record(trajectory: str, prompt: list[int], completion: list[int], messages: list | None = None):  # type: ignore[no-untyped-def]
    return chat_call(
        {"model": "agent", "messages": messages or []},
        None,
        trajectory_id=trajectory,
        group_id="g",
        policy="agent",
        policy_step=0,
        prompt_token_ids=pack_ids(prompt),
        completion_token_ids=pack_ids(completion),
        completion_logprobs=pack_floats([-0.5] * len(completion)),
        completion_lengths=pack_ids([len(completion)]),
    )


def test_sft_trains_the_best_members_sampled_tokens_only_never_the_tool_results() -> None:
    """Rejection sampling: a group's best at or above sft_min_reward imitate; their mask is their
    sampled tokens (two turns merged, the tool result between them context)."""
    rows = []
    for name, reward in (("a", 1.0), ("b", 0.0), ("c", 1.0)):
        # call 1 samples [9, 10]; call 2's prompt adds a tool result [50, 51] and samples [11]
        rows.append(TrainingCall("g", name, reward, _record(name, [1, 2], [9, 10])))
        rows.append(TrainingCall("g", name, reward, _record(name, [1, 2, 9, 10, 50, 51], [11])))
    batch = training_batch(rows, TrainSettings(objective=Objective(grpo=1, sft=1)))
    imitating = {seq.tokens[-1]: seq.imitate for seq, _ in batch.items}
    assert [seq.imitate for seq, _ in batch.items] == [True, False, True] and imitating
    built = make_micro_batch(batch.items, 0, 64, torch.device("cpu"))
    assert built.imitate[0].tolist() == [0, 0, 1, 1, 0, 0, 1]  # tokens 9, 10 and 11; never 50, 51
    assert built.imitate[1].sum() == 0 and torch.equal(built.grpo, built.sampled)
    # below the bar nothing imitates; GRPO alone marks no sequence
    assert not any(s.imitate for s, _ in training_batch(rows, TrainSettings(objective="sft", sft_min_reward=2.0)).items)
    assert not any(s.imitate for s, _ in training_batch(rows, TrainSettings()).items)


def test_a_group_without_rewards_distills_but_gives_grpo_nothing() -> None:
    rows = [TrainingCall("g", name, None, _record(name, [1, 2], [9])) for name in ("a", "b")]
    batch = training_batch(rows, TrainSettings(objective=Objective(grpo=1, distill=1)))
    assert [(s.grpo, a) for s, a in batch.items] == [(False, 0.0), (False, 0.0)] and batch.rewards == []


def test_each_objective_is_normalised_by_its_own_tokens(tiny_model: Path) -> None:
    """Weighted objectives in one step: each term is its own mean, however the micro-batches cut
    the step, and the figures report each objective's own tokens."""
    settings = TrainSettings(learning_rate=1e-2, objective=Objective(grpo=1.0, sft=0.5), micro_batch_tokens=16)

    def items() -> list[tuple[Sequence, float]]:
        out = []
        for i, (advantage, imitate) in enumerate(((1.0, True), (-1.0, False), (0.5, False))):
            seq = Sequence()
            seq.add([3, 4, 5], [6 + i, 7 + i, 8 + i, 9 + i][: 2 + i], None)
            seq.imitate = imitate
            out.append((seq, advantage))
        return out

    adapters = []
    for micro in (16, 4096):
        model = PolicyModel(str(tiny_model), LORA, msgspec.structs.replace(settings, micro_batch_tokens=micro))
        _random_adapter(model, 3)
        metrics = model.step(items())
        assert (metrics.grpo_tokens, metrics.sft_tokens, metrics.distill_tokens) == (9, 2, 0)
        adapters.append([p.detach().clone() for p in model.params])
        # the SFT figure is the demonstration's mean NLL, as computed by hand
        again = PolicyModel(str(tiny_model), LORA, settings)
        _random_adapter(again, 3)
        demo = items()[:1]
        batch = make_micro_batch(demo, again.pad_id, 64, again.device)
        with torch.no_grad():
            nll = sft_loss(again.token_logprobs(batch), batch.sampled, normaliser=2)
        assert metrics.sft_loss == pytest.approx(float(nll.loss), rel=1e-4)
    # Equal to float precision but where AdamW's first step divides a gradient within a few 1e-8
    # of zero by its own size (tests/trainer/test_policy_model.py: packed against padded).
    gaps = torch.cat([(a - b).abs().flatten() for a, b in zip(*adapters)])
    assert gaps.max() <= settings.learning_rate and int((gaps > 2e-5).sum()) <= gaps.numel() // 1000, (gaps.max(), int((gaps > 2e-5).sum()))


def test_a_teacher_with_hindsight_sees_what_followed_the_answer_or_teaches_nothing(tiny_model: Path) -> None:
    """Hindsight: the user's next message, shown after the conversation's last turn, is the
    teacher's hint for the answer given; a call that nothing followed is not distilled."""
    from transformers import AutoTokenizer

    from burnish_server.trainer.teacher import hint_of

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    teacher = ContextTeacher(tokenizer, Teacher(hindsight=True))
    messages = [{"role": "user", "content": "What is 9 + 8?"}]
    recorded = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    call = _record("t", recorded, [9], messages)
    followed = [{"role": "user", "content": "No, it is 17."}]
    hint = hint_of(followed)
    assert hint is not None and "[user] No, it is 17." in hint
    hinted = [{"role": "user", "content": f"What is 9 + 8?\n\n{hint}"}]
    assert teacher.prompt(call, recorded, followed) == list(tokenizer.apply_chat_template(hinted, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert teacher.prompt(call, recorded, None) is None and teacher.prompt(call, recorded, [{"role": "user", "content": ""}]) is None
    assert teacher.prompt(call, recorded[:-1], followed) is None  # rendered otherwise than vLLM saw it: never a guess


def test_the_context_teacher_sees_its_turns_after_the_system_message_or_nothing(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    context = Teacher(context=(TeacherTurn("user", "1 + 1?"), TeacherTurn("assistant", "2")))
    teacher = ContextTeacher(tokenizer, context)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]

    def render(msgs: list) -> list[int]:
        return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))

    recorded = render(messages)
    call = _record("t", recorded, [9], messages)
    got = teacher.prompt(call, recorded)
    assert got == render([messages[0], {"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}, messages[1]])
    # a prompt vLLM rendered otherwise (another template): no teacher prompt, never a guess
    assert teacher.prompt(call, recorded[:-1]) is None
    # the trainer's sequences carry it on the call's span
    sampled = sampled_call(call)
    assert sampled is not None
    sampled.teacher_prompt = got
    (seq,) = build_sequences([sampled]).sequences
    assert [(s.start, s.length, s.teacher_prompt) for s in seq.spans] == [(len(recorded), 1, got)]


def test_a_teachers_context_can_show_a_tool_agent_at_work(tiny_model: Path) -> None:
    """A worked episode with the assistant's tool call and the tool's result: the teacher's
    prompt renders them as the chat template renders a recorded conversation's."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    episode = msgspec.convert(
        [
            {"role": "user", "content": "What does cat mean?"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "lookup", "arguments": '{"word": "cat"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a small feline"},
            {"role": "assistant", "content": "A small feline."},
        ],
        list[TeacherTurn],
    )
    teacher = ContextTeacher(tokenizer, Teacher(context=tuple(episode)))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "What does dog mean?"}]

    def render(msgs: list) -> list[int]:
        return list(tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False))

    recorded = render(messages)
    call = chat_call({"model": "agent", "messages": messages, "tools": tools}, None)
    got = teacher.prompt(call, recorded)
    shown = [
        {"role": "user", "content": "What does cat mean?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": {"word": "cat"}}}]},
        {"role": "tool", "content": "a small feline", "tool_call_id": "c1"},
        {"role": "assistant", "content": "A small feline."},
    ]
    assert got == render([*shown, *messages]) and got != render(messages)
    assert '"cat"' in tokenizer.decode(got) and "a small feline" in tokenizer.decode(got)
    # A tool result without its call's id is refused when the policy is set, not at a step.
    with pytest.raises(msgspec.ValidationError, match="tool result needs its tool_call_id"):
        msgspec.convert({"context": [{"role": "tool", "content": "x"}]}, Teacher)


def test_distillation_moves_the_policy_towards_the_teacher_in_context(tiny_model: Path) -> None:
    """End to end in the trainer: the teacher (the base shown an example first) scores the
    policy's own samples, and a few distillation steps bring the policy's logprobs of them
    towards the teacher's: the reverse KL estimate falls."""
    torch.manual_seed(0)
    # On the sampled token alone (the base teacher's default is its top 16, tested below).
    teacher_turns = Teacher(context=(TeacherTurn("user", "Say 7."), TeacherTurn("assistant", "7 7 7 7 7 7 7 7")), top_k=0)
    settings = TrainSettings(learning_rate=5e-3, objective="distill", teacher=teacher_turns)
    model = PolicyModel(str(tiny_model), LORA, settings)
    teacher = ContextTeacher(model.tokenizer, teacher_turns)
    messages = [{"role": "user", "content": "Say 7."}]
    prompt = teacher.render(messages, None)
    kls = []
    for _ in range(8):
        model.model.eval()
        with torch.no_grad():
            out = model.model.generate(torch.tensor([prompt] * 8), do_sample=True, max_new_tokens=8, pad_token_id=model.pad_id)
        items = []
        for o in out:
            completion = o[len(prompt) :].tolist()
            call = sampled_call(_record("t", prompt, completion, messages))
            assert call is not None
            call.logprobs = None  # on-policy: the trainer's own logprobs stand in
            call.teacher_prompt = teacher.prompt(_record("t", prompt, completion, messages), prompt)
            (seq,) = build_sequences([call]).sequences
            seq.grpo = False
            items.append((seq, 0.0))
        metrics = model.step(items)
        assert metrics.distill_tokens == sum(s.sampled for s, _ in items) and metrics.grpo_tokens == 0
        kls.append(metrics.teacher_kl)
    assert sum(kls[-3:]) / 3 < 0.7 * sum(kls[:3]) / 3, kls


def test_top_k_distillation_pulls_up_a_token_the_policy_never_sampled(tiny_model: Path) -> None:
    """The policy samples one answer every time; the teacher, shown an example, would start it
    with another token. On the sampled token alone, distillation can only push that token down
    (the rest of the vocabulary rises with it, alike); from the teacher's top k, the policy's
    logprob of the teacher's first choice rises, far more."""
    turns = (TeacherTurn("user", "Say 7."), TeacherTurn("assistant", "7 7 7 7 7 7 7 7"))
    messages = [{"role": "user", "content": "Say 7."}]

    def run(top_k: int) -> tuple[int, float, float]:
        torch.manual_seed(0)
        teacher_turns = Teacher(context=turns, top_k=top_k)
        settings = TrainSettings(learning_rate=5e-3, objective="distill", teacher=teacher_turns)
        model = PolicyModel(str(tiny_model), LORA, settings)
        teacher = ContextTeacher(model.tokenizer, teacher_turns)
        prompt = teacher.render(messages, None)
        taught = teacher.prompt(_record("t", prompt, [0], messages), prompt)
        assert taught is not None
        # The teacher's first choice, and an answer that never starts with it.
        model.model.eval()
        with torch.no_grad(), model.model.disable_adapter():
            first = int(model.model(torch.tensor([taught])).logits[0, -1].argmax())
        answer = [t for t in model.tokenizer.encode("the cat sat", add_special_tokens=False) if t != first][:3]

        def logprob_of_first() -> float:
            probe = Sequence()
            probe.add(prompt, [first], None)
            model.model.eval()
            with torch.no_grad():
                return float(model.token_logprobs(make_micro_batch([(probe, 0.0)], model.pad_id, 4096, model.device))[0, len(prompt)])

        before = logprob_of_first()
        for _ in range(6):
            call = sampled_call(_record("t", prompt, answer, messages))
            assert call is not None
            call.logprobs, call.teacher_prompt = None, taught
            (seq,) = build_sequences([call]).sequences
            seq.grpo = False
            metrics = model.step([(seq, 0.0)] * 4)
            assert metrics.distill_tokens == 4 * len(answer)
        return first, before, logprob_of_first()

    first, before, sampled_only = run(0)
    again, start, top = run(8)
    assert (again, start) == (first, before)  # the same start
    print(f"logprob of the teacher's first choice: {before:.2f} -> sampled token only {sampled_only:.2f}, top 8 {top:.2f}")
    assert top - before > 1.0 and top - before > 3 * (sampled_only - before), (before, sampled_only, top)


def test_the_base_teacher_takes_its_top_16_unless_told_and_a_served_one_the_sampled_token() -> None:
    shown = (TeacherTurn("user", "Say 7."), TeacherTurn("assistant", "7"))
    assert Teacher(context=shown).top() == DEFAULT_TOP_K > 0
    # The default the settings' reference states is the one the trainer takes.
    assert f"null: {DEFAULT_TOP_K} for the base" in (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    assert Teacher(context=shown, top_k=0).top() == 0 and Teacher(context=shown, top_k=4).top() == 4
    assert Teacher(model="tiny-large").top() == 0
    with pytest.raises(ValueError, match="top_k"):
        Teacher(model="tiny-large", top_k=4)


async def test_a_policy_distills_through_the_gateway_and_vllm_with_no_reward_posted(make_gateway, vllm, tiny_model: Path) -> None:
    """End to end on the tiny model: calls through the gateway to vLLM, groups closed without a
    reward, the trainer's teacher shown its context, a step of distillation alone, published and
    served. Every call's prompt as vLLM rendered it is the teacher's render without the context."""
    import httpx

    from burnish_server.core.platform.settings import Settings
    from burnish_server.trainer.worker import TrainerWorker, WorkerSettings

    gw = make_gateway(upstream=vllm.url, upstream_timeout=120)
    teacher = {
        "context": [{"role": "system", "content": "Answer in digits."}, {"role": "user", "content": "digits"}, {"role": "assistant", "content": "1 2 3"}]
    }
    gw.create_policy(
        "distilled", "tiny", model_path=str(tiny_model), lora={"rank": 8, "alpha": 16},
        train={"learning_rate": 5e-3, "groups_per_step": 2, "objective": "distill", "teacher": teacher},
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
        for g in ("d1", "d2"):
            for i in range(3):
                r = await client.post(
                    f"/g/{g}/t/{g}-{i}/v1/chat/completions", json={"model": "distilled", "messages": [{"role": "user", "content": "digits"}], "max_tokens": 8}
                )
                assert r.status_code == 200, r.text
            assert (await client.post(f"/v1/groups/{g}/close")).status_code == 200
    assert gw.policy("distilled")["groups_ready"] == 2
    settings = Settings.load({}, data_dir=gw.settings.data_dir, upstream=vllm.url)
    worker = TrainerWorker(settings, WorkerSettings(worker_id="distill-test"))
    await worker.recover()
    try:
        assert await worker.run_once()
        status = gw.policy("distilled")
        metrics = status["last_step"]["metrics"]
        assert status["step"] == 1 and metrics["groups"] == 2
        assert metrics["distill_tokens"] == metrics["tokens"] > 0 and metrics["grpo_tokens"] == metrics["sft_tokens"] == 0
        assert metrics["teacher_unrendered_calls"] == 0 and metrics["teacher_kl"] != 0 and metrics["seconds_teacher"] > 0
    finally:
        await worker.close()
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": "distilled@1"})


def test_a_served_teacher_must_share_the_policys_tokenizer(make_gateway, upstream, database_url: str) -> None:
    """Checked when set, on create and on PATCH: vLLM's /tokenize of one probe under the teacher
    and under the base must give the same ids (the test upstream tokenizes `other-*` otherwise)."""
    gw = make_gateway(database_url)
    gw.create_policy("agent")
    upstream.models = ["tiny", "tiny-large", "other-family"]

    def patch(teacher: dict) -> Any:
        with gw.admin() as c:
            return c.patch("/admin/policies/agent", json={"train": {"objective": "distill", "teacher": teacher}})

    other = patch({"model": "other-family"})
    assert other.status_code == 400 and other.json()["error"]["code"] == "teacher_tokenizer", other.text
    assert "tokenizes otherwise than the policy's base 'tiny'" in other.json()["error"]["message"]
    absent = patch({"model": "absent"})
    assert absent.status_code == 400 and "could not check the tokenizer of 'absent'" in absent.json()["error"]["message"]
    assert patch({}).json()["error"]["code"] == "conflicting_settings"  # neither a context nor a model
    assert gw.policy()["train"]["objective"] == "grpo"  # nothing refused was kept
    assert patch({"model": "tiny-large"}).status_code == 200
    assert gw.policy()["train"]["teacher"] == {"context": [], "model": "tiny-large", "top_k": None, "hindsight": False}
    with gw.admin() as c:
        made = c.post("/admin/policies", json={"name": "b", "base_model": "tiny", "train": {"objective": "distill", "teacher": {"model": "other-family"}}})
        assert made.status_code == 400 and made.json()["error"]["code"] == "teacher_tokenizer"


def test_a_teacher_vllm_serves_scores_as_the_base_in_the_trainer(vllm, tiny_model: Path) -> None:
    """The same model as the teacher two ways, vLLM's prompt logprobs (serving/scoring.py) and
    the trainer's own forward pass with the adapter off, give the same logprobs of the sampled tokens."""
    from burnish_server.serving.scoring import VLLMScorer
    from burnish_server.trainer.teacher import served_scores

    teacher = Teacher(context=(TeacherTurn("user", "Say 7."), TeacherTurn("assistant", "7 7 7")))
    model = PolicyModel(str(tiny_model), LORA, TrainSettings(objective="distill", teacher=teacher))
    context = ContextTeacher(model.tokenizer, teacher)
    messages = [{"role": "user", "content": "Say 7."}]
    prompt = context.render(messages, None)

    def items() -> list[tuple[Sequence, float]]:
        out = []
        for completion in ([9, 10, 11], [12, 13], [14]):
            call = sampled_call(_record("t", prompt, completion, messages))
            assert call is not None
            call.teacher_prompt = context.prompt(_record("t", prompt, completion, messages), prompt)
            out.append((build_sequences([call]).sequences[0], 0.0))
        return out

    ours, theirs = items(), items()
    model.teach(ours)
    scorer = VLLMScorer(vllm.url)
    try:
        served_scores(theirs, scorer, "tiny", 4096)
    finally:
        scorer.close()
    assert scorer.requests == 1
    for (a, _), (b, _) in zip(ours, theirs):
        assert a.taught == b.taught and sum(a.taught or []) == a.sampled
        assert a.teacher_logprobs == pytest.approx(b.teacher_logprobs, abs=2e-3)


def test_a_step_with_nothing_to_train_leaves_the_adapter_as_it_was(tiny_model: Path) -> None:
    """Distillation alone, and no token the teacher could score: the step moves nothing (AdamW's
    momentum from an earlier step included)."""
    model = PolicyModel(str(tiny_model), LORA, TrainSettings(learning_rate=1e-2))
    _random_adapter(model, 4)
    seq = Sequence()
    seq.add([3, 4, 5], [6, 7], None)
    model.step([(seq, 1.0)])  # a GRPO step: AdamW now has momentum
    before = [p.detach().clone() for p in model.params]
    model.configure(TrainSettings(learning_rate=1e-2, objective="distill", teacher=Teacher(model="tiny")))
    unscored = Sequence()
    unscored.add([3, 4, 5], [6, 7], None)  # its span has no teacher prompt
    metrics = model.step([(unscored, 0.0)])
    assert metrics.distill_tokens == 0 and all(torch.equal(a, b) for a, b in zip(before, model.params))


def test_the_teacher_is_checked_against_the_rewards_pair_by_pair() -> None:
    def answer(lift: float, taught: bool = True) -> Sequence:
        seq = Sequence()
        seq.add([1, 2], [3, 4], [-1.0, -1.0])
        seq.teacher_logprobs = [0.0, 0.0, -1.0 + lift, -1.0 + lift]
        seq.taught = [0, 0, int(taught), int(taught)]
        return seq

    # Two answers above their baseline, two below; the teacher lifts the better ones more, but
    # less than the policy everywhere (its lifts are all negative): it agrees, pair by pair.
    agreeing = [(answer(-0.1), 1.0), (answer(-0.2), 0.5), (answer(-0.9), -1.0), (answer(-0.5), -0.5), (answer(0.3, taught=False), -1.0)]
    assert teacher_against_rewards(agreeing) == (4, 0)
    against = [(answer(-0.9), 1.0), (answer(-0.1), -1.0), (answer(0.0), 0.0)]
    assert teacher_against_rewards(against) == (1, 1)
