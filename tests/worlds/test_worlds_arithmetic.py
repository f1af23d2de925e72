"""The built-in arithmetic task (rlhf/worlds/arithmetic.py): its split, its files and its verifier."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from rlhf.worlds.arithmetic import (
    NAMES,
    TEMPLATES,
    ArithmeticConfig,
    answer_of,
    build_arithmetic,
    correct,
    parse_answer,
)


def test_every_problem_states_its_sum_and_the_split_is_disjoint() -> None:
    task = build_arithmetic(ArithmeticConfig(seed=3, max_operand=4))
    for problem in task.train + task.test:
        assert int(problem["answer"]) == answer_of(problem["prompt"])
    assert not {p["prompt"] for p in task.train} & {p["prompt"] for p in task.test}
    pairs = lambda rows: {tuple(sorted(w for w in p["prompt"].split() if w.isdigit())) for p in rows}  # noqa: E731
    assert pairs(task.test) <= pairs(task.train)  # held-out phrasings of sums seen in training


@pytest.mark.parametrize("held", [1, 2])
def test_each_pair_holds_out_its_templates_and_every_template_is_held_out(held: int) -> None:
    config = ArithmeticConfig(seed=0, heldout_templates_per_pair=held, names_per_problem=1)
    task = build_arithmetic(config)
    n_pairs = (config.max_operand + 1) ** 2
    assert len(task.test) == n_pairs * held and len(task.train) == n_pairs * (len(TEMPLATES) - held)
    shapes = Counter()
    for problem in task.test:
        words = problem["prompt"].split()
        shape = " ".join("{n}" if w.isdigit() else ("{name}" if w in NAMES else w) for w in words)
        shapes[shape] += 1
    assert len(shapes) == len(TEMPLATES)  # every template is held out for some pairs
    assert max(shapes.values()) - min(shapes.values()) <= 1 + n_pairs // 10  # and about equally often


def test_the_task_is_deterministic_and_writes_its_files(tmp_path) -> None:
    config = ArithmeticConfig(seed=1, sft_correct_rate=0.0)
    a, b = build_arithmetic(config), build_arithmetic(config)
    assert a.train == b.train and a.test == b.test
    assert build_arithmetic(ArithmeticConfig(seed=2, heldout_templates_per_pair=2)).test != a.test
    a.write(tmp_path / "one")
    b.write(tmp_path / "two")
    for name in ("prompts_train.jsonl", "prompts_test.jsonl", "sft_train.jsonl", "arithmetic.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    sft = [json.loads(line) for line in (tmp_path / "one" / "sft_train.jsonl").read_text().splitlines()]
    assert len(sft) == a.config.sft_examples
    # format-only warm-up: answers uniform over the range, right about 1 time in 19
    right = sum(r["response"] == str(answer_of(r["prompt"])) for r in sft) / len(sft)
    assert 0.02 < right < 0.09
    assert {r["response"] for r in sft} == {str(i) for i in range(19)}
    half = build_arithmetic(ArithmeticConfig(seed=1, sft_correct_rate=0.5)).sft_examples(
        4000, random.Random(0)
    )
    right = sum(r["response"] == str(answer_of(r["prompt"])) for r in half) / len(half)
    assert right == pytest.approx(0.5 + 0.5 / 19, abs=0.03)  # right, or right by chance


def test_every_word_of_the_task_is_one_token() -> None:
    task = build_arithmetic(ArithmeticConfig())
    tok = task.tokenizer
    for problem in task.train[:50] + task.test[:50]:
        ids = tok(problem["prompt"] + " " + problem["answer"], add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids and len(ids) == len(problem["prompt"].split()) + 1


def test_the_verifier_is_exact() -> None:
    assert correct(["7", " 7 ", "07", "7.0", "seven", "7 8", "", "-7"], ["7"] * 8) == [
        1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    ]  # fmt: skip
    assert correct(["12"], [12]) == [1.0]
    assert parse_answer("3") == 3 and parse_answer("3 4") is None
    with pytest.raises(ValueError, match="answers"):
        correct(["1"], [])
    with pytest.raises(ValueError, match="two numbers"):
        answer_of("what is it ?")


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="max_operand"):
        ArithmeticConfig(max_operand=0)
    with pytest.raises(ValueError, match="heldout_templates_per_pair"):
        ArithmeticConfig(heldout_templates_per_pair=len(TEMPLATES))
    with pytest.raises(ValueError, match="sft_correct_rate"):
        ArithmeticConfig(sft_correct_rate=1.5)
