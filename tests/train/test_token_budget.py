"""Token-budget micro-batches (`train.micro_batch_tokens`, rlhf/train/micro_batches.py `split_rows`): rows
sorted longest first and cut so that rows x longest row fits the budget (a longer row alone); the
step's gradient is the row-count path's token mean, and every logged metric of sft, rm, dpo and
train is unchanged at rel 1e-4."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from rlhf.config import OptimConfig
from rlhf.data.length_grouping import token_budget_groups
from rlhf.parallel.peers import share_of
from rlhf.train.learner import Learner, Training
from rlhf.train.micro_batches import MicroBatching, micro_batches, split_rows
from tests.support.train_testing import metric_rows, rl_config
from tests.train.test_learner_engine import FakePeers, Rows, rows_of

REL = 1e-4


# -- the splitter ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lengths",
    [[5, 1, 4, 2, 3, 7, 6, 0, 0], [9], [0], [3, 3, 3, 3], [20, 1, 1, 1], [], [2, 30, 2, 2, 2]],
)
@pytest.mark.parametrize("budget", [1, 6, 10, 25, 1000])
def test_budget_groups_cover_every_row_once_longest_first_within_the_budget(lengths, budget):
    groups = token_budget_groups(lengths, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(flat, reverse=True)  # longest first
    for g in groups:
        cost = len(g) * max(lengths[i] for i in g)
        assert cost <= budget or len(g) == 1  # a row longer than the budget: alone
    for g, nxt in zip(groups, groups[1:]):  # greedy: the next row would not have fitted
        assert (len(g) + 1) * lengths[g[0]] > budget or nxt == []


def test_no_budget_is_the_row_count_path_and_a_budget_ignores_the_row_count():
    lengths = [5, 1, 4, 2, 3, 7, 6]
    for tokens in (None, 0):
        for by_length in (False, True):
            assert split_rows(lengths, 3, by_length, tokens) == split_rows(lengths, 3, by_length)
    assert (
        split_rows(lengths, 1, False, 14) == split_rows(lengths, 8, True, 14) == [[5, 6], [0, 2], [4, 3, 1]]
    )
    with pytest.raises(ValueError, match="at least 1"):
        token_budget_groups(lengths, -1)


# -- the step's gradient -----------------------------------------------------------------------
def token_rows(rows: int, width: int = 6) -> Rows:
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, width, 3, generator=generator)
    mask = torch.zeros(rows, width)
    for r in range(rows):  # right-padded rows of random lengths
        mask[r, : int(torch.randint(1, width + 1, (1,), generator=generator))] = 1.0
    if rows > 2:
        mask[2] = 0.0  # a fully masked row
    return Rows(x, mask)


def step_gradient(batch: Rows, **learner) -> tuple[list[torch.Tensor], dict, list]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    engine = Learner.build(model, Training(OptimConfig(), 1, MicroBatching(**learner)))
    engine.optimizer_step = lambda: 0.0  # the gradients stay for the test to read
    seen = []

    def loss(micro):
        m = micro.rows.mask
        seen.append((micro.index, int(m.shape[0]) * int(max(micro.rows.lengths()))))
        mean = ((model(micro.rows.x).squeeze(-1) ** 2) * m).sum() / m.sum().clamp(min=1)  # its token mean
        return micro.weight * mean, {"tokens": m.sum(), "rows": float(m.shape[0])}

    total = float(batch.mask.sum())
    sums, _ = engine.step(batch, loss, lambda r: float(r.mask.sum()), total, sums=("tokens", "rows"))
    return [p.grad.clone() for p in model.parameters()], sums, seen


@pytest.mark.parametrize("rows", [1, 2, 7])
@pytest.mark.parametrize("budget", [1, 5, 12, 1000])
def test_a_budgeted_step_has_the_row_count_paths_gradient(rows, budget):
    batch = token_rows(rows)
    expected, expected_sums, _ = step_gradient(batch, micro_batch_size=2)
    got, sums, seen = step_gradient(batch, micro_batch_size=2, micro_batch_tokens=budget)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-5)
    assert sums["tokens"] == expected_sums["tokens"]
    assert all(cost <= budget or len(index) == 1 for index, cost in seen)


# -- data-parallel ranks: different counts of passes, evened ------------------------------------
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("budget", [4, 9, 100])
def test_ranks_with_different_counts_under_a_budget_all_run_the_largest(world_size, budget):
    lengths = [9, 8, 7, 6, 1, 1, 1, 1, 1]  # shares of very different padded costs
    batch = rows_of(lengths)
    split = lambda ls: split_rows(ls, 1, False, budget)  # noqa: E731
    counts = [len(split(lengths[share_of(9, r, world_size)])) for r in range(world_size)]
    seen = []
    for rank in range(world_size):
        micros = micro_batches(batch, split, peers=FakePeers(rank, world_size, counts), lockstep=True)
        assert len(micros) == max(counts)
        seen += [row["id"] for m in micros if not m.filler for row in m.rows]
        assert all(m.weight == 0.0 for m in micros if m.filler)
    assert sorted(seen) == list(range(9))
    if budget == 9:
        assert len(set(counts)) > 1  # the case this test is about


# -- every logged metric of the stages ---------------------------------------------------------
def assert_same_metrics(base: list[dict], other: list[dict]) -> None:
    assert len(base) == len(other) and base
    for a, b in zip(base, other):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if isinstance(value, float) and not key.startswith(("time/", "throughput/", "perf/")):
                assert b[key] == pytest.approx(value, rel=REL, abs=1e-6), key


@pytest.fixture()
def cuts(monkeypatch) -> list[list[int]]:
    """The sizes of the micro-batches every budgeted split cut (a run that never used its budget
    would compare the row-count path with itself)."""
    import rlhf.train.micro_batches as engine

    seen: list[list[int]] = []
    real = engine.token_budget_groups

    def spy(lengths, budget):
        groups = real(lengths, budget)
        seen.append([len(g) for g in groups])
        return groups

    monkeypatch.setattr(engine, "token_budget_groups", spy)
    return seen


def records(path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "event" not in record:
            out.append({k: v for k, v in record.items() if not k.startswith(("time/", "throughput/"))})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("budget", [12, 40])
def test_sft_metrics_are_unchanged_by_a_budget(budget, cuts, tok, tmp_path):
    from rlhf.models.tiny import tiny_causal_lm
    from rlhf.stages.sft import run_sft
    from tests.stages.test_train_sft import sft_config

    logs = []
    for name, tokens in (("rows", None), ("tokens", budget)):
        (tmp_path / name).mkdir()
        c = sft_config(tmp_path / name, train={"max_steps": 4, "eval_every": 2, "micro_batch_tokens": tokens})
        model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
        run_sft(c, model=model, tokenizer=tok, quiet=True)
        logs.append(records(tmp_path / name / "sft" / "metrics.jsonl"))
    assert cuts and any(len(sizes) > 1 for sizes in cuts)
    assert_same_metrics(*logs)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [20, 60])
def test_rm_metrics_are_unchanged_by_a_budget(budget, cuts, tok, tmp_path):
    from rlhf.stages.rm import run_reward_training
    from tests.stages.test_train_reward_model import reward_model, rm_config

    logs = []
    for name, tokens in (("rows", None), ("tokens", budget)):
        c = rm_config(tmp_path / name, max_steps=4, lm_coef=0.5, micro_batch_tokens=tokens)
        run_reward_training(c, model=reward_model(tok), tokenizer=tok, quiet=True)
        logs.append(records(tmp_path / name / "rm" / "metrics.jsonl"))
    assert cuts and any(len(sizes) > 1 for sizes in cuts)
    assert_same_metrics(*logs)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [20, 60])
def test_dpo_metrics_are_unchanged_by_a_budget(budget, cuts, tok, tmp_path):
    from rlhf.stages.dpo import run_dpo
    from tests.stages.test_train_dpo import config, model

    tokenizer = tok
    logs = []
    for name, tokens in (("rows", None), ("tokens", budget)):
        c = config(tmp_path / name)
        c.train.max_steps, c.train.micro_batch_tokens = 4, tokens
        run_dpo(c, model=model(tokenizer), tokenizer=tokenizer, quiet=True)
        logs.append(records(tmp_path / name / "dpo" / "metrics.jsonl"))
    assert cuts and any(len(sizes) > 1 for sizes in cuts)
    assert_same_metrics(*logs)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [9, 30])
def test_train_metrics_are_unchanged_by_a_budget(budget, cuts, make_trainer, tmp_path):
    logs = []
    for name, tokens in (("rows", None), ("tokens", budget)):
        config = rl_config("ppo_max", train={"micro_batch_tokens": tokens})
        trainer = make_trainer(config, run_dir=tmp_path / name)
        if tokens:
            assert all(
                role.learner.batching.micro_batch_tokens == tokens
                for role in trainer.runtime.roles.learners()
            )
        trainer.train()
        logs.append(metric_rows(tmp_path / name))
    assert cuts and any(len(sizes) > 1 for sizes in cuts)
    assert_same_metrics(*logs)


def test_a_negative_budget_is_refused_naming_the_key():
    from rlhf.config import ConfigError, SFTConfig, load_config

    with pytest.raises(ConfigError, match="train.micro_batch_tokens"):
        load_config(SFTConfig, overrides={"train": {"micro_batch_tokens": -1}})
    with pytest.raises(ConfigError, match="train.micro_batch_tokens"):
        rl_config("ppo_max", train={"micro_batch_tokens": -5})


def test_the_scoring_forwards_are_cut_by_the_budget_and_give_the_row_path_numbers(
    make_trainer, tmp_path, monkeypatch
):
    """With `train.micro_batch_tokens` the rollout's no-grad forwards (old and reference log-probs,
    values, reward scores) are cut by the budget too, as the update's passes are: memory bounded by
    one setting everywhere, and the same numbers as the row-count path (float32, atol 1e-5)."""
    from rlhf.rl import experience as experience_module

    budget = 30
    cuts: list[tuple[list[int], list[list[int]]]] = []
    original = experience_module.split_rows

    def spy(lengths, size, by_length, tokens=None, packing=False):
        groups = original(lengths, size, by_length, tokens, packing)
        if tokens:
            cuts.append((list(lengths), groups))
        return groups

    monkeypatch.setattr(experience_module, "split_rows", spy)
    made = []
    for name, tokens in (("rows", None), ("tokens", budget)):
        config = rl_config(
            "ppo_max", train={"micro_batch_tokens": tokens}, rollout={"logprobs_from_sampler": False}
        )
        trainer = make_trainer(config, run_dir=tmp_path / name)
        experience, _ = trainer.make_experience()
        made.append(experience)
        trainer.logger.close()
    assert len(cuts) >= 4  # old log-probs, reference log-probs, values, scores
    assert any(len(groups) > 1 for _, groups in cuts)
    for lengths, groups in cuts:
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert len(g) * max(lengths[i] for i in g) <= budget or len(g) == 1
    rows, tokens = made
    for field in ("old_logp", "ref_logp", "old_values", "advantages", "returns"):
        torch.testing.assert_close(getattr(tokens, field), getattr(rows, field), rtol=0, atol=1e-5)


def test_a_shared_critic_scores_by_the_budget_through_the_policy_module(make_trainer, tmp_path):
    config = rl_config("ppo_max", train={"micro_batch_tokens": 30}, model={"critic_mode": "shared"})
    trainer = make_trainer(config, run_dir=tmp_path / "shared")
    critic = trainer.runtime.roles.critic
    assert critic.runs_through is trainer.runtime.roles.policy.learner.module
    experience, _ = trainer.make_experience()
    assert torch.isfinite(experience.old_values).all()
    trainer.logger.close()
