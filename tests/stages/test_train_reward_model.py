"""Reward-model training on pairs whose chosen response always holds a marker word: the model
learns to rank, the best held-out checkpoint is the one left in the run directory."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.config import RewardConfig, load_config
from rlhf.data.collate import collate_pairs
from rlhf.data.loading import load_examples, split_examples
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm
from rlhf.stages.rm import (
    EncodedPair,
    encode_pairs,
    evaluate_pairs,
    pair_forward,
    plan_batches,
    ranking_loss,
    run_reward_training,
)
from tests.support.train_testing import WORDS, write_jsonl

MARKER = "t"


def marker_pairs(n: int, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    plain = [w for w in WORDS if w != MARKER]

    def words(k: int) -> list[str]:
        return [plain[i] for i in torch.randint(0, len(plain), (k,), generator=generator).tolist()]

    rows = []
    for _ in range(n):
        chosen = words(3)
        chosen[int(torch.randint(0, 3, (1,), generator=generator))] = MARKER
        rows.append(
            {"prompt": " ".join(words(2)), "chosen": " ".join(chosen), "rejected": " ".join(words(3))}
        )
    return rows


def rm_config(tmp_path, **train) -> RewardConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    overrides = {
        "out": str(tmp_path / "rm"),
        "data": {"path": str(write_jsonl(tmp_path / "pairs.jsonl", marker_pairs(48))), "test_fraction": 0.25},
        "train": {
            "max_steps": 30,
            "batch_size": 8,
            "micro_batch_size": 4,
            "eval_every": 2,
            "log_every": 1,
            "lm_coef": 0.0,
            **train,
        },
        "optim": {"lr": 3e-4, "warmup_steps": 0, "schedule": "constant"},
        "sinks": ["jsonl"],
    }
    return load_config(RewardConfig, overrides=overrides)


def reward_model(tok) -> ScalarHeadModel:
    return ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=3, hidden_size=32, num_layers=1, num_heads=2)
    )


def log_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ranking_loss_is_minus_log_sigmoid_of_the_margin():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    expected = sum(math.log1p(math.exp(-(c - r))) for c, r in zip(chosen.tolist(), rejected.tolist()))
    assert float(ranking_loss(chosen, rejected)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_reward_model_learns_the_marker_and_keeps_the_best_checkpoint(tok, tmp_path):
    config = rm_config(tmp_path)
    final = run_reward_training(config, model=reward_model(tok), tokenizer=tok, quiet=True)
    run = tmp_path / "rm"
    rows = log_rows(run)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == list(range(1, 30, 2))
    best = max(evals, key=lambda r: r["eval/accuracy"])  # the first of the best
    assert best["eval/accuracy"] > 0.9
    assert evals[0]["eval/accuracy"] < best["eval/accuracy"]
    assert final["best_step"] == best["step"] and final["best_accuracy"] == best["eval/accuracy"]
    assert best["step"] < evals[-1]["step"]  # later steps tie on accuracy: the first best is kept

    assert not (run / "best").exists() and (run / "config.yaml").is_file()
    loaded = ScalarHeadModel.from_pretrained(run)
    examples = load_examples(config.data.path, kind="preference").examples
    _, test = split_examples(examples, config.data.test_fraction, seed=config.seed)
    result = evaluate_pairs(loaded, encode_pairs(tok, test, config, None), tok.pad_token_id, 4, with_lm=False)
    assert len(best["eval/margins"]) == len(test)  # the held-out margin distribution (PPO paper Fig. 2)
    assert result["accuracy"] == best["eval/accuracy"]
    assert result["margin_mean"] == pytest.approx(
        best["eval/margin_mean"], rel=1e-5
    )  # the best step's weights


@pytest.mark.slow
def test_lm_coef_adds_the_chosen_response_lm_loss(tok, tmp_path):
    runs = {}
    for coef in (0.0, 0.5):
        config = rm_config(tmp_path / str(coef), max_steps=2, lm_coef=coef)
        run_reward_training(config, model=reward_model(tok), tokenizer=tok, quiet=True)
        runs[coef] = log_rows(tmp_path / str(coef) / "rm")[0]
    plain, mixed = runs[0.0], runs[0.5]
    assert "train/lm_ppl" not in plain and plain["train/loss"] == plain["train/rank_loss"]
    assert mixed["train/rank_loss"] == pytest.approx(plain["train/rank_loss"], rel=1e-6)  # same first batch
    assert mixed["train/lm_ppl"] > 1
    assert mixed["train/loss"] == pytest.approx(
        mixed["train/rank_loss"] + 0.5 * math.log(mixed["train/lm_ppl"])
    )


def test_token_batching_packs_pairs_by_length(tok, tmp_path):
    config = rm_config(tmp_path, max_steps=None, batching="tokens", max_tokens=60, min_batch=1)
    rows = [EncodedPair([5] * (1 + i % 4), [6, 7, 3], [8] * (1 + i % 5) + [3]) for i in range(24)]
    plan = plan_batches(rows, config, torch.Generator().manual_seed(0))
    assert sorted(i for batch in plan for i in batch) == list(range(24))  # every pair once
    for batch in plan:
        assert len(batch) * max(rows[i].num_tokens for i in batch) <= 60
    assert len({len(b) for b in plan}) > 1  # a token budget, not a pair count

    final = run_reward_training(
        config, model=reward_model(tok), tokenizer=tok, train_rows=rows, test_rows=rows[:4], quiet=True
    )
    logged = [r["train/pairs"] for r in log_rows(tmp_path / "rm") if "train/pairs" in r]
    assert sum(logged) == 24 and len(logged) == len(plan)
    assert math.isfinite(final["train/loss"])


def test_token_batches_hold_between_min_batch_and_max_batch_pairs(tok, tmp_path):
    # PPO paper §4.2: the batch size follows the token count, between 4 and 128 pairs; here a
    # budget of 40 tokens fits only 2 of the longest pairs (17 tokens), and the minimum of 4 wins
    config = rm_config(tmp_path, max_steps=None, batching="tokens", max_tokens=40, max_batch=6)
    rows = [EncodedPair([5] * (1 + i % 4), [6, 7, 3], [8] * (1 + i % 5) + [3]) for i in range(24)]
    plan = plan_batches(rows, config, torch.Generator().manual_seed(0))
    assert sorted(i for batch in plan for i in batch) == list(range(24))
    assert all(4 <= len(batch) <= 6 for batch in plan)
    assert any(len(batch) * max(rows[i].num_tokens for i in batch) > 40 for batch in plan)
    unbounded = rm_config(tmp_path / "one", max_steps=None, batching="tokens", max_tokens=40, min_batch=1)
    assert min(len(b) for b in plan_batches(rows, unbounded, torch.Generator().manual_seed(0))) < 4


def test_pair_batch_scores_read_the_eos_of_each_row(tok):
    """Chosen and rejected rows of different lengths: each score is the value at that row's EOS."""
    model = reward_model(tok)
    rows = [EncodedPair([5, 6], [7, 3], [8, 9, 10, 3]), EncodedPair([5], [7, 8, 9, 3], [3])]
    batch = collate_pairs(
        [r.prompt_ids for r in rows],
        [r.chosen_ids for r in rows],
        [r.rejected_ids for r in rows],
        tok.pad_token_id,
    )
    with torch.no_grad():
        chosen, rejected, _, _ = pair_forward(model, rows, tok.pad_token_id, with_lm=False)
        alone = [
            model.score(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
            for ids in ([5, 6, 7, 3], [5, 7, 8, 9, 3], [5, 6, 8, 9, 10, 3], [5, 3])
        ]
    torch.testing.assert_close(torch.cat([chosen, rejected]), torch.cat(alone), rtol=0, atol=1e-5)
    assert batch["input_ids"].shape == (4, 6)


def test_reward_training_without_pairs_stops(tok, tmp_path):
    with pytest.raises(ValueError, match="no training preference pairs"):
        run_reward_training(
            rm_config(tmp_path), model=reward_model(tok), tokenizer=tok, train_rows=[], quiet=True
        )
