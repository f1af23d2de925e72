"""The ready verifiable reward functions (rlhf/rl/verifiers.py), by hand."""

from __future__ import annotations

import builtins
import random
import re
from fractions import Fraction

import pytest

from rlhf.config import ConfigError
from rlhf.rl import verifiers
from rlhf.rl.reward_functions import call_reward_function, load_reward_functions
from rlhf.rl.verifiers import (
    answer_tag_format,
    equivalent,
    evaluate_arithmetic,
    exact_answer,
    expression_answer,
    final_answer,
    last_number,
    length_penalty,
    numeric_answer,
    safe_expression,
    think_answer_format,
)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>2+2</think> <answer> 4 </answer>", "4"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("x \\boxed{a{b}c} y", "a{b}c"),
        ("work ... #### 72", "72"),
        ("The answer is: 18.", "18"),
        ("first 3 then 1,000 apples", "1,000"),
        ("no number here", None),
        ("", None),
    ],
)
def test_final_answer(response: str, expected: str | None) -> None:
    assert final_answer(response) == expected


def test_exact_answer() -> None:
    got = exact_answer(
        ["#### 1,000", "<answer>$5</answer>", "it is 4.", "0.5", "nothing"], ["1000", "5", "4", "1/2", "3"]
    )
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="answers"):
        exact_answer(["1"], ["1", "2"])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("so 3 then 1,000 apples", "1000"),
        ("costs $5.", "5"),
        ("it is 5.0", "5"),
        ("x = -3", "-3"),
        ("from 3-5", "5"),  # a dash between numbers is no sign
        ("1,2,3", "3"),  # commas that are no thousands separators split numbers
        ("12,345,678.25 in all", "12345678.25"),
        ("#### -0.5", "-1/2"),
        ("no number here", None),
        ("", None),
    ],
)
def test_last_number(text: str, value: str | None) -> None:
    assert last_number(text) == (None if value is None else Fraction(value))


def test_numeric_answer_compares_the_last_numbers_value() -> None:
    responses = ["The total is 1,000.", "$5", "5.0", "so -7", "-7", "none at all", "3 then 4", "#### 72"]
    answers = ["1000", 5, "5", "-7", "7", "3", "3", "Natalia sold 48/2 = 24 ... #### 72"]
    assert numeric_answer(responses, answers) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="row 1 .'n/a'. holds no number"):
        numeric_answer(["1", "2"], ["1", "n/a"])
    with pytest.raises(ValueError, match="answers"):
        numeric_answer(["1"], ["1", "2"])


def test_numeric_answer_through_the_reward_function_loader() -> None:
    [fn] = load_reward_functions(["rlhf.rl.verifiers:numeric_answer"])
    rows = [{"answer": "12", "id": 1}, {"answer": "-4", "id": 2}]
    got = call_reward_function(fn, ["q"] * 2, ["it is 12", "-4.00"], [[1]] * 2, rows)
    assert got.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("stated", "expected", "same"),
    [
        ("0.5", "1/2", True),
        ("\\frac{1}{2}", "0.5", True),
        ("50%", "1/2", True),
        ("2\\sqrt{2}", "sqrt(8)", True),
        ("2^{10}", "1024", True),
        ("\\pi", "pi", True),
        ("0.3333", "1/3", False),
        ("3", "4", False),
        ("x+1", "1+x", False),  # names other than sqrt and pi never reach sympy
        ("9**9**9", "1", False),  # a power tower is refused, not computed
        ("__import__(os)", "1", False),
    ],
)
def test_equivalent(stated: str, expected: str, same: bool) -> None:
    assert equivalent(stated, expected) is same


def test_safe_expression_lets_only_arithmetic_through() -> None:
    assert safe_expression("2**(1/2)+sqrt(3)*pi") and safe_expression("(1+2)/3")
    for bad in ("exec(chr(105))", "a.b", "2**1000", "2**2**2", "1" * 201, "", "x_1"):
        assert not safe_expression(bad), bad


