"""A calculator tool: the policy may write a call `<calc> 3 * 4 </calc>` and end its turn; the
environment replies with `<result> 12 </result>` and the policy goes on. A turn without a call is
the final answer: its last integer is checked against the row's `answer` (reward 1 or 0, done).

Prompt rows: {"prompt": "7 * 8 =", "answer": 56} (`arithmetic_rows` writes such rows).
"""

from __future__ import annotations

import ast
import operator
import random
import re

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
INTEGER = re.compile(r"-?\d+")
MAX_EXPRESSION = 64  # characters: a call longer than this is refused ("error")
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate(expression: str) -> int | None:
    """The integer value of an arithmetic expression (+ - * // % on integers, parentheses), or None
    for anything else (no names, calls, powers or floats: nothing of the text is executed)."""
    if len(expression) > MAX_EXPRESSION:
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(type(node).__name__)

    try:
        return value(tree)
    except (ValueError, ZeroDivisionError):
        return None


def last_integer(text: str) -> int | None:
    found = INTEGER.findall(text)
    return int(found[-1]) if found else None


class Calculator:
    """One arithmetic question; the policy may call the calculator before it answers."""

    def __init__(self, row: dict):
        self.answer = int(row["answer"])
        self.calls = 0

    def step(self, response: str) -> tuple[str | None, float, bool]:
        call = CALL.search(response)
        if call is not None:  # a tool call: the result is the next turn's context
            self.calls += 1
            result = evaluate(call.group(1))
            return (
                ("<result> error </result>" if result is None else f"<result> {result} </result>"),
                0.0,
                False,
            )
        correct = last_integer(response) == self.answer
        return None, 1.0 if correct else 0.0, True


def arithmetic_rows(count: int, seed: int, low: int = 2, high: int = 9, high_second: int = 19) -> list[dict]:
    """`count` products a * b (a in [low, high], b in [low, high_second]), as prompt rows."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(low, high), rng.randint(low, high_second)
        rows.append({"prompt": f"{a} * {b} =", "answer": a * b})
    return rows
