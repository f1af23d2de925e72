"""The environment protocol: loading `module:Class`, the checks on what `step` returns, and the
built-in calculator and guessing game."""

from __future__ import annotations

import math

import pytest

from rlhf.config import ConfigError
from rlhf.envs import EnvError, check_step_result, load_environment
from rlhf.envs.calculator import Calculator, arithmetic_rows, evaluate
from rlhf.envs.guess import GuessNumber, guess_rows
from tests.support import envs_testing

T = "tests.support.envs_testing"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("no_colon", "name the module and the class, as 'module:Class'"),
        (":Echo", "name the module and the class"),
        ("tests.support.no_such_module:Echo", "importing module"),
        (f"{T}:Missing", "has no 'Missing'. Fix: name a class defined in it"),
        (f"{T}:not_a_class", "is a function, not a class"),
        (f"{T}:NoStep", "class NoStep has no step method. Fix: define step(self, response: str)"),
        (f"{T}:TwoArguments", "TwoArguments(row) cannot be called with one prompt row"),
    ],
)
def test_a_bad_env_name_is_a_config_error_naming_key_value_and_fix(name, expected):
    with pytest.raises(EnvError) as caught:
        load_environment(name)
    message = str(caught.value)
    assert expected in message and "env.name" in message and "Fix:" in message
    assert isinstance(caught.value, ConfigError)  # the CLI's exit code 2


def test_a_well_formed_class_loads():
    loaded = load_environment(f"{T}:Echo")
    assert loaded.cls is envs_testing.Echo and loaded.name == f"{T}:Echo"
    env = loaded.episode({"prompt": "a"}, 0)
    assert loaded.step(env, "a b", 0, 0) == ("k l m", 2.0, False)


def test_a_failing_init_names_the_row_and_its_fields():
    with pytest.raises(
        EnvError, match=r"NeedsAnswer\(row\) raised KeyError: 'answer'.* prompt row 7 \(its fields: prompt\)"
    ):
        load_environment(f"{T}:NeedsAnswer").episode({"prompt": "x"}, 7)


def test_a_failing_step_names_the_row_the_turn_and_the_response():
    loaded = load_environment(f"{T}:Raises")
    with pytest.raises(
        EnvError, match=r"step\(\) on prompt row 3, turn 2 raised RuntimeError: the tool crashed"
    ):
        loaded.step(loaded.episode({}, 3), "a b c", 3, 1)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (("x", 1.0), "returned ('x', 1.0)"),
        ("x", "returned 'x'"),
        ((3, 1.0, True), "the reply 3 (int)"),
        (("x", "1", True), "the reward '1' (str)"),
        (("x", True, True), "the reward True (bool)"),
        (("x", math.nan, True), "the reward nan, not a finite number. Fix: return a finite number"),
        (("x", 1e39, True), "the reward 1e+39, beyond float32"),  # finite, until cast to float32
        (("x", 10**400, True), "(an integer of 401 digits), beyond float32"),  # beyond even float64
        (("x", 1.0, 1), "done 1 (int)"),
    ],
)
def test_step_results_of_the_wrong_types_are_refused(result, expected):
    envs_testing.Returns.result = result
    loaded = load_environment(f"{T}:Returns")
    with pytest.raises(EnvError) as caught:
        loaded.step(loaded.episode({}, 0), "a", 0, 0)
    assert expected in str(caught.value) and "Fix:" in str(caught.value)


def test_step_results_of_the_right_types_pass():
    assert check_step_result([None, 2, False], "w") == (None, 2.0, False)
    assert check_step_result(("r", -0.5, True), "w") == ("r", -0.5, True)


def test_the_calculator_evaluates_arithmetic_and_nothing_else():
    assert evaluate(" 7 * 8 ") == 56 and evaluate("(2 + 3) * -4") == -20 and evaluate("17 // 5 % 2") == 1
    for text in ("__import__('os')", "2 ** 100", "1.5 * 2", "x", "1 / 0", "3 //", "9" * 70):
        assert evaluate(text) is None


def test_the_calculator_answers_calls_and_checks_the_final_answer():
    env = Calculator({"prompt": "7 * 8 =", "answer": 56})
    assert env.step("<calc> 7 * 8 </calc>") == ("<result> 56 </result>", 0.0, False)
    assert env.step("<calc> 7 * </calc>") == ("<result> error </result>", 0.0, False)
    assert env.step("it is 56") == (None, 1.0, True)
    assert Calculator({"answer": 56}).step("55") == (None, 0.0, True)
    assert Calculator({"answer": 56}).step("no number") == (None, 0.0, True)
    rows = arithmetic_rows(20, seed=1)
    assert rows == arithmetic_rows(20, seed=1) and all(eval(r["prompt"][:-1]) == r["answer"] for r in rows)


def test_the_guessing_game_says_higher_or_lower():
    env = GuessNumber({"target": 11})
    assert env.step("8") == ("higher", 0.0, False)
    assert env.step("13") == ("lower", 0.0, False)
    assert env.step("hmm") == ("say a number", 0.0, False)
    assert env.step("11") == (None, 1.0, True) and env.guesses == 3
    assert all(1 <= r["target"] <= 16 for r in guess_rows(30, seed=0))


def test_an_episodes_summed_turn_rewards_are_checked_after_the_cast_too():
    from types import SimpleNamespace

    from rlhf.envs.rollout import episode_total

    assert episode_total(SimpleNamespace(turn_rewards=[1.0, 2.5], index=0)) == 3.5  # type: ignore[arg-type]
    with pytest.raises(EnvError, match=r"turn rewards of row 4 summed to 6e\+38, beyond float32.*Fix:"):
        episode_total(SimpleNamespace(turn_rewards=[3e38, 3e38], index=4))  # type: ignore[arg-type]
