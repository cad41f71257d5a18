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
reads the conversation, the answer and what followed, and is asked one question, whether what
followed shows the answer served; its score is the probability of "yes" among its two
likeliest answers (``judged_score``), read from the judge's logprobs, so that even the small
model ``burnish up`` serves gives a graded score rather than a coin.
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
# The judge's question, after the conversation, the answer and what followed.
JUDGE_SYSTEM = (
    "You judge one answer of an AI assistant by what happened next. A reply that thanks, agrees or moves on, "
    "or a tool result that succeeds, means the answer served. A correction, a complaint, the question asked "
    "again, or a tool error means it did not."
)
JUDGE_QUESTION = "Did the answer serve? Reply with one word: yes or no."
# Of a conversation shown to the judge, at most this many characters (its start and its end).
SHOWN_CHARS = 6_000


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


def judge_messages(prompt: Sequence[Message], answer: Message, followed: Sequence[Message]) -> list[dict[str, str]]:
    """The judge's chat: the conversation before the answer, the answer, what followed, the question."""
    before = _cut("\n\n".join(m.render() for m in prompt), SHOWN_CHARS)
    after = _cut("\n\n".join(m.render() for m in followed), SHOWN_CHARS // 2)
    user = (
        f"<conversation>\n{before}\n</conversation>\n\n<answer>\n{_cut(answer.render(), SHOWN_CHARS // 2)}\n</answer>\n\n"
        f"<what_followed>\n{after}\n</what_followed>\n\n{JUDGE_QUESTION}"
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


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
