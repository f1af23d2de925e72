"""`rlhf sft`, `rlhf rm` and `rlhf train` with and without length grouping, as a user runs them:
the default grouping (rows of similar length share a micro-batch inside each step) logs the same
losses as no grouping, up to float rounding; `across_steps` draws another order but trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlhf.cli import main
from tests.support.cli_data import save_tiny_base, write_jsonl

torch.set_num_threads(1)

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()


def varied(i: int, n: int) -> str:
    """`n` words starting at word i: rows of 1 to 7 words, so micro-batches pad."""
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))


def step_rows(run: Path) -> list[dict]:
    """The metric records, without times and the events."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "t_"))}
        for r in rows
        if "event" not in r
    ]


def assert_same_metrics(a: list[dict], b: list[dict], rel: float) -> None:
    assert len(a) == len(b) and len(a) > 1
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], float):
                assert y[key] == pytest.approx(x[key], rel=rel, abs=1e-5), key
            elif isinstance(x[key], list):
                assert y[key] == pytest.approx(x[key], rel=rel, abs=2e-4), key
            else:
                assert y[key] == x[key], key


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("grouping")
    save_tiny_base(root / "base", WORDS)
    sft = [{"prompt": varied(i, 1 + i % 4), "response": varied(i + 3, 1 + (i * 5) % 7)} for i in range(24)]
    pairs = [
        {
            "prompt": varied(i, 1 + i % 5),
            "chosen": "t " + varied(i + 2, 1 + i % 4),
            "rejected": varied(i + 7, 1 + i % 6),
        }
        for i in range(24)
    ]
    return {
        "root": str(root),
        "base": str(root / "base"),
        "sft": write_jsonl(root / "sft.jsonl", sft),
        "pairs": write_jsonl(root / "pairs.jsonl", pairs),
        "prompts": write_jsonl(root / "prompts.jsonl", [{"prompt": r["prompt"]} for r in pairs[:12]]),
    }


STEPS = ["--train.max_steps", "4", "--train.batch_size", "8", "--train.micro_batch_size", "3",
         "--train.eval_every", "2", "--train.log_every", "1", "--data.test_fraction", "0.25",
         "--optim.lr", "0.01", "--optim.warmup_steps", "0", "--sinks", "jsonl"]  # fmt: skip


@pytest.mark.parametrize("stage", ["sft", "rm"])
@pytest.mark.slow
def test_grouping_within_steps_logs_the_losses_of_no_grouping(stage, files, tmp_path):
    data = files["sft" if stage == "sft" else "pairs"]
    runs = {}
    for grouping in ("none", "within_step", "across_steps"):
        runs[grouping] = tmp_path / grouping
        args = [stage, "--model", files["base"], "--data", data, "--out", str(runs[grouping]), *STEPS]
        assert main([*args, "--train.group_by_length", grouping]) == 0
    assert_same_metrics(step_rows(runs["none"]), step_rows(runs["within_step"]), rel=1e-4)
    off, across = step_rows(runs["none"]), step_rows(runs["across_steps"])
    key = "train/loss"
    assert [r.get(key) for r in off] != [r.get(key) for r in across]  # other rows in each step


def test_unknown_grouping_exits_2_naming_the_key(files, tmp_path, capsys):
    args = ["sft", "--model", files["base"], "--data", files["sft"], "--out", str(tmp_path / "x")]
    assert main([*args, "--train.group_by_length", "sorted"]) == 2
    err = capsys.readouterr().err
    assert "train.group_by_length" in err and "within_step" in err and "Traceback" not in err


@pytest.mark.slow
def test_ppo_with_sorted_micro_batches_logs_the_metrics_of_unsorted_ones(files, tmp_path):
    out = Path(files["root"]) / "runs"
    assert (
        main(["sft", "--model", files["base"], "--data", files["sft"], "--out", str(out / "sft"), *STEPS])
        == 0
    )
    assert (
        main(["rm", "--model", str(out / "sft"), "--data", files["pairs"], "--out", str(out / "rm"), *STEPS])
        == 0
    )
    runs = {}
    for value in ("false", "true"):
        runs[value] = tmp_path / value
        assert main([
            "train", "--preset", "ppo_max", "--policy", str(out / "sft"), "--reward-model", str(out / "rm"),
            "--prompts", files["prompts"], "--out", str(runs[value]), "--train.iterations", "2",
            "--rollout.batch_size", "8", "--rollout.max_new_tokens", "5", "--train.micro_batch_size", "3",
            "--train.minibatches", "2", "--critic.pretrain_iterations", "1", "--policy_optim.lr", "0.001",
            "--log.sinks", "jsonl", "--runtime.sort_by_length", value,
        ]) == 0  # fmt: skip
    assert_same_metrics(step_rows(runs["false"]), step_rows(runs["true"]), rel=1e-4)
