"""`rlhf train` and `rlhf eval` with `--reward-fn` (docs/algorithms.md §31), in-process: a GRPO
run whose only reward is a Python function reading the prompt file's fields, its failure as one
message and exit code 2, and an evaluation judged by a function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.cli import main
from tests.cli.test_cli import files, write_jsonl  # noqa: F401 (the module's fixture of tiny files)

TINY_GRPO = [
    "--preset", "grpo", "--train.iterations", "1", "--rollout.batch_size", "3",
    "--rollout.samples_per_prompt", "2", "--rollout.max_new_tokens", "4", "--train.micro_batch_size", "6",
    "--policy_optim.lr", "0.001", "--log.sinks", "jsonl",
]  # fmt: skip


@pytest.fixture(scope="module")
def sft(files):  # noqa: F811
    out = Path(files["root"]) / "fn_sft"
    assert main(["sft", "--model", files["base"], "--data", files["sft"], "--out", str(out),
                 "--train.max_steps", "1", "--train.batch_size", "4", "--data.test_fraction", "0.25",
                 "--sinks", "jsonl"]) == 0  # fmt: skip
    return str(out)


@pytest.fixture(scope="module")
def bonus_prompts(files):  # noqa: F811
    rows = [json.loads(line) for line in Path(files["prompts"]).read_text().splitlines()]
    return write_jsonl(
        Path(files["root"]) / "bonus.jsonl", [{**r, "bonus": 10 + i} for i, r in enumerate(rows)]
    )


def test_train_against_a_reward_function_alone(sft, bonus_prompts, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--policy", sft, "--prompts", bonus_prompts, "--out", str(out)]
    assert main([*args, "--reward-fn", "tests.support.reward_fns_testing:bonus", *TINY_GRPO]) == 0
    (record,) = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"iteration"' in line
    ]
    scores = record["reward/raw_scores"]
    assert len(scores) == 6 and all(s >= 10 for s in scores)
    assert scores[0::2] == scores[1::2]  # both responses to a prompt read its line's bonus
    assert record["reward/part/tests.support.reward_fns_testing:bonus"] == pytest.approx(sum(scores) / 6)
    assert "tests.support.reward_fns_testing:bonus" in (out / "config.yaml").read_text()
    assert not (out / "critic").exists()


def test_a_failing_reward_function_exits_2_naming_it_and_the_row(sft, files, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    args = ["train", "--policy", sft, "--prompts", files["prompts"], "--out", str(out)]
    assert main([*args, "--reward-fn", "tests.support.reward_fns_testing:nan_at_row_two", *TINY_GRPO]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "rlhf train: reward function tests.support.reward_fns_testing:nan_at_row_two returned nan for row 2"
    )
    assert "Traceback" not in err


def test_train_needs_a_reward_model_or_a_function(sft, files, tmp_path, capsys):  # noqa: F811
    args = ["train", "--policy", sft, "--prompts", files["prompts"], "--out", str(tmp_path / "x"), *TINY_GRPO]
    assert main(args) == 2
    assert (
        "missing --reward-model (or --reward-url, --judge-url, --reward-fn, --env or --agent)"
        in capsys.readouterr().err
    )


def test_eval_judged_by_a_reward_function(sft, files, tmp_path):  # noqa: F811
    out = tmp_path / "eval.json"
    args = ["eval", "--policy", sft, "--baseline", sft, "--prompts", files["test"], "--n", "4",
            "--max-new-tokens", "4", "--out", str(out), "--reward-fn", "tests.support.reward_fns_testing:constant"]  # fmt: skip
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["judge"] == "tests.support.reward_fns_testing:constant"
    assert result["policy"]["mean"] == pytest.approx(0.25) and result["baseline"]["mean"] == pytest.approx(
        0.25
    )


def test_eval_without_a_judge_or_a_function_exits_2(sft, files, capsys):  # noqa: F811
    assert main(["eval", "--policy", sft, "--baseline", sft, "--prompts", files["test"]]) == 2
    assert "--judge is missing (and no --judge-url or --reward-fn is given)" in capsys.readouterr().err
