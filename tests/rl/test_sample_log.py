"""`rlhf train` writes the sample responses of each logged iteration to samples.jsonl, and
`rlhf report` shows them: checked against the world's gold reward, the metrics and the prompts file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlhf.cli import main
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm
from rlhf.worlds import WorldConfig, build_world, load_world
from tests.support.report_html import ReportPage

pytestmark = pytest.mark.slow  # every test here takes over 2 s (`make test-fast` leaves them out)

torch.set_num_threads(1)

BATCH = 4


@pytest.fixture(scope="module")
def world_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("samples")
    small = dict(sft_train_examples=8, sft_test_examples=4, pairs_train=8, pairs_test=4)
    world = build_world(WorldConfig(seed=0, **small))
    world.write(root / "world")
    for name, seed in (("policy", 0), ("rm", 1)):
        model = tiny_causal_lm(world.tokenizer, seed=seed, hidden_size=16, num_layers=1, num_heads=2)
        if name == "rm":
            model = ScalarHeadModel.from_causal_lm(model, head_init_std=0.5)
        model.save_pretrained(root / name)
        world.tokenizer.save_pretrained(root / name)
    return {"root": root, "world": root / "world", "policy": root / "policy", "rm": root / "rm"}


def train(files, out: Path, *extra: str) -> None:
    assert main([
        "train", "--preset", "ppo_max", "--policy", str(files["policy"]), "--reward-model", str(files["rm"]),
        "--prompts", str(files["world"] / "prompts_train.jsonl"), "--out", str(out),
        "--train.iterations", "2", "--rollout.batch_size", str(BATCH), "--rollout.max_new_tokens", "6",
        "--train.micro_batch_size", str(BATCH), "--critic.pretrain_iterations", "0",
        "--log.sinks", "jsonl", *extra,
    ]) == 0  # fmt: skip


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_logged_iteration_writes_its_samples_with_score_and_gold(world_files, tmp_path):
    run = tmp_path / "run"
    train(world_files, run, "--log.samples_to_log", str(BATCH))
    rows = read_jsonl(run / "samples.jsonl")
    assert [r["iteration"] for r in rows] == [0] * BATCH + [1] * BATCH
    assert all(set(r) == {"iteration", "prompt", "response", "score", "ended_with_eos", "gold"} for r in rows)
    prompts = {json.loads(line)["prompt"] for line in (world_files["world"] / "prompts_train.jsonl").open()}
    assert all(r["prompt"] in prompts for r in rows)  # decoded back to the file's text
    world = load_world(world_files["world"])
    gold = world.gold_rewards([r["prompt"] for r in rows], [r["response"] for r in rows],
                              [r["ended_with_eos"] for r in rows])  # fmt: skip
    assert [r["gold"] for r in rows] == pytest.approx(gold.tolist(), abs=1e-4)
    metrics = {
        r["iteration"]: r for r in read_jsonl(run / "metrics.jsonl") if "iteration" in r and "event" not in r
    }
    for iteration in (0, 1):  # every row kept: their mean is the iteration's raw reward
        scores = [r["score"] for r in rows if r["iteration"] == iteration]
        assert sum(scores) / BATCH == pytest.approx(metrics[iteration]["reward/raw_mean"], abs=1e-3)

    assert main(["report", str(run)]) == 0
    page = ReportPage.of(run / "report.html")
    assert page.h3["Samples"] == ["iteration 0", "iteration 1"]
    sample_tables = page.tables["Samples"]
    assert [row[2] for row in sample_tables[1][1:]] == [r["response"] for r in rows[BATCH:]]


def test_samples_to_log_limits_the_rows_and_zero_writes_none(world_files, tmp_path):
    train(world_files, tmp_path / "two", "--log.samples_to_log", "2")
    assert [r["iteration"] for r in read_jsonl(tmp_path / "two" / "samples.jsonl")] == [0, 0, 1, 1]
    train(world_files, tmp_path / "none", "--log.samples_to_log", "0")
    assert not (tmp_path / "none" / "samples.jsonl").exists()


def test_a_resumed_run_keeps_one_set_of_samples_per_iteration(world_files, tmp_path):
    run = tmp_path / "run"
    train(world_files, run, "--log.samples_to_log", "2", "--checkpoint.every", "1")
    assert main(["train", "--resume", str(run), "--train.iterations", "3"]) == 0
    assert [r["iteration"] for r in read_jsonl(run / "samples.jsonl")] == [0, 0, 1, 1, 2, 2]


def test_prompts_outside_a_world_have_no_gold(world_files, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text((world_files["world"] / "prompts_train.jsonl").read_text())
    run = tmp_path / "run"
    assert main([
        "train", "--preset", "ppo_max", "--policy", str(world_files["policy"]),
        "--reward-model", str(world_files["rm"]), "--prompts", str(prompts), "--out", str(run),
        "--train.iterations", "1", "--rollout.batch_size", "2", "--rollout.max_new_tokens", "3", "--train.minibatches", "1",
        "--critic.pretrain_iterations", "0", "--log.sinks", "jsonl",
    ]) == 0  # fmt: skip
    rows = read_jsonl(run / "samples.jsonl")
    assert len(rows) == 2 and all("gold" not in r for r in rows)
