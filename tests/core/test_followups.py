"""What followed an answer (core/learning/followups.py): found by content, asked about, scored."""

from __future__ import annotations

import math

import pytest

from burnish_server.core.learning.followups import TOOL_QUESTION, USER_QUESTION, answered_key, asked_key, judge_messages, judged_score
from burnish_server.core.protocols.conversation import Exchange, Message
from burnish_server.core.protocols.wire import tool_call

ASK = Message("user", "What is 2 + 2?")
SAID = Message("assistant", "4")


def test_a_request_that_repeats_an_answer_is_its_follow_up_whatever_the_ids() -> None:
    answered = answered_key(Exchange([ASK], None, [SAID]))
    # The client sends the answer back (its text padded, its tool calls' ids its own) and says more.
    asked = asked_key(Exchange([ASK, Message("assistant", " 4 \n"), Message("user", "Thanks.")], None, []))
    assert asked is not None and asked.key == answered and asked.followed == (Message("user", "Thanks."),)
    called = Message("assistant", "", (tool_call("add", '{"a": 2}', id="call_1"),))
    back = Message("assistant", "", (tool_call("add", '{"a": 2}', id="other"),))
    result = Message("tool", "4", tool_call_id="other")
    assert asked_key(Exchange([ASK, back, result], None, [])).key == answered_key(Exchange([ASK], None, [called]))  # type: ignore[union-attr]
    # Another answer, several choices, or nothing after the answer: no pair.
    assert asked_key(Exchange([ASK, Message("assistant", "5"), Message("user", "?")], None, [])).key != answered  # type: ignore[union-attr]
    assert answered_key(Exchange([ASK], None, [SAID, SAID])) is None
    assert asked_key(Exchange([ASK, SAID], None, [])) is None and asked_key(Exchange([ASK], None, [])) is None


def test_the_judge_is_asked_about_what_followed_and_scored_from_its_yes_and_no() -> None:
    (user,) = judge_messages([Message("user", "No, it is 17.")])
    assert "No, it is 17." in user["content"] and user["content"].endswith(USER_QUESTION)
    assert judge_messages([Message("tool", "error: no such file")])[0]["content"].endswith(TOOL_QUESTION)
    assert judged_score([("Yes", math.log(0.6)), ("No", math.log(0.2)), ("The", math.log(0.1))]) == pytest.approx(0.75)
    assert judged_score([(" yes", math.log(0.1)), ("no", math.log(0.1)), ("n", math.log(0.2))]) == pytest.approx(0.25)
    assert judged_score([("Maybe", -0.1), ("", -1.0)]) is None
