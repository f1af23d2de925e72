"""`train.compile` in every stage (rlhf/models/compiled.py): the trained models' forwards with
gradients on run compiled, and every logged metric of sft, rm, dpo and train (ppo_max, policy and
critic) is unchanged at rel 1e-4 (as tests/train/test_packing.py checks for packing). The aot_eager
backend compiles the graphs (dynamo and AOTAutograd, the same capture inductor compiles) with
torch's own kernels, in seconds; tests/models/test_models_compiled.py runs inductor itself."""

from __future__ import annotations

import pytest
import torch

from rlhf.models.compiled import is_compiled_for_training
from rlhf.models.tiny import tiny_causal_lm
from tests.support.train_testing import metric_rows, rl_config
from tests.train.test_packing import pair_data, rewrite, sft_data
from tests.train.test_token_budget import assert_same_metrics, records

BACKEND = "aot_eager"


@pytest.fixture()
def compiled_calls(monkeypatch) -> list[str]:
    """The architecture of every compiled training forward (a run that never compiled would compare
    the eager path with itself)."""
    import rlhf.models.backbone as backbone

    torch._dynamo.reset()  # the recompile limit counts this worker's earlier compiles
    seen: list[str] = []
    real = backbone._compiled

    def spy(backend):
        run = real(backend)

        def counted(decoder, kwargs):
            seen.append(type(decoder).__name__)
            return run(decoder, kwargs)

        return counted

    monkeypatch.setattr(backbone, "_compiled", spy)
    yield seen
    torch._dynamo.reset()


@pytest.mark.slow
def test_sft_metrics_are_unchanged_by_compiling(compiled_calls, tok, tmp_path):
    from rlhf.stages.sft import run_sft
    from tests.stages.test_train_sft import sft_config

    logs = []
    for name, compile in (("eager", False), ("compiled", True)):
        (tmp_path / name).mkdir()
        backend = {"compile_backend": BACKEND} if compile else {}  # the backend applies to a compiled run
        train = {"max_steps": 4, "eval_every": 2, "compile": compile, **backend}
        c = sft_config(tmp_path / name, train=train)
        rewrite(tmp_path / name / "sft.jsonl", sft_data())
        model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
        run_sft(c, model=model, tokenizer=tok, quiet=True)
        assert is_compiled_for_training(model) == compile
        logs.append(records(tmp_path / name / "sft" / "metrics.jsonl"))
    assert compiled_calls
    assert_same_metrics(*logs)


def pair_stage_records(stage: str, run_dir, tok, compile: bool) -> list[dict]:
    """4 steps of the reward model ("rm") or DPO ("dpo") on pairs of very different lengths: the
    records of its metrics.jsonl."""
    if stage == "rm":
        from rlhf.stages.rm import run_reward_training as run
        from tests.stages.test_train_reward_model import reward_model as model
        from tests.stages.test_train_reward_model import rm_config

        c, rows = rm_config(run_dir, max_steps=4, lm_coef=0.5), pair_data()
    else:
        from rlhf.stages.dpo import run_dpo as run
        from tests.stages.test_train_dpo import config, model

        c, rows = config(run_dir), pair_data(40)
        c.train.max_steps = 4
    c.train.compile, c.train.compile_backend = compile, BACKEND
    rewrite(run_dir / "pairs.jsonl", rows)
    run(c, model=model(tok), tokenizer=tok, quiet=True)
    return records(run_dir / stage / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["rm", "dpo"])
def test_rm_and_dpo_metrics_are_unchanged_by_compiling(stage, compiled_calls, tok, tmp_path):
    logs = [
        pair_stage_records(stage, tmp_path / name, tok, compile)
        for name, compile in (("eager", False), ("compiled", True))
    ]
    assert compiled_calls
    assert_same_metrics(*logs)


@pytest.mark.slow
def test_train_metrics_are_unchanged_by_compiling(compiled_calls, make_trainer, tmp_path):
    logs = []
    for name, compile in (("eager", False), ("compiled", True)):
        train = {"compile": compile, **({"compile_backend": BACKEND} if compile else {})}
        config = rl_config("ppo_max", train=train, rollout={"max_new_tokens": 16})
        trainer = make_trainer(config, run_dir=tmp_path / name)
        roles = trainer.runtime.roles
        assert all(is_compiled_for_training(role.model) == compile for role in roles.learners())
        trainer.train()
        logs.append(metric_rows(tmp_path / name))
    # the policy's and the critic's update forwards compiled (the sampler and scoring stayed eager)
    assert len(compiled_calls) >= 2 * config.train.iterations
    assert_same_metrics(*logs)
