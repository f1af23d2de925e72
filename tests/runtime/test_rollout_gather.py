"""`dist.rollout_gather per_layer` (rlhf/runtime/distributed.py, rlhf/models/sampling.py): under fsdp2
the rollout gathers the policy one layer at a time in every decoding step, every rank stepping until
every rank's rows have ended; the tokens and metrics stay the whole-gather run's and one process's.

2 spawned gloo ranks (tests/support/ranks.py); the one-process reference is the local runtime in
this process, on the same seeds.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime.test_distributed import assert_close_dicts, one_thread
from tests.support.ranks import run_ranks
from tests.support.rollout_cases import watched_rollout_run

GATHERS = ("whole", "per_layer")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """The watched run with each gather on 2 ranks, in one spawned job: {gather: [rank 0, rank 1]}."""
    from tests.support.dist_cases import each_case

    root = tmp_path_factory.mktemp("rollout_gather")
    per_rank = run_ranks(each_case, watched_rollout_run, [(str(root / g), g) for g in GATHERS])
    return {g: [results[i] for results in per_rank] for i, g in enumerate(GATHERS)}


@pytest.mark.slow
def test_per_layer_rollout_samples_the_whole_gathers_and_one_process_tokens_in_lockstep(two_ranks, tmp_path):
    one = one_thread(watched_rollout_run, str(tmp_path / "one"), "per_layer")
    whole, per_layer = two_ranks["whole"], two_ranks["per_layer"]
    # uneven EOS: in some rollout one rank's rows had all ended while the other's still decoded
    # (drop_finished_rows on, the default: that rank then steps one ended row along)
    ends = [got["own_rows_ended_at"] for got in per_layer]
    assert ends == [got["own_rows_ended_at"] for got in whole]
    assert any(a != b for a, b in zip(*ends)), ends
    # each rollout runs one forward per decoding step (the prefill included) up to the step at which
    # the rows end: whole gather, each rank its own rows' end; per layer, the last rank's, on every rank
    layers = 2
    for rank, got in enumerate(whole):
        assert got["layer_calls"] == layers * sum(ends[rank]), f"rank {rank}"
    lockstep = layers * sum(max(steps) for steps in zip(*ends))
    assert [got["layer_calls"] for got in per_layer] == [lockstep, lockstep]
    assert whole[0]["layer_calls"] != whole[1]["layer_calls"]  # without lockstep they differ
    for gather, ranks in two_ranks.items():
        for rank, got in enumerate(ranks):
            what = f"{gather} rank {rank}"
            assert len(got["rollouts"]) == len(one["rollouts"]) == 3, what  # critic pre-training + 2
            for i, (tokens, expected) in enumerate(zip(got["rollouts"], one["rollouts"])):
                assert torch.equal(tokens, expected), f"{what}: rollout {i}'s tokens"
            assert_close_dicts(got["last"], one["last"], f"{what} metrics")
        assert len(ranks[0]["written"]) == len(one["written"])
        for got, expected in zip(ranks[0]["written"], one["written"]):
            assert_close_dicts(got, expected, f"{gather} metrics.jsonl")


@pytest.mark.slow
def test_per_layer_rollout_holds_one_layer_and_the_root_unit_never_the_whole_policy(two_ranks):
    """The most policy parameter elements held gathered at any op of the rollouts: the whole policy
    under the whole gather; under per_layer the root unit (embeddings, final norm, output head: held
    through the `sample` call) and one decoder layer, to the element."""
    for rank, got in enumerate(two_ranks["whole"]):
        assert got["most_gathered"] == got["policy_elements"], f"rank {rank}"
    for rank, got in enumerate(two_ranks["per_layer"]):
        one_layer = got["root_elements"] + got["largest_layer_elements"]
        assert got["most_gathered"] == one_layer < got["policy_elements"], f"rank {rank}: {got}"


def test_rollout_gather_per_layer_needs_fsdp2():
    from rlhf.config import ConfigError, RLConfig, load_config

    with pytest.raises(ConfigError, match=r"dist\.rollout_gather .*Fix: --dist\.strategy fsdp2"):
        load_config(RLConfig, overrides={"dist": {"strategy": "ddp", "rollout_gather": "per_layer"}})
    with pytest.raises(ConfigError, match="dist.rollout_gather"):
        load_config(RLConfig, overrides={"dist": {"strategy": "fsdp2", "rollout_gather": "layers"}})
    config = load_config(RLConfig, overrides={"dist": {"strategy": "fsdp2", "rollout_gather": "per_layer"}})
    assert config.dist.rollout_gather == "per_layer"


def test_the_supervised_stages_refuse_a_rollout_gather_they_do_not_use(tmp_path):
    from rlhf.config import ConfigError, SFTConfig, load_config
    from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
    from rlhf.stages.sft import run_sft

    tok = word_tokenizer(["a b c"])
    config = load_config(
        SFTConfig,
        overrides={"out": str(tmp_path / "sft"), "model": "unused", "data": {"path": "unused"},
                   "dist": {"strategy": "fsdp2", "rollout_gather": "per_layer"}},
    )  # fmt: skip
    with pytest.raises(ConfigError, match="samples no rollout"):
        run_sft(config, model=tiny_causal_lm(tok), tokenizer=tok, quiet=True)
    assert not (tmp_path / "sft").exists()