def test_math_answer_through_the_reward_function_loader() -> None:
    [fn] = load_reward_functions(["rlhf.rl.verifiers:math_answer"])
    rows = [{"answer": "1/2"}, {"answer": "3"}, {"answer": "0.25"}]
    got = call_reward_function(
        fn, ["q"] * 3, ["\\boxed{0.5}", "#### 4", "<answer>25%</answer>"], [[1]] * 3, rows
    )
    assert got.tolist() == [1.0, 0.0, 1.0]


def test_math_answer_without_sympy_names_the_extra(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_sympy(name, *args, **kwargs):
        if name == "sympy" or name.startswith("sympy."):
            raise ImportError("no sympy")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sympy)
    with pytest.raises(ConfigError, match=r"rlhf\[math\]"):
        verifiers.math_answer(["1"], ["1"])


def test_format_rewards() -> None:
    responses = [
        "<think>a</think><answer>1</answer>",
        " <think>\na\n</think>\n<answer>1</answer>\n",
        "<answer>1</answer>",
        "<think>a</think><answer>1</answer><answer>2</answer>",
        "<think><think>a</think></think><answer>1</answer>",
        "text <think>a</think><answer>1</answer>",
        "",
    ]
    assert think_answer_format(responses) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert answer_tag_format(responses) == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def test_length_penalty() -> None:
    ids = [[1] * 5, [1] * 150, []]
    assert length_penalty(ids) == pytest.approx([-0.05, -1.5, 0.0])
    assert length_penalty(ids, max_tokens=[10, 50, None]) == pytest.approx([0.0, -1.0, 0.0])


def _random_arithmetic(rng: random.Random, depth: int = 0) -> str:
    if depth > 2 or rng.random() < 0.3:
        return str(rng.choice([rng.randint(0, 99), round(rng.uniform(0, 9), 1)]))
    left, right = _random_arithmetic(rng, depth + 1), _random_arithmetic(rng, depth + 1)
    text = f"{left} {rng.choice('+-*/')} {right}"
    return f"({text})" if rng.random() < 0.5 else text


def test_evaluate_arithmetic_equals_pythons_value_on_random_expressions() -> None:
    rng, checked = random.Random(0), 0
    for _ in range(400):
        text = _random_arithmetic(rng)
        try:
            # the plain reference: Python's own arithmetic over exact fractions (test-built text only)
            expected = eval(re.sub(r"(\d+(?:\.\d+)?)", r"Fraction('\1')", text), {"Fraction": Fraction})
        except ZeroDivisionError:
            assert evaluate_arithmetic(text) is None
            continue
        assert evaluate_arithmetic(text) == expected, text
        checked += 1
    assert checked > 300


@pytest.mark.parametrize(
    "text",
    ["", "2 +", "(1 + 2", "1 + 2)", "2 ** 3", "__import__('os')", "1e9", "1 / 0", "3 4", "2 % 3", "(" * 300],
)
def test_evaluate_arithmetic_refuses_what_is_not_arithmetic(text: str) -> None:
    assert evaluate_arithmetic(text) is None


def test_expression_answer_computes_the_responses_arithmetic() -> None:
    responses = [
        "(76 - 25)",
        "76 - 25 = 99",
        "8 / 3",
        "8/3.",
        "10 - (2 + 3)\nso 5",
        "-(2 - 5)",
        "51",
        "x + 1",
        "",
    ]
    answers = ["51", "51", "2.67", "2.7", "5", "3", "51", "1", "1"]
    assert expression_answer(responses, answers) == [1, 1, 1, 1, 1, 1, 1, 0, 0]
    # rounding to the answer's decimals is half away from zero; an integer answer is matched exactly
    assert expression_answer(
        ["2.675 * 1", "-2.675 * 1", "51.4", "0.125"], ["2.68", "-2.68", "51", "0.13"]
    ) == [1, 1, 0, 1]
    with pytest.raises(ValueError, match="row 1"):
        expression_answer(["1", "2"], ["1", "none"])
    with pytest.raises(ValueError, match="2 completions for 1 answers"):
        expression_answer(["1", "2"], ["1"])
