r"""Ready reward functions for verifiable rewards (`--reward-fn rlhf.rl.verifiers:NAME`; the calling
convention of docs/algorithms.md §31; the page docs/verifiable_rewards.md): `exact_answer`,
`numeric_answer` (1,000 = 1000, $5 = 5, 5.0 = 5), `expression_answer` (the response's arithmetic,
computed: PAL), `math_answer` (sympy, the `math` extra),
`answer_tag_format`, `think_answer_format` (R1's format) and `length_penalty`; each function's
docstring says what scores 1.

The final answer of a response (`final_answer`) is, in this order: the content of its last
<answer>...</answer> block, of its last \boxed{...}, the text after its last "####" or "answer:",
else its last number; None when there is none (the response scores 0)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from rlhf.config import ConfigError

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
THINK_ANSWER = re.compile(
    r"^\s*<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)*</answer>\s*$", re.S
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
MARKER = re.compile(r"(?:####|answer\s*(?:is)?\s*:)", re.I)


def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def final_answer(response: str) -> str | None:
    """The answer a response states (see the module's docstring), stripped; None if none."""
    tags = ANSWER_TAG.findall(response)
    if tags:
        return str(tags[-1]).strip()
    boxed = _boxed(response)
    if boxed is not None:
        return boxed.strip()
    markers = list(MARKER.finditer(response))
    if markers:
        after = response[markers[-1].end() :].strip()
        return after.splitlines()[0].strip().rstrip(".") if after else None
    numbers = NUMBER.findall(response)
    return numbers[-1] if numbers else None


def _normal(text: str) -> str:
    """Spaces, a trailing period, `$` and thousands separators removed (1,000 -> 1000)."""
    text = text.strip().strip("$").rstrip(".").replace(" ", "")
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


def _check_lengths(completions: Sequence[str], answer: Sequence[object]) -> None:
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions for {len(answer)} answers")


def exact_answer(completions: Sequence[str], answer: Sequence[object], **kwargs: object) -> list[float]:
    """1.0 where the response's final answer is the `answer` field as text (spaces, `$`, a final
    period and thousands separators ignored), else 0.0."""
    _check_lengths(completions, answer)
    out = []
    for response, expected in zip(completions, answer):
        stated = final_answer(response)
        out.append(float(stated is not None and _normal(stated) == _normal(str(expected))))
    return out


# a number as written in text: an optional sign (not after a letter or digit: 3-5 is 3 and 5), an
# optional $, digits with thousands separators (1,000,000) or without, an optional decimal part
WRITTEN_NUMBER = re.compile(r"(?:(?<![0-9A-Za-z])-)?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|-?\$?\.\d+")


def last_number(text: str) -> Fraction | None:
    """The value of the last number written in `text` (exact: 5.0 and 5 are equal), None if none."""
    found = WRITTEN_NUMBER.findall(text)
    return Fraction(found[-1].replace(",", "").replace("$", "")) if found else None


def numeric_answer(completions: Sequence[str], answer: Sequence[object], **kwargs: object) -> list[float]:
    """1.0 where the last number in the response equals the last number of the `answer` field (its
    value: 1,000 = 1000, $5 = 5, 5.0 = 5, -3 keeps its sign), else 0.0; a response without a number
    scores 0. An `answer` without a number is an error of the prompts file (it names the row)."""
    _check_lengths(completions, answer)
    out = []
    for row, (response, expected) in enumerate(zip(completions, answer)):
        value = last_number(str(expected))
        if value is None:
            raise ValueError(f"the answer field of row {row} ({str(expected)[:60]!r}) holds no number")
        out.append(float(last_number(response) == value))
    return out


ARITHMETIC = re.compile(r"\s*(?:\d+(?:\.\d+)?|\.\d+|[-+*/()])")


def evaluate_arithmetic(text: str) -> Fraction | None:
    """The exact value of `text` if it is arithmetic over decimal numbers with + - * / and parentheses
    (unary minus allowed; at most 200 characters and 40 numbers), else None (also for a division by
    zero). A recursive-descent parser: nothing of the text is executed."""
    text = text.strip()
    if not text or len(text) > 200:
        return None
    tokens, position = [], 0
    while position < len(text):
        match = ARITHMETIC.match(text, position)
        if match is None or not match.group().strip():
            return None
        tokens.append(match.group().strip())
        position = match.end()
    if sum(t[0].isdigit() or t[0] == "." for t in tokens) > 40:
        return None
    at = 0

    def peek() -> str | None:
        return tokens[at] if at < len(tokens) else None

    def take() -> str:
        nonlocal at
        at += 1
        return tokens[at - 1]

    def expression() -> Fraction:
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    def term() -> Fraction:
        value = factor()
        while peek() in ("*", "/"):
            operator, right = take(), factor()
            value = value * right if operator == "*" else value / right  # ZeroDivisionError below
        return value

    def factor() -> Fraction:
        token = peek()
        if token == "-":
            take()
            return -factor()
        if token == "(":
            take()
            value = expression()
            if peek() != ")":
                raise ValueError("unclosed parenthesis")
            take()
            return value
        if token is None or not (token[0].isdigit() or token[0] == "."):
            raise ValueError("a number expected")
        return Fraction(take())

    try:
        value = expression()
    except (ValueError, ZeroDivisionError, RecursionError):
        return None
    return value if at == len(tokens) else None


def _stated_decimals(text: str) -> int:
    """How many decimals the last number of `text` is written with (2.67 -> 2, 51 -> 0)."""
    found = WRITTEN_NUMBER.findall(text)
    return len(found[-1].split(".")[1]) if found and "." in found[-1] else 0


def expression_answer(completions: Sequence[str], answer: Sequence[object], **kwargs: object) -> list[float]:
    """1.0 where the response's arithmetic has the `answer` field's value, else 0.0 (PAL, Gao et al.
    2022: the policy writes the computation, the verifier computes it). The arithmetic is the
    response's first line up to any "=" (so "76 - 25 = 51" counts its left side), a final period
    dropped; its exact value, rounded to as many decimals as `answer` states (8/3 is 2.67), must equal
    `answer`'s last number. A response that is not such arithmetic scores 0."""
    _check_lengths(completions, answer)
    out = []
    for row, (response, expected) in enumerate(zip(completions, answer)):
        value = last_number(str(expected))
        if value is None:
            raise ValueError(f"the answer field of row {row} ({str(expected)[:60]!r}) holds no number")
        lines = response.strip().splitlines()
        stated = evaluate_arithmetic(lines[0].split("=")[0].strip().rstrip(".")) if lines else None
        decimals = _stated_decimals(str(expected))
        if stated is not None and decimals:  # half away from zero, as answers are rounded
            scale = 10**decimals
            sign = -1 if stated < 0 else 1
            stated = Fraction(sign * math.floor(abs(stated) * scale + Fraction(1, 2)), scale)
        out.append(float(stated == value))
    return out


def _sympy() -> Any:
    try:
        import sympy  # type: ignore[import-untyped]
    except ImportError:  # the optional extra
        raise ConfigError(
            "rlhf.rl.verifiers:math_answer needs sympy, which is not installed. "
            "Fix: pip install 'rlhf[math]' (or pip install sympy), or use rlhf.rl.verifiers:exact_answer."
        ) from None
    return sympy


LATEX = (
    (re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}"), r"((\1)/(\2))"),
    (re.compile(r"\\sqrt\{([^{}]*)\}"), r"sqrt(\1)"),
    (re.compile(r"\\(?:left|right|,|!|;)"), ""),
    (re.compile(r"\\(?:cdot|times)"), "*"),
    (re.compile(r"\\pi"), "pi"),
    (re.compile(r"\^"), "**"),
    (re.compile(r"[{}]"), lambda m: "(" if m[0] == "{" else ")"),
)


NAMES = {"sqrt", "pi"}  # the only identifiers an answer may use
EXPONENT = re.compile(r"\*\*(?:-?\d{1,3}(?![\d.])|\(-?\d{1,3}(?:/\d{1,3})?\))")


def safe_expression(text: str) -> bool:
    """Whether `text` is short arithmetic sympy may evaluate: digits, + - * / ( ) ., the names sqrt
    and pi, and one power whose exponent is a literal of at most 3 digits (2**10, 2**(1/2); no 9**9**9).
    sympy's parser evaluates Python, so nothing else reaches it (a response is model output)."""
    if not text or len(text) > 200 or re.search(r"[^0-9a-z+\-*/().]", text):
        return False
    if set(re.findall(r"[a-z]+", text)) - NAMES:
        return False
    return text.count("**") == len(EXPONENT.findall(text)) <= 1


def parse_math(text: str) -> Any:
    """A sympy expression of a final answer (plain arithmetic, fractions, powers, sqrt, pi and simple
    LaTeX: \\frac, \\sqrt, \\cdot, ^; a trailing % divides by 100); None if it does not parse or is
    not `safe_expression`."""
    sympy = _sympy()
    text = _normal(text)
    percent = text.endswith("%") or text.endswith("\\%")
    text = text.rstrip("%").rstrip("\\")
    for pattern, replacement in LATEX:
        text = pattern.sub(replacement, text)
    text = re.sub(r"(?<=[\d)])(?=[a-z(])", "*", text)  # implicit products: 2sqrt(2), 2(3), (1)(2)
    if not safe_expression(text):
        return None
    try:
        value = sympy.sympify(text, rational=True)
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError, AttributeError):
        return None
    return value / 100 if percent else value


