"""examples/smollm2_math: the data builder writes SVAMP's numbers back, prepare.py turns prefix
equations into the SFT answers the verifier accepts, the three configs are valid and change what a
135M policy needs, and the summary reads eval_test.json and GNU time's figures."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from rlhf.config import RLConfig, load_config
from rlhf.rl.verifiers import expression_answer, numeric_answer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_math"
VERIFIER = "rlhf.rl.verifiers:expression_answer"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"smollm2_math_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prepare():
    return load("prepare")


def test_build_data_writes_the_numbers_back_and_tidies_the_text():
    build = load("build_data")
    assert build.number_text("504.0") == "504" and build.number_text(2.5) == "2.5"
    masked = "Bryan has number0 books in each of his number1 bookshelves , how many ?"
    assert (
        build.tidy(build.fill_numbers(masked, "56.0 9.0"))
        == "Bryan has 56 books in each of his 9 bookshelves, how many?"
    )
    assert build.fill_numbers("* number0 number1", "56.0 9.0") == "* 56 9"


def test_prefix_equations_become_infix_with_their_exact_value(prepare):
    assert prepare.infix("* 56 9") == ("56 * 9", Fraction(504))
    assert prepare.infix("- 10 + 2 3") == ("10 - (2 + 3)", Fraction(5))
    assert prepare.infix("/ + 3.0 5.0 4") == ("(3 + 5) / 4", Fraction(2))
    assert prepare.infix("/ 1 3")[1] == Fraction(1, 3) and prepare.number_text(Fraction(1, 3)) == "0.33"
    with pytest.raises(ValueError, match="not one prefix expression"):
        prepare.infix("+ 1 2 3")


def test_sft_answers_are_the_arithmetic_and_mismatched_rows_are_dropped(prepare):
    good = {"question": "q", "answer": "504", "equation": "* 56 9"}
    assert prepare.sft_response(good) == "56 * 9"
    assert expression_answer([prepare.sft_response(good)], ["504"]) == [1.0]
    assert prepare.sft_response(good, "equation") == "56 * 9 = 504"
    assert numeric_answer([prepare.sft_response(good, "equation")], ["504"]) == [1.0]
    assert prepare.sft_response({**good, "answer": "505"}) is None  # the equation does not give it
    assert prepare.sft_response({**good, "equation": "* 56"}) is None  # malformed


def test_prepare_writes_prompts_with_answers(prepare, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    train = [{"question": "A has 2 and gets 3. How many?", "answer": "5", "equation": "+ 2 3"},
             {"question": "B?", "answer": "7", "equation": "+ 2 3"}]  # fmt: skip
    test = [{"question": "C has 4 and loses 1. How many?", "answer": "3", "equation": "( 4.0 - 1.0 )"}]
    for name, rows in (("train", train), ("test", test)):
        with gzip.open(data / f"{name}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    prepare.main(["--data", str(data), "--out", str(tmp_path / "out")])
    read = lambda name: [json.loads(x) for x in (tmp_path / "out" / name).read_text().splitlines()]  # noqa: E731
    assert read("sft.jsonl") == [{"prompt": prepare.prompt_text(train[0]["question"]), "response": "2 + 3"}]
    assert [r["answer"] for r in read("train_prompts.jsonl")] == ["5", "7"]
    assert read("test_prompts.jsonl") == [
        {"prompt": "\n\nHuman: C has 4 and loses 1. How many?\n\nAssistant:", "answer": "3"}
    ]


@pytest.mark.parametrize("method", ["grpo", "dapo", "ppo_max"])
def test_the_configs_are_valid_and_raise_the_rates_of_the_presets(method):
    preset = load_config(RLConfig, preset=method)
    config = load_config(
        RLConfig, preset=method, overrides=yaml.safe_load((EXAMPLE / f"{method}.yaml").read_text())
    )
    assert config.policy_optim.lr == 1e-5 > preset.policy_optim.lr
    assert config.rollout.temperature == 1.0 and config.rollout.max_new_tokens == 16
    assert (
        config.rollout.batch_size * config.rollout.samples_per_prompt == 64
    )  # the same answers per iteration
    if method == "ppo_max":
        assert config.model.critic_init == "policy" and config.critic.pretrain_iterations == 0


def test_summary_reads_accuracy_paired_difference_and_stage_costs(tmp_path):
    summarize = load("summarize")

    def run(name: str, values: list[float]) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text("seed: 0\n")
        figures = {"mean": sum(values) / len(values), "ci95": [0.1, 0.2] if name == "sft" else [0.3, 0.9],
                   "n": len(values), "correct": int(sum(values))}  # fmt: skip
        samples = [{"policy_function_scores": {VERIFIER: v}} for v in values]
        (tmp_path / name / "eval_test.json").write_text(
            json.dumps({"reward_functions": {VERIFIER: figures}, "samples": samples})
        )

    run("sft", [0.0, 1.0, 0.0, 0.0])
    run("grpo-0", [1.0, 1.0, 1.0, 0.0])
    (tmp_path / "grpo-0" / "metrics.jsonl").write_text(
        '{"reward/raw_mean": 0.25}\n{"reward/raw_mean": 0.75}\n'
    )
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "sft.time").write_text(
        "\tUser time (seconds): 10.5\n\tSystem time (seconds): 0.5\n\tMaximum resident set size (kbytes): 2048\n"
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03\n"
    )
    result = summarize.summarize(tmp_path)
    grpo = result["rl"]["grpo-0"]
    assert result["sft"]["correct"] == 1 and grpo["test"]["correct"] == 3
    assert grpo["difference_to_sft"]["mean"] == 0.5 and grpo["difference_to_sft"]["wins"] == 2
    assert grpo["interval_above_sft"] is True
    assert (
        grpo["training"]["first"]["reward/raw_mean"] == 0.25 and grpo["training"]["reward_last3_mean"] == 0.5
    )
    assert result["stages"]["sft"] == {"wall_s": 3723.0, "cpu_s": 11.0, "peak_rss_mib": 2}
