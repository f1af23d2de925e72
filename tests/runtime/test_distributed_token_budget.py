"""Token-budget micro-batches (`train.micro_batch_tokens`) on 2 gloo ranks: a budget gives the ranks
different counts of passes, which the engine evens with fillers (rlhf/train/learner.py
`micro_batches`, `Peers.largest`); the numbers are the one process's, under ddp and fsdp2."""

from __future__ import annotations

import pytest

from tests.runtime.test_distributed import assert_close_dicts, one_thread
from tests.support.dist_cases import each_call, ppo_run, ptx_rows_file, supervised_run, write_supervised_data
from tests.support.ranks import run_ranks

BUDGET = {"train": {"micro_batch_tokens": 12}}  # rows of 4-9 tokens: 1 or 2 rows per pass
PPO = {"ddp": ("ppo_max", [BUDGET]), "fsdp2": ("ppo_max", [BUDGET, {"dist": {"strategy": "fsdp2"}}])}
SUPERVISED = [("sft-budget", "ddp"), ("dpo-budget", "ddp"), ("rm-budget", "fsdp2")]


@pytest.fixture(scope="module")
def on_two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget_two_ranks")
    ptx, data = ptx_rows_file(root), write_supervised_data(root)
    calls = [(ppo_run, str(root / name), preset, layers, ptx) for name, (preset, layers) in PPO.items()]
    calls += [
        (supervised_run, stage, str(root / f"{stage}-{strategy}"), data[stage.split("-")[0]], strategy, 5)
        for stage, strategy in SUPERVISED
    ]
    per_rank = run_ranks(each_call, calls)
    return ptx, data, per_rank


@pytest.mark.slow
def test_two_ranks_with_a_token_budget_train_as_one_process(on_two_ranks, tmp_path):
    ptx, data, per_rank = on_two_ranks
    for i, (name, (preset, layers)) in enumerate(PPO.items()):
        one = one_thread(ppo_run, str(tmp_path / name), preset, layers, ptx)
        for rank, results in enumerate(per_rank):
            got = results[i]
            assert_close_dicts(got["policy"], one["policy"], f"{name} rank {rank} policy parameters")
            assert_close_dicts(got["critic"], one["critic"], f"{name} rank {rank} critic parameters")
            assert_close_dicts(got["last"], one["last"], f"{name} rank {rank} metrics")
        for got, expected in zip(per_rank[0][i]["written"], one["written"]):
            assert_close_dicts(got, expected, f"{name} metrics.jsonl")
    for j, (stage, strategy) in enumerate(SUPERVISED, start=len(PPO)):
        one = one_thread(supervised_run, stage, str(tmp_path / stage), data[stage.split("-")[0]], "ddp", 5)
        for rank, results in enumerate(per_rank):
            assert_close_dicts(
                results[j]["params"], one["params"], f"{stage} {strategy} rank {rank} parameters"
            )
            assert_close_dicts(results[j]["last"], one["last"], f"{stage} {strategy} rank {rank} metrics")
        for got, expected in zip(per_rank[0][j]["written"], one["written"]):
            assert_close_dicts(got, expected, f"{stage} {strategy} metrics.jsonl")