def equivalent(stated: str, expected: str) -> bool:
    """Whether two final answers are the same number or expression: equal as text, or sympy's
    difference simplifies to 0 (|difference| < 1e-9 for numbers)."""
    if _normal(stated) == _normal(expected):
        return True
    a, b = parse_math(stated), parse_math(expected)
    if a is None or b is None:
        return False
    sympy = _sympy()
    try:
        difference = sympy.simplify(a - b)
        if difference == 0:
            return True
        return bool(difference.is_number and abs(complex(sympy.N(difference))) < 1e-9)
    except (TypeError, ValueError, AttributeError):
        return False


def math_answer(completions: Sequence[str], answer: Sequence[object], **kwargs: object) -> list[float]:
    """1.0 where the response's final answer equals the `answer` field mathematically (0.5 = 1/2 =
    \\frac{1}{2} = 50%), else 0.0; needs sympy (`pip install 'rlhf[math]'`)."""
    _check_lengths(completions, answer)
    _sympy()  # a missing extra stops the run at the first call, with its fix
    out = []
    for response, expected in zip(completions, answer):
        stated = final_answer(response)
        out.append(float(stated is not None and equivalent(stated, str(expected))))
    return out


def answer_tag_format(completions: Sequence[str], **kwargs: object) -> list[float]:
    """1.0 where the response holds exactly one <answer>...</answer> block, else 0.0."""
    return [float(len(ANSWER_TAG.findall(c)) == 1 and c.count("<answer>") == 1) for c in completions]


def think_answer_format(completions: Sequence[str], **kwargs: object) -> list[float]:
    """1.0 where the whole response is one <think>...</think> followed by one <answer>...</answer>
    (DeepSeek-R1's format reward, Guo et al. 2025 §2.2.2), else 0.0."""
    return [float(THINK_ANSWER.match(c) is not None) for c in completions]


def length_penalty(
    completion_ids: Sequence[Sequence[int]], max_tokens: Sequence[Any] | None = None, **kwargs: object
) -> list[float]:
    """-(tokens beyond the limit) / 100 per response: 0 within the limit, -1 at 100 tokens over it.
    The limit is the prompt file's `max_tokens` field of the row when the file has one, else 0
    (every token costs 0.01). For the DAPO paper's soft ramp at the budget use
    `reward.overlong_buffer` instead (docs/algorithms.md §37)."""
    limits = [0] * len(completion_ids) if max_tokens is None else [int(m or 0) for m in max_tokens]
    if len(limits) != len(completion_ids):
        raise ValueError(f"{len(completion_ids)} responses for {len(limits)} max_tokens")
    return [-max(0, len(ids) - limit) / 100 for ids, limit in zip(completion_ids, limits)]
