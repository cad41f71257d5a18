"""What followed an answer: the user's next turn, or a tool's result, as a signal about the answer.

Traffic in production seldom posts a verdict, but it goes on: the user replies ("Thanks." or
"No, I meant the other file"), a tool answers the call the model made. The next request
repeats the conversation so far, the answer included, and adds what followed. So an answer
and what followed it are found by content alone, whatever ids the agent sends:

    a recorded call           -> ``answered_key``: a digest of its prompt and its answer
    a later call's prompt     -> ``asked_key``: a digest of its messages up to its last
                                 assistant turn, and the messages after it (what followed)

Two calls whose keys match are an answer and its follow-up. Messages are compared as a client
sends them back: role, text (stripped) and tool calls by name and arguments; the ids a client
or a server mints are left out.

What followed then becomes a reward for the answer (``ruler.next_message``): the policy's judge
reads what followed and is asked one question, whether the user is happy (or, after a tool's
result, whether it worked); its score is the probability of "yes" among its two likeliest
answers (``judged_score``), read from the judge's logprobs, so that even the small model
``burnish up`` serves gives a graded score rather than a coin. It is shown what followed
alone: SmolLM2-135M, asked so, gave 0.57-0.61 to a thank-you and 0.31 to a correction, where
shown the conversation and the answer too it gave 0.56 and 0.48-0.53 (docs/notes/learning-runs.md).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import msgspec

from burnish_server.core.protocols.conversation import Exchange, Message

# The source of a reward the next-message judge gave: never a promotion test's evidence
# (store/promotion.py), so a judge cannot vouch for the versions it taught.
SOURCE = "next_message"
# The judge's questions, after what followed the answer: the user's turn, or a tool's result.
USER_QUESTION = "Is the user happy? Reply yes or no."
TOOL_QUESTION = "Did it work? Reply yes or no."
# Of what followed, at most this many characters shown to the judge (its start and its end).
SHOWN_CHARS = 4_000


def _shape(message: Message) -> list[object]:
    """A message as a client sends it back: ids out, text stripped."""
    calls = [[c.function.name, c.function.arguments] for c in message.tool_calls]
    return [message.role, message.content.strip(), calls]


def _digest(messages: Sequence[Message]) -> str:
    return hashlib.blake2b(msgspec.json.encode([_shape(m) for m in messages]), digest_size=16).hexdigest()


def answered_key(turn: Exchange) -> str | None:
    """A recorded call's prompt and answer, as a later request would repeat them; None for a call
    with no answer or several choices (a follow-up continues one)."""
    if len(turn.answers) != 1:
        return None
    return _digest([*turn.prompt, turn.answers[0]])


class Asked(msgspec.Struct, frozen=True):
    """A request that continues an earlier answer: the key of that answer, and what followed it."""

    key: str
    followed: tuple[Message, ...]


def asked_key(turn: Exchange) -> Asked | None:
    """The answer a request continues (its last assistant turn, with what came before it), and the
    messages after that turn; None for a request with no assistant turn, or nothing after it."""
    last = max((i for i, m in enumerate(turn.prompt) if m.role == "assistant"), default=None)
    if last is None or last == len(turn.prompt) - 1:
        return None
    return Asked(_digest(turn.prompt[: last + 1]), tuple(turn.prompt[last + 1 :]))


def _cut(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    keep = budget // 2
    return f"{text[:keep]}\n[...]\n{text[-keep:]}"


def judge_messages(followed: Sequence[Message]) -> list[dict[str, str]]:
    """The judge's chat: what followed the answer, and the question its first message asks."""
    shown = _cut("\n\n".join(m.content.strip() for m in followed if m.content.strip()), SHOWN_CHARS)
    question = TOOL_QUESTION if followed and followed[0].role == "tool" else USER_QUESTION
    return [{"role": "user", "content": f"After the assistant's answer, this came next:\n{shown}\n\n{question}"}]


def judged_score(top: Sequence[tuple[str, float]]) -> float | None:
    """The judge's first answer token's likeliest alternatives (text, logprob) -> P(yes) among its
    yes and no tokens; None where neither is among them (an answer that cannot be read)."""
    yes = no = 0.0
    for text, logprob in top:
        word = text.strip().lower()
        if not word:
            continue
        if "yes".startswith(word) or word.startswith("yes"):
            yes += math.exp(logprob)
        elif "no".startswith(word) or word.startswith("no"):
            no += math.exp(logprob)
    if yes + no == 0:
        return None
    return yes / (yes + no)
