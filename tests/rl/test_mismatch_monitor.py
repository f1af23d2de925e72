"""The sampler/trainer log-prob gap as a monitor (log.mismatch, rlhf/rl/mismatch.py): about 0 when the
sampler and the trainer are the same float32 model, the closed form when the sampler's log-probs are
shifted by a known amount, one warning with its code past the threshold, the extra forward under
rollout.logprobs_from_sampler, and its figure in report.html."""

from __future__ import annotations

import json
import math

import pytest

from rlhf.monitor.run_report import write_run_report
from rlhf.rl.mismatch import CODE
from tests.support.train_testing import metric_rows, rl_config

KEYS = ("mismatch/kl", "mismatch/max_ratio", "mismatch/mean_abs_diff")


def shift_sampler_logprobs(trainer, delta: float) -> list[bool]:
    """Add `delta` to every valid sampled token's log-prob the sampler returns; the sampler's
    `return_logprobs` arguments are recorded."""
    asked: list[bool] = []
    generate = trainer.runtime.generate

    def shifted(prompts, return_logprobs):
        asked.append(return_logprobs)
        rollout = generate(prompts, return_logprobs)
        if rollout.logprobs is not None:
            rollout.logprobs = (rollout.logprobs + delta) * rollout.response_mask
        return rollout

    trainer.runtime.generate = shifted
    return asked


def test_the_same_float32_model_gives_about_zero(make_trainer, tmp_path):
    trainer = make_trainer(rl_config("vanilla_ppo", dtype="float32"), run_dir=tmp_path / "run")
    trainer.train()
    rows = metric_rows(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:
        assert 0 <= row["mismatch/kl"] < 1e-10
        assert 1 <= row["mismatch/max_ratio"] < 1 + 1e-5
        assert row["mismatch/mean_abs_diff"] < 1e-6
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not [e for e in events if e.get("code") == CODE]


@pytest.mark.parametrize("delta", [0.02, -0.1])
def test_a_shifted_sampler_gives_the_closed_form(make_trainer, tmp_path, delta):
    trainer = make_trainer(
        rl_config("vanilla_ppo", dtype="float32", log={"mismatch": {"kl_threshold": None}})
    )
    asked = shift_sampler_logprobs(trainer, delta)
    _, metrics = trainer.make_experience()
    assert asked == [True]  # the sampler keeps its log-probs for the monitor (they come free)
    # the trainer's own log-probs (the old ones it trains with) differ from the sampler's by -delta
    assert metrics["mismatch/kl"] == pytest.approx(math.exp(-delta) - 1 + delta, rel=1e-3)
    assert metrics["mismatch/max_ratio"] == pytest.approx(math.exp(abs(delta)), rel=1e-4)
    assert metrics["mismatch/mean_abs_diff"] == pytest.approx(abs(delta), rel=1e-3)


@pytest.mark.slow  # the report's figures: ~3 s
def test_past_the_threshold_one_warning_with_its_code(make_trainer, tmp_path):
    config = rl_config("vanilla_ppo", log={"mismatch": {"kl_threshold": 1e-4}})
    trainer = make_trainer(config, run_dir=tmp_path / "run")
    shift_sampler_logprobs(trainer, 0.05)  # kl exp(-0.05) - 1 + 0.05 = 0.00123 each iteration: warned once
    trainer.train()
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    warnings = [e for e in events if e.get("code") == CODE]
    assert len(warnings) == 1 and warnings[0]["iteration"] == 0
    assert "log.mismatch.kl_threshold" in warnings[0]["message"] and "0.00123" in warnings[0]["message"]
    html = write_run_report(tmp_path / "run").read_text()
    assert "Sampler vs trainer" in html and "mismatch/kl" in html


def test_off_the_sampler_is_not_asked(make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", log={"mismatch": {"every": 0}}))
    asked = shift_sampler_logprobs(trainer, 0.05)
    _, metrics = trainer.make_experience()
    assert asked == [False] and not any(k in metrics for k in KEYS)


def test_logprobs_from_sampler_measures_with_an_extra_forward_only_when_asked(make_trainer):
    plain = make_trainer(rl_config("vanilla_ppo", rollout={"logprobs_from_sampler": True}))
    _, metrics = plain.make_experience()
    assert not any(k in metrics for k in KEYS)  # no policy forward, so nothing to compare with
    asked = rl_config("vanilla_ppo", rollout={"logprobs_from_sampler": True},
                      log={"mismatch": {"extra_forward_every": 1, "kl_threshold": None}})  # fmt: skip
    trainer = make_trainer(asked)
    shift_sampler_logprobs(trainer, 0.02)
    experience, metrics = trainer.make_experience()
    assert metrics["mismatch/mean_abs_diff"] == pytest.approx(0.02, rel=1e-3)
    # the old log-probs trained with stay the sampler's (shifted), as rollout.logprobs_from_sampler says
    assert metrics["policy_ppl"] == pytest.approx(
        math.exp(-float((experience.old_logp * experience.response_mask).sum() / experience.num_tokens)),
        rel=1e-4,
    )
