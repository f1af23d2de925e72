"""Resume: a run interrupted after a checkpoint and resumed writes the same metrics as one that
never stopped (docs/internals.md#conventions: same seed, CPU). Every piece of trainer state is exercised: optimizer and
cosine schedule, adaptive KL, running reward moments, the experience buffer, the prompt stream,
sampling / shuffling / ptx generators, critic pre-training and the collapse detector."""

from __future__ import annotations

import pytest

from rlhf.config import ConfigError
from rlhf.stages.prompt_files import ptx_sampler
from tests.support.train_testing import WORDS, metric_rows, rl_config, write_jsonl

ITERATIONS = 4


def resumable_config(out):
    return rl_config(
        "ppo_max",
        out=out,
        train={"iterations": ITERATIONS, "buffer_size": 2},
        checkpoint={"every": 2, "keep": 1},
        kl={"adaptive": True, "horizon": 20, "target": 1.0},
        critic={"pretrain_iterations": 2},
        policy_optim={"schedule": "cosine", "warmup_steps": 2},
        policy={"ptx_coef": 0.5},
    )


class Interrupted(Exception):
    pass


def interrupt_at(trainer, iteration: int) -> None:
    """Make `trainer.train()` die when it starts iteration `iteration` (like a killed process)."""
    original = trainer.step

    def step():
        if trainer.iteration == iteration:
            raise Interrupted
        return original()

    trainer.step = step


@pytest.fixture()
def ptx_file(tmp_path):
    rows = [
        {"prompt": " ".join(WORDS[i : i + 2]), "response": " ".join(WORDS[i + 2 : i + 5])} for i in range(6)
    ]
    return str(write_jsonl(tmp_path / "ptx.jsonl", rows))


def test_interrupted_run_resumes_to_identical_metrics(make_trainer, tok, ptx_file, tmp_path):
    def ptx():
        return ptx_sampler(tok, ptx_file, batch_size=2, max_prompt_tokens=8)

    whole, split = tmp_path / "whole", tmp_path / "split"
    make_trainer(resumable_config(whole), run_dir=whole, ptx=ptx()).train()

    first = make_trainer(resumable_config(split), run_dir=split, ptx=ptx())
    interrupt_at(first, 3)  # dies after logging iteration 2, whose checkpoint never got written
    with pytest.raises(Interrupted):
        first.train()
    assert [r["iteration"] for r in metric_rows(split, kinds=("iteration",))] == [0, 1, 2]
    assert [p.name for p in (split / "checkpoints").iterdir()] == ["iter_000002"]

    make_trainer(resumable_config(split), run_dir=split, ptx=ptx(), resume=True).train()
    expected, got = metric_rows(whole), metric_rows(split)
    assert [r.get("iteration", r.get("pretrain")) for r in got] == [0, 1, 0, 1, 2, 3]
    assert len(got) == len(expected)
    for want, have in zip(expected, got):
        assert have == want
    betas = [r["kl/beta"] for r in expected if "iteration" in r]
    assert len(set(betas)) == ITERATIONS  # the adaptive controller moved every iteration
    assert all("ptx/loss" in r for r in expected if "iteration" in r)


def test_resume_without_a_checkpoint_names_the_directory(make_trainer, tmp_path):
    config = resumable_config(tmp_path / "empty")
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        make_trainer(config, run_dir=tmp_path / "empty", resume=True)


def test_fresh_run_into_a_used_directory_stops_with_the_fix(make_trainer, tmp_path):
    run = tmp_path / "used"
    make_trainer(rl_config("vanilla_ppo", train={"iterations": 1}), run_dir=run).train()
    before = (run / "metrics.jsonl").read_text()
    config_before = (run / "config.yaml").read_text()
    with pytest.raises(
        ConfigError, match=f"{run} already has metrics.jsonl: use --resume {run} or another --out"
    ):
        make_trainer(rl_config("ppo_max", train={"iterations": 1}), run_dir=run)
    assert (run / "metrics.jsonl").read_text() == before  # nothing of the earlier run is lost
    assert (run / "config.yaml").read_text() == config_before


def test_extending_a_pretraining_only_run_keeps_its_records(make_trainer, tmp_path):
    run = tmp_path / "run"
    config = rl_config(
        "ppo_max", train={"iterations": 0}, critic={"pretrain_iterations": 2, "pretrain_patience": 5}
    )
    make_trainer(config, run_dir=run).train()
    assert [r["pretrain"] for r in metric_rows(run)] == [0, 1]
    extended = rl_config(
        "ppo_max", train={"iterations": 1}, critic={"pretrain_iterations": 2, "pretrain_patience": 5}
    )
    make_trainer(extended, run_dir=run, resume=True).train()
    assert [r.get("pretrain", r.get("iteration")) for r in metric_rows(run)] == [0, 1, 0]
