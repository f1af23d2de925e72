"""Sequence packing in the micro-batch engine (`train.packing`, rlhf/train/micro_batches.py `split_rows`,
rlhf/data/length_grouping.py `packed_groups`): rows cut by packed tokens under the budget, the step's
gradient equal to the padded path's, and every logged metric of sft, rm, dpo and train (ppo_max)
unchanged at rel 1e-4 (as tests/train/test_token_budget.py checks for the token budget)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlhf.config import ConfigError, OptimConfig, SFTConfig, load_config
from rlhf.data.length_grouping import packed_groups
from rlhf.models.packing import enable_packing, first_fit
from rlhf.models.tiny import tiny_causal_lm
from rlhf.train.learner import Learner, Training
from rlhf.train.lm_loss import model_token_nll
from rlhf.train.micro_batches import MicroBatching, RowList, split_rows
from rlhf.train.supervised.model_call import ModelCall, call_model
from tests.support.train_testing import WORDS, metric_rows, rl_config
from tests.train.test_token_budget import assert_same_metrics, records


# -- the splitter ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lengths", [[5, 1, 4, 2, 3, 7, 6, 0, 0], [9], [0], [3, 3, 3, 3], [20, 1, 1, 1], [], [2, 30, 2, 2, 2]]
)
@pytest.mark.parametrize("budget", [1, 6, 10, 25, 1000])
def test_packed_groups_cover_every_row_once_within_the_budget(lengths, budget):
    groups = packed_groups(lengths, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(flat, reverse=True)  # longest first
    for g in groups:
        width = max(lengths[i] for i in g)
        packed_rows = len(first_fit([lengths[i] for i in g], width))  # what the forward packs
        assert packed_rows * width <= budget or len(g) == 1


def test_packing_cuts_under_the_padded_micro_batch_budget_and_packs_more_rows_per_pass():
    lengths = [8, 1, 7, 2, 6, 3, 5, 4]
    # no token budget: what a padded micro-batch of 2 rows computes at most, 2 x 8
    assert split_rows(lengths, 2, True, None, packing=True) == packed_groups(lengths, 16)
    # 8 | 7, then 6 | 5, then 4 | 3+1 | 2: three passes where padded rows of 2 take four
    assert packed_groups(lengths, 16) == [[0, 2], [4, 6], [7, 5, 3, 1]]
    # a token budget: 4 + 3 in two rows of 4, 2 + 1 in two of 2; a longer row alone
    assert split_rows(lengths, 2, True, 9, packing=True) == [[0], [2], [4], [6], [7, 5], [3, 1]]


# -- the step's gradient -----------------------------------------------------------------------
ROWS = [
    [2, 5, 6, 7, 8, 9, 3],
    [2, 4, 3],
    [2, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 3],
    [2, 9, 3],
    [2, 3],
    [],
]


def sft_rows() -> RowList:
    return RowList([torch.tensor(r, dtype=torch.long) for r in ROWS], lambda r: len(r))


def batch_of(rows: list[torch.Tensor]):
    width = max(max(len(r) for r in rows), 2)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return ids, mask


def step_gradient(model, **learner) -> tuple[list[torch.Tensor], dict, list[int]]:
    engine = Learner.build(
        ModelCall(model), Training(OptimConfig(), 1, MicroBatching(2, by_length=True, **learner))
    )
    engine.optimizer_step = lambda: 0.0  # the gradients stay for the test to read
    rows = sft_rows()
    total = float(sum(max(len(r) - 1, 0) for r in rows))
    widths = []

    def loss(micro):
        ids, mask = batch_of(list(micro.rows))
        widths.append(int(ids.numel()))
        nll, count = call_model(engine.call, model_token_nll, ids, mask, mask)
        return nll / total, {"nll": float(nll.detach()), "tokens": count}

    sums, _ = engine.step(
        rows, loss, lambda r: sum(max(len(x) - 1, 0) for x in r), total, sums=("nll", "tokens")
    )
    return [p.grad.clone() for p in model.parameters()], sums, widths


@pytest.mark.parametrize("budget", [None, 12, 40])
def test_a_packed_step_has_the_padded_paths_gradient(tok, budget):
    padded = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
    packed = copy.deepcopy(padded)
    enable_packing(packed)
    expected, expected_sums, _ = step_gradient(padded)
    got, sums, widths = step_gradient(packed, packing=True, micro_batch_tokens=budget)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert sums["tokens"] == expected_sums["tokens"]
    assert sums["nll"] == pytest.approx(expected_sums["nll"], rel=1e-5)


# -- the config --------------------------------------------------------------------------------
def test_packing_is_a_bool_of_every_train_group():
    assert load_config(SFTConfig, overrides={"train": {"packing": True}}).train.packing is True
    assert rl_config("ppo_max", train={"packing": True}).train.packing is True
    with pytest.raises(ConfigError, match="train.packing"):
        load_config(SFTConfig, overrides={"train": {"packing": "often"}})


# -- every logged metric of the stages ---------------------------------------------------------
@pytest.fixture()
def packed_passes(monkeypatch) -> list[tuple[int, int]]:
    """(padded rows, packed rows) of every packed forward (a run that never packed two sequences in
    a row would compare the padded path with itself)."""
    import rlhf.models.packing as packing

    seen: list[tuple[int, int]] = []
    real = packing.pack

    def spy(input_ids, attention_mask, one_row=False):
        out = real(input_ids, attention_mask, one_row)
        if out is not None:
            seen.append((int(input_ids.shape[0]), int(out.input_ids.shape[0])))
        return out

    monkeypatch.setattr(packing, "pack", spy)
    return seen


def packed_somewhere(seen: list[tuple[int, int]]) -> bool:
    return any(packed < rows for rows, packed in seen)


def varied(seed: int, longest: int = 16) -> str:
    """1 to `longest` words: rows of very different lengths, so that short ones share a packed row."""
    return " ".join(WORDS[(seed * 5 + i) % 19] for i in range(1 + (seed * 7) % longest))


def rewrite(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def sft_data(n: int = 24) -> list[dict]:
    return [{"prompt": WORDS[i % 19], "response": varied(i)} for i in range(n)]


def pair_data(n: int = 48) -> list[dict]:
    return [
        {"prompt": WORDS[i % 19], "chosen": varied(i) + " t", "rejected": varied(i + 1)} for i in range(n)
    ]


@pytest.mark.slow
def test_sft_metrics_are_unchanged_by_packing(packed_passes, tok, tmp_path):
    from rlhf.stages.sft import run_sft
    from tests.stages.test_train_sft import sft_config

    logs = []
    for name, packing in (("padded", False), ("packed", True)):
        (tmp_path / name).mkdir()
        c = sft_config(tmp_path / name, train={"max_steps": 4, "eval_every": 2, "packing": packing})
        rewrite(tmp_path / name / "sft.jsonl", sft_data())
        model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)
        run_sft(c, model=model, tokenizer=tok, quiet=True)
        logs.append(records(tmp_path / name / "sft" / "metrics.jsonl"))
    assert packed_somewhere(packed_passes)
    assert_same_metrics(*logs)


@pytest.mark.slow
def test_rm_metrics_are_unchanged_by_packing(packed_passes, tok, tmp_path):
    from rlhf.stages.rm import run_reward_training
    from tests.stages.test_train_reward_model import reward_model, rm_config

    logs = []
    for name, packing in (("padded", False), ("packed", True)):
        c = rm_config(tmp_path / name, max_steps=4, lm_coef=0.5, packing=packing)
        rewrite(tmp_path / name / "pairs.jsonl", pair_data())
        run_reward_training(c, model=reward_model(tok), tokenizer=tok, quiet=True)
        logs.append(records(tmp_path / name / "rm" / "metrics.jsonl"))
    assert packed_somewhere(packed_passes)
    assert_same_metrics(*logs)


@pytest.mark.slow
@pytest.mark.parametrize("precompute", [False, True])
def test_dpo_metrics_are_unchanged_by_packing(precompute, packed_passes, tok, tmp_path):
    """With the reference's log-probs cached before training (`dpo.precompute_reference`) its passes
    pack other rows together than the step's do, so the first step's margins, exactly 0 when the
    policy is its reference, are 0 only to float rounding (+-1e-7): the accuracy of such a tie
    (margin > 0) is left out there; every other figure is compared."""
    from rlhf.stages.dpo import run_dpo
    from tests.stages.test_train_dpo import config, model

    logs = []
    for name, packing in (("padded", False), ("packed", True)):
        c = config(tmp_path / name, precompute_reference=precompute)
        c.train.max_steps, c.train.packing = 4, packing
        rewrite(tmp_path / name / "pairs.jsonl", pair_data(40))
        run_dpo(c, model=model(tok), tokenizer=tok, quiet=True)
        logs.append(records(tmp_path / name / "dpo" / "metrics.jsonl"))
    assert packed_somewhere(packed_passes)
    padded, packed = logs
    for a, b in zip(padded, packed):
        for split in ("train", "eval"):
            if precompute and a.get(f"{split}/margin") == 0.0:  # a tie: its sign is rounding
                assert abs(b[f"{split}/margin"]) < 1e-6
                a.pop(f"{split}/accuracy"), b.pop(f"{split}/accuracy")
    assert_same_metrics(padded, packed)


@pytest.mark.slow
def test_train_metrics_are_unchanged_by_packing(packed_passes, make_trainer, tmp_path):
    logs = []
    for name, packing in (("padded", False), ("packed", True)):
        # longer responses (most end at EOS earlier): rows of very different lengths
        config = rl_config("ppo_max", train={"packing": packing}, rollout={"max_new_tokens": 16})
        trainer = make_trainer(config, run_dir=tmp_path / name)
        assert all(role.learner.batching.packing == packing for role in trainer.runtime.roles.learners())
        trainer.train()
        logs.append(metric_rows(tmp_path / name))
    assert packed_somewhere(packed_passes)
    assert_same_metrics(*logs)
