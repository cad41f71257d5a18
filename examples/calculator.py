"""A multi-turn agent with a tool: it must compute a sum with a calculator, then answer.

    python examples/calculator.py                 # starts `burnish up`, trains, stops it (as digits.py)

Each episode is one trajectory of two calls through the gateway:

    1. "What is 12 + 30? Use the calculator."   tools=[calculator], tool_choice=calculator
       -> the model calls calculator(expression=...)    (a strict tool: vLLM's guided decoding
                                                         holds the arguments to its schema)
    2. the tool's result goes back as a `tool` message  tool_choice="none"
       -> the model answers in words

Reward: half for an expression the calculator can read (the share of its characters that
are digits or operators, and all of it if it evaluates), half for the share of digits in
the final answer. On the random tiny model the calls are nonsense at first; the reward rises
as the policy learns to write numbers in both places. The trainer sees two sequences per
episode (the tool call is re-rendered by the chat template, so the second prompt does not
extend the first one's tokens).
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import os
import random

from digits import digit_share, main

from burnish import AsyncClient

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression such as 12 + 30.",
            "strict": True,  # vLLM then holds the arguments to the schema (guided decoding)
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "maxLength": 20}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    }
]
CALL_CALCULATOR = {"type": "function", "function": {"name": "calculator"}}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> float:
    """+ - * / on numbers, nothing else (never eval)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("only numbers and + - * /")

    return walk(ast.parse(expression, mode="eval").body)


def expression_score(expression: str) -> float:
    try:
        calculate(expression)
        return 1.0
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
        return sum(ch in "0123456789+-*/. " for ch in expression) / max(len(expression), 1)


async def play_round(client: AsyncClient, round_no: int, *, groups: int = 2, size: int = 4, policy: str = "agent") -> list[tuple[float, str]]:
    rng = random.Random(round_no)
    tasks = [(rng.randint(1, 50), rng.randint(1, 50)) for _ in range(groups)]

    async def episode(group, g: int, i: int) -> tuple[float, str]:
        a, b = tasks[g]
        t = group.trajectory(f"{group.id}-{i}")
        llm = t.async_openai(max_retries=0)
        sampling = {"temperature": 1.0, "seed": round_no * 1000 + g * 100 + i, "extra_body": {"top_k": 50}}
        messages = [{"role": "user", "content": f"What is {a} + {b}? Use the calculator."}]
        # Room for the call's JSON around an expression of at most 20 characters (the schema's maxLength);
        # a random model sometimes pads the call with whitespace until it runs out: no call, then.
        first = await llm.chat.completions.create(model=policy, messages=messages, tools=TOOLS, tool_choice=CALL_CALCULATOR, max_tokens=64, **sampling)
        calls = first.choices[0].message.tool_calls or []
        expression = ""
        if calls:
            try:  # guided decoding keeps the call's JSON valid; its shape is still the model's
                arguments = json.loads(calls[0].function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = {}
            expression = str(arguments.get("expression", "")) if isinstance(arguments, dict) else ""
            try:
                result = str(calculate(expression))
            except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as exc:
                result = f"error: {exc}"
            messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": calls[0].id, "content": result}]
        else:  # no usable call (it ran out of tokens): the agent asks for the answer anyway
            messages += [{"role": "assistant", "content": first.choices[0].message.content or ""}, {"role": "user", "content": "Answer with the number."}]
        raw = await llm.chat.completions.with_raw_response.create(model=policy, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=16, **sampling)
        answer = raw.parse().choices[0].message.content or ""
        reward = 0.5 * expression_score(expression) + 0.5 * digit_share(answer)
        await t.reward(reward, expression=expression_score(expression), answer=digit_share(answer))
        return reward, raw.headers["x-policy-version"]

    sets = [client.group(size=size, id=f"calc-r{round_no}-g{g}-{os.getpid()}") for g in range(groups)]
    return list(await asyncio.gather(*(episode(group, g, i) for g, group in enumerate(sets) for i in range(size))))


if __name__ == "__main__":
    main(play_round, __doc__)
