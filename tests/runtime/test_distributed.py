"""Data parallelism (rlhf/runtime/distributed.py): 2 gloo ranks give the one-process run's numbers.

The ranks are spawned processes (tests/support/ranks.py); the one-process reference is the local
runtime in this process, on the same seeds and the same global batch.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.dist_cases import each_case, ppo_run, ptx_rows_file
from tests.support.ranks import run_ranks

ATOL = 1e-5


def one_thread(fn, *args):
    """`fn(*args)` on one intra-op thread, as each rank runs: the same float summation order. Another
    thread count moves sums by an ulp, and a threshold count such as a clip fraction can then differ
    by a token (seen: value/value_clip_fraction 13/32 on one thread, 12/32 on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def assert_close_dicts(got: dict, expected: dict, what: str) -> None:
    assert got.keys() == expected.keys(), what
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(got[key], value, atol=ATOL, rtol=0, msg=f"{what}: {key}")
        elif isinstance(value, list):  # per-row lists are logged rounded to 4 decimals (metrics.py)
            assert got[key] == pytest.approx(value, abs=1e-4 + ATOL), f"{what}: {key}"
        elif isinstance(value, float):
            assert got[key] == pytest.approx(value, abs=ATOL, rel=1e-5), f"{what}: {key}"
        else:
            assert got[key] == value, f"{what}: {key}"


PPO_CASES = {
    "ppo_max-separate-critic": ("ppo_max", []),  # critic from the reward model, pre-trained; PPO-ptx
    "shared-critic": (
        "vanilla_ppo",
        [{"model": {"critic_mode": "shared"}, "rollout": {"logprobs_from_sampler": True}}],
    ),
    # minibatches of 1 row and 1 PPO-ptx row: rank 1 holds none (no gradient there, summed as
    # zeros); a dropped truncated response trains nothing
    "empty-rank": (
        "ppo_max",
        [
            {
                "rollout": {"batch_size": 4, "truncated": "drop"},
                "train": {"minibatches": 4},
                "data": {"ptx_batch_size": 1},
            }
        ],
    ),
    # fsdp2: the policy and the critic sharded (rlhf/parallel/fsdp.py), the same numbers
    "fsdp2-separate-critic": ("ppo_max", [{"dist": {"strategy": "fsdp2"}}]),
    # fsdp2 with the value head on the policy's trunk, and rank 1 without rows in every step
    "fsdp2-shared-critic-empty-rank": (
        "vanilla_ppo",
        [
            {"dist": {"strategy": "fsdp2"}, "model": {"critic_mode": "shared"}},
            {"rollout": {"batch_size": 4, "truncated": "drop"}, "train": {"minibatches": 4}},
        ],
    ),
    # fsdp2 with empty-rank minibatches and PPO-ptx rows: rank 1 runs fillers in every step
    "fsdp2-empty-rank-ptx": (
        "ppo_max",
        [
            {"dist": {"strategy": "fsdp2"}},
            {
                "rollout": {"batch_size": 4, "truncated": "drop"},
                "train": {"minibatches": 4},
                "data": {"ptx_batch_size": 1},
            },
        ],
    ),
    # fsdp2 with a LoRA policy (frozen base, trained adapters; the reference is the adapter switched
    # off, through the policy's sharded module) and a LoRA critic
    "fsdp2-lora": (
        "ppo_max",
        [
            {"dist": {"strategy": "fsdp2"}},
            {"model": {"lora": {"enabled": True, "r": 4}, "critic_lora": {"enabled": True, "r": 4}}},
            {"policy_optim": {"lr": 1e-2}},
        ],
    ),
    # ddp with a LoRA policy and critic: DDP reduces the adapters' gradients, the frozen bases have none
    "ddp-lora": (
        "ppo_max",
        [
            {"model": {"lora": {"enabled": True, "r": 4}, "critic_lora": {"enabled": True, "r": 4}}},
            {"policy_optim": {"lr": 1e-2}},
        ],
    ),
    # fsdp2, gradients reduce-scattered once per optimizer step (dist.grad_sync step): rank 0 runs two
    # micro-batches per step, the first accumulated unsharded; with PPO-ptx last, and with a shared
    # critic (the value pass last, the LM head left out of it)
    "fsdp2-grad-sync-step": ("ppo_max", [{"dist": {"strategy": "fsdp2", "grad_sync": "step"}}]),
    "fsdp2-grad-sync-step-shared-critic": (
        "vanilla_ppo",
        [{"dist": {"strategy": "fsdp2", "grad_sync": "step"}, "model": {"critic_mode": "shared"}}],
    ),
    # critic-free presets: the policy is the only learner (no critic to broadcast, shard or save)
    "grpo-critic-free": ("grpo", [{"rollout": {"batch_size": 8, "samples_per_prompt": 4}}]),
    "fsdp2-grpo-critic-free": (
        "grpo",
        [{"dist": {"strategy": "fsdp2"}, "rollout": {"batch_size": 8, "samples_per_prompt": 4}}],
    ),
    # and dist.offload: CPUOffloadPolicy on every unit of every role (on the CPU it moves nothing)
    "fsdp2-rloo-critic-free-offload": (
        "rloo",
        [{"dist": {"strategy": "fsdp2", "offload": True}, "rollout": {"batch_size": 8}}],
    ),
}


@pytest.fixture(scope="module")
def ppo_on_two_ranks(tmp_path_factory) -> tuple[str, dict[str, list[dict]]]:
    """Every PPO case on 2 ranks, in one spawned job: (the PPO-ptx file, {case: [rank 0, rank 1]})."""
    root = tmp_path_factory.mktemp("ppo_two_ranks")
    ptx = ptx_rows_file(root)
    cases = [(str(root / name), preset, layers, ptx) for name, (preset, layers) in PPO_CASES.items()]
    per_rank = run_ranks(each_case, ppo_run, cases)
    return ptx, {name: [results[i] for results in per_rank] for i, name in enumerate(PPO_CASES)}


@pytest.mark.parametrize("case", PPO_CASES)
@pytest.mark.slow
def test_two_ranks_train_as_one_process(case, ppo_on_two_ranks, tmp_path):
    ptx, two = ppo_on_two_ranks
    preset, layers = PPO_CASES[case]
    one = one_thread(ppo_run, str(tmp_path / "one"), preset, layers, ptx)
    ranks = two[case]
    for rank, got in enumerate(ranks):
        assert torch.equal(got["tokens"], one["tokens"]), f"rank {rank}: sampled tokens"
        assert got["sharded"] == case.startswith("fsdp2"), f"rank {rank}: sharded"
        assert got["replicated"] == (not case.startswith("fsdp2")), f"rank {rank}: under DDP"
        if case.startswith("fsdp2"):  # the policy's root and its decoder layer
            policy = "CPUOffloadPolicy" if case.endswith("offload") else "OffloadPolicy"
            assert got["offload_policies"] == [policy] * 2, f"rank {rank}: {got['offload_policies']}"
        assert_close_dicts(got["policy"], one["policy"], f"rank {rank} policy parameters")
        assert_close_dicts(got["critic"], one["critic"], f"rank {rank} critic parameters")
        assert_close_dicts(got["last"], one["last"], f"rank {rank} metrics")
    assert len(ranks[0]["written"]) == len(one["written"])  # one writer: no record twice
    for got, expected in zip(ranks[0]["written"], one["written"]):
        assert_close_dicts(got, expected, "metrics.jsonl")
    # the case is one where the switches act: clipping, PPO-ptx, the critic's pre-training
    assert one["last"]["policy/grad_norm"] > 0.05
    if "critic-free" in case:
        assert one["critic"] == {} and not any(k.startswith("value/") for k in one["last"])
    else:
        assert any("critic_pretrain/value_loss" in row for row in one["written"])


def test_a_multi_process_launch_without_a_strategy_exits_2_naming_the_rank(monkeypatch, tmp_path, capsys):
    from rlhf.cli import main

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["train", "--policy", "p", "--reward-model", "r", "--prompts", "x.jsonl", "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhf train (rank 1 of 2): torchrun started 2 processes but dist.strategy is none")
    assert "Fix: add --dist.strategy ddp" in err


def test_offload_without_fsdp2_is_a_config_error_naming_the_fix():
    from rlhf.config import ConfigError, RLConfig, load_config

    with pytest.raises(ConfigError, match=r"dist\.offload .*Fix: --dist\.strategy fsdp2"):
        load_config(RLConfig, preset="ppo_max", overrides={"dist": {"strategy": "ddp", "offload": True}})


def test_an_unknown_strategy_is_a_config_error():
    from rlhf.config import ConfigError, RLConfig, load_config

    with pytest.raises(ConfigError, match="dist.strategy"):
        load_config(RLConfig, overrides={"dist": {"strategy": "zero3"}})


def test_row_shares_cover_the_batch_once_and_differ_by_at_most_one():
    from rlhf.parallel.peers import share_of

    for batch in range(0, 9):
        for world in (1, 2, 3, 4):
            shares = [share_of(batch, r, world) for r in range(world)]
            rows = [i for s in shares for i in range(batch)[s]]
            assert rows == list(range(batch))
            sizes = [s.stop - s.start for s in shares]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.slow
def test_ranks_share_the_cores_and_a_collective_fails_after_the_timeout_instead_of_hanging():
    from rlhf.parallel.threads import available_cores
    from tests.support.dist_cases import threads_then_silent_peer

    (threads_0, (lost, message)), (threads_1, _) = run_ranks(
        threads_then_silent_peer, 8.0, collective_timeout=2.0
    )
    assert threads_0 == threads_1 == max(1, available_cores() // 2)  # spawned with every core each
    assert lost, message


@pytest.fixture(scope="module")
def supervised_on_two_ranks(tmp_path_factory) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """An SFT and a reward-model run on 2 ranks, in one spawned job: (data files, {stage: [rank 0, rank 1]})."""
    from tests.support.dist_cases import supervised_run, write_supervised_data

    root = tmp_path_factory.mktemp("supervised_two_ranks")
    data = write_supervised_data(root)
    cases = [
        (stage, str(root / f"{stage}-{strategy}-{batch}"), data[stage.split("-")[0]], strategy, batch)
        for stage, strategy, batch in SUPERVISED
    ]
    per_rank = run_ranks(each_case, supervised_run, cases)
    return data, {case: [results[i] for results in per_rank] for i, case in enumerate(SUPERVISED)}


# (stage, strategy, rows per step): 5 rows: ranks hold 3 and 2 (2 and 1 micro-batches of 2; under
# fsdp2 rank 1 runs a filler); 1 row: rank 1 holds none (fillers only)
SUPERVISED = [
    ("sft", "ddp", 5),
    ("rm", "ddp", 5),
    ("dpo", "ddp", 5),
    ("sft", "fsdp2", 5),
    ("rm", "fsdp2", 5),
    ("dpo", "fsdp2", 5),
    ("sft", "fsdp2", 1),
    ("rm", "fsdp2", 1),
    ("sft", "ddp", 1),  # rank 1 without a row: DDP's passes all fillers there
    ("rm", "ddp", 1),
    ("dpo-live", "fsdp2", 5),  # the sharded reference copy in every step
    ("dpo-lora", "fsdp2", 5),  # the reference: the sharded LoRA policy, its adapter off
    ("sft-checkpointed", "fsdp2", 5),  # each layer gathered again for its recomputation
    ("sft-offload", "fsdp2", 5),  # dist.offload: CPUOffloadPolicy on every unit
    ("dpo-offload", "fsdp2", 5),  # and on the reference copy's
    ("dpo-simpo", "fsdp2", 5),  # reference-free: the policy's units alone
    ("sft-compiled", "ddp", 5),  # train.compile: DDP's hooks around the compiled decoder's gradients
]


@pytest.mark.parametrize("stage,strategy,batch", SUPERVISED)
@pytest.mark.slow
def test_two_ranks_train_sft_reward_and_dpo_models_as_one_process(
    stage, strategy, batch, supervised_on_two_ranks, tmp_path
):
    from tests.support.dist_cases import supervised_run

    data, two = supervised_on_two_ranks
    one = one_thread(supervised_run, stage, str(tmp_path / "one"), data[stage.split("-")[0]], "ddp", batch)
    ranks = two[(stage, strategy, batch)]
    assert [r["compiled"] for r in ranks] == [stage.endswith("-compiled")] * 2  # train.compile
    # the exported model (rank 0 writes it; under fsdp2 from the gathered shards) is the one-process one
    assert_close_dicts(ranks[0]["exported"], one["exported"], "exported model.safetensors")
    # under fsdp2: the root and each decoder layer an FSDP unit (DPO's reference copy too), each
    # with the offload policy asked for (on the CPU it moves nothing: the policy is what to check)
    # a LoRA reference: the policy's own; SimPO: none
    with_copy = stage.startswith("dpo") and stage not in ("dpo-lora", "dpo-simpo")
    units = (1 + 1) * (2 if with_copy else 1) if strategy == "fsdp2" else 0
    policy = "CPUOffloadPolicy" if stage.endswith("-offload") else "OffloadPolicy"
    for rank, got in enumerate(ranks):
        assert got["sharded"] == (strategy == "fsdp2"), f"rank {rank}: sharded"
        assert got["offload_policies"] == [policy] * units, f"rank {rank}: {got['offload_policies']}"
        assert_close_dicts(got["params"], one["params"], f"rank {rank} parameters")
        assert_close_dicts(got["last"], one["last"], f"rank {rank} metrics")
    assert len(ranks[0]["written"]) == len(one["written"])  # one writer: no record twice
    for got, expected in zip(ranks[0]["written"], one["written"]):
        assert_close_dicts(got, expected, "metrics.jsonl")
    assert one["last"]["train/grad_norm"] > 0.5  # the clip acts


@pytest.fixture(scope="module")
def fsdp2_accounting(tmp_path_factory) -> tuple[dict, dict]:
    """Both fsdp2 accounting jobs in one spawned job: ([sharding per rank], [meta loading per rank])."""
    from tests.support.dist_cases import (
        each_call,
        meta_loading_accounting,
        save_tiny_models,
        sharding_accounting,
    )

    root = tmp_path_factory.mktemp("fsdp2_accounting")
    (root / "models").mkdir()
    paths = save_tiny_models(str(root / "models"))
    calls = [(sharding_accounting, str(root / "run")), (meta_loading_accounting, paths)]
    per_rank = run_ranks(each_call, calls)
    return [results[0] for results in per_rank], [results[1] for results in per_rank]


@pytest.mark.slow
def test_fsdp2_holds_half_of_every_role_and_never_a_whole_model(fsdp2_accounting):
    """Per-layer sharding is in effect: between uses each rank holds about half of every role's
    parameters (trained and frozen) and of the AdamW moments; while sampling, scoring and stepping no
    op creates a tensor as large as half a model (the old whole-model gather, or a whole flat
    gradient bucket, would be the whole model)."""
    for rank, got in enumerate(fsdp2_accounting[0]):
        for role in ("policy", "critic", "reference", "reward_model"):
            counts = got[role]
            assert counts["sharded"], f"rank {rank}: {role} not sharded"
            # dim-0 chunks: a [1, H] value head sits on rank 0 whole, hence the slack over 1/2
            assert counts["local"] <= 0.52 * counts["whole"], f"rank {rank}: {role} {counts}"
        for role in ("policy", "critic"):
            assert got[role]["moments_local"] <= 2 * 0.52 * got[role]["whole"], f"rank {rank}: {role}"
        smallest_model = min(got[role]["whole"] for role in ("policy", "critic", "reference", "reward_model"))
        for phase in ("rollout", "forwards", "steps"):
            assert 0 < got["largest"][phase] < smallest_model / 2, f"rank {rank}: {phase} {got['largest']}"


@pytest.mark.slow
def test_fsdp2_supervised_stages_hold_half_of_the_model_and_never_a_whole_one(tmp_path):
    """`rlhf sft`, `rm` and `dpo` under fsdp2 shard per layer: after every optimizer step each rank
    holds about half of the model's parameters and of the AdamW moments (DPO: of the reference copy
    too); no op of a step's forwards and backwards, of the optimizer step or of an evaluation creates a
    tensor as large as half the model (a whole-model gather or gradient would be the whole model)."""
    from tests.support.dist_cases import supervised_accounting, write_supervised_data

    data = write_supervised_data(tmp_path)
    cases = [(stage, str(tmp_path / stage), data[stage]) for stage in ("sft", "rm", "dpo")]
    per_rank = run_ranks(each_case, supervised_accounting, cases)
    for rank, results in enumerate(per_rank):
        for (stage, *_), got in zip(cases, results):
            assert len(got["between_steps"]) == 2, f"rank {rank} {stage}"
            for counts in got["between_steps"]:
                assert counts["sharded"], f"rank {rank} {stage}: not sharded"
                # dim-0 chunks of odd sizes (a [1, H] scalar head whole on rank 0): slack over 1/2
                assert counts["local"] <= 0.52 * counts["whole"], f"rank {rank} {stage}: {counts}"
                assert 0 < counts["moments_local"] <= 2 * 0.52 * counts["whole"], f"rank {rank} {stage}"
            whole = got["between_steps"][0]["whole"]
            for phase in ("train", "step", "eval"):
                assert 0 < got["largest"][phase] < whole / 2, f"rank {rank} {stage}: {phase} {got['largest']}"
            if stage == "dpo":
                ref = got["reference"]
                assert ref["sharded"] and ref["local"] <= 0.52 * ref["whole"], f"rank {rank}: reference {ref}"


@pytest.mark.slow
def test_sft_rm_and_dpo_under_fsdp2_build_rank_1s_model_on_meta_and_train_as_one_process(tmp_path):
    """`rlhf sft|rm|dpo --model DIR` under fsdp2: rank 1 builds the model (and DPO's reference copy) on
    the meta device (no weight read), gets its shards from rank 0, and the run equals one process's
    from the same directory."""
    from tests.support.dist_cases import save_tiny_models, supervised_run, write_supervised_data

    data = write_supervised_data(tmp_path)
    model_dir = save_tiny_models(str(tmp_path))["policy"]
    stages = ("sft", "rm", "dpo")
    cases = [(stage, str(tmp_path / stage), data[stage], "fsdp2", 5, model_dir) for stage in stages]
    rank0, rank1 = run_ranks(each_case, supervised_run, cases)
    for stage, got0, got1 in zip(stages, rank0, rank1):
        one = one_thread(
            supervised_run, stage, str(tmp_path / f"one-{stage}"), data[stage], "ddp", 5, model_dir
        )
        assert not got0["built_on_meta"] and not one["built_on_meta"], stage  # read from the files
        assert got1["built_on_meta"], stage  # the structure alone
        assert_close_dicts(got0["exported"], one["exported"], f"{stage}: exported model")
        for rank, got in enumerate((got0, got1)):
            assert got["sharded"], f"{stage}: rank {rank}"
            assert_close_dicts(got["params"], one["params"], f"{stage}: rank {rank} parameters")
            assert_close_dicts(got["last"], one["last"], f"{stage}: rank {rank} metrics")


@pytest.mark.slow
def test_under_fsdp2_rank_1_never_holds_a_whole_model_and_gets_rank_0s_weights(fsdp2_accounting):
    """Sharded loading: rank 1 builds every role on the meta device (no weight read) and receives its
    shards from rank 0, one whole tensor in transit at a time (never a role's whole parameters), and
    every role's gathered parameters equal rank 0's (the files' values)."""
    rank0, rank1 = fsdp2_accounting[1]
    # loading: rank 0 reads every weight, rank 1 creates no tensor of a parameter's size
    assert rank0["largest"]["load"] == rank0["largest_parameter"]
    assert rank1["largest"].get("load", 0) < rank1["largest_parameter"] / 4, rank1["largest"]
    # sharding: one whole tensor in transit at a time, never more than the largest parameter
    assert rank1["largest"]["shard"] <= rank1["largest_parameter"]
    for role, params in rank0["whole"].items():
        assert_close_dicts(rank1["whole"][role], params, f"{role} on rank 1")


RESUME_STRATEGIES = ["ddp", "fsdp2"]


@pytest.fixture(scope="module")
def resumed_on_two_ranks(tmp_path_factory) -> tuple[str, dict]:
    """Every strategy's whole and interrupted-then-resumed runs, and DPO's under fsdp2, in one spawned
    job: (the PPO-ptx file, {strategy, or "dpo": its root directory, "dpo-data": DPO's pairs})."""
    from tests.support.dist_cases import (
        dpo_whole_and_interrupted,
        each_call,
        run_whole_and_interrupted,
        write_supervised_data,
    )

    root = tmp_path_factory.mktemp("resume_two_ranks")
    ptx = ptx_rows_file(root)
    roots = {name: root / name for name in (*RESUME_STRATEGIES, "dpo")}
    for directory in roots.values():
        directory.mkdir()
    roots["dpo-data"] = write_supervised_data(root)["dpo"]
    calls = [(run_whole_and_interrupted, str(roots[s]), ptx, s) for s in RESUME_STRATEGIES]
    run_ranks(each_call, calls + [(dpo_whole_and_interrupted, str(roots["dpo"]), roots["dpo-data"])])
    return ptx, roots


@pytest.mark.parametrize("strategy", RESUME_STRATEGIES)
@pytest.mark.slow
def test_a_two_rank_run_resumes_at_two_ranks_and_in_one_process(strategy, resumed_on_two_ranks):
    """fsdp2: every rank writes its shards of the weights and optimizer moments (DCP); they load at
    2 ranks and into one process."""
    from tests.support.dist_cases import resume_run
    from tests.support.train_testing import metric_rows

    ptx, roots = resumed_on_two_ranks
    root = roots[strategy]
    whole = metric_rows(root / "whole")
    assert [r.get("iteration", r.get("pretrain")) for r in whole] == [0, 0, 1, 2]
    if strategy == "fsdp2":  # each rank wrote its shards (DCP): no whole weights in the checkpoint
        checkpoint = root / "split_copy" / "checkpoints" / "iter_000002"
        assert sorted(p.name for p in (checkpoint / "shards").glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]
        assert not list(checkpoint.glob("policy*.safetensors")) and not list(
            checkpoint.glob("critic*.safetensors")
        )
    # the 2-rank checkpoint, continued by one process
    one_thread(resume_run, str(root / "split_copy"), ptx, strategy)
    for resumed in ("split", "split_copy"):
        rows = metric_rows(root / resumed)
        assert len(rows) == len(whole), resumed
        for got, expected in zip(rows, whole):
            assert_close_dicts(got, expected, f"{resumed} metrics.jsonl")


@pytest.mark.slow
def test_a_two_rank_fsdp2_dpo_run_resumes_at_two_ranks_and_in_one_process(resumed_on_two_ranks):
    """DPO under fsdp2: every rank writes its shards of the weights and AdamW moments (DCP); the
    checkpoint resumes at 2 ranks and in one process with the uninterrupted run's metrics and
    exported model (to ATOL 1e-5, float rounding)."""
    from safetensors.torch import load_file

    from tests.support.dist_cases import dpo_resume
    from tests.support.train_testing import metric_rows

    _, roots = resumed_on_two_ranks
    root = roots["dpo"]
    checkpoint = root / "split_copy" / "checkpoints" / "iter_000001"
    assert sorted(p.name for p in (checkpoint / "shards").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert not list(checkpoint.glob("model*.safetensors"))  # no whole weights
    one_thread(dpo_resume, str(root / "split_copy"), roots["dpo-data"])
    whole = metric_rows(root / "whole", kinds=("step",))
    assert [r["step"] for r in whole] == [0, 1]  # the 2 steps (the checkpoint after the first)
    exported = load_file(str(root / "whole" / "model.safetensors"))
    for resumed in ("split", "split_copy"):
        rows = metric_rows(root / resumed, kinds=("step",))
        assert len(rows) == len(whole), resumed
        for got, expected in zip(rows, whole):
            assert_close_dicts(got, expected, f"{resumed} metrics.jsonl")
        assert_close_dicts(load_file(str(root / resumed / "model.safetensors")), exported, resumed)


def test_stages_without_data_parallelism_refuse_a_multi_process_launch(monkeypatch, capsys):
    from rlhf.cli import main

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["report", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "rlhf report (rank 0 of 2): rlhf report runs in one process, but torchrun started 2"
    )


@pytest.fixture(scope="module")
def sampled_on_two_ranks() -> dict[str, list[list[dict]]]:
    """Every sampling case on 2 ranks, in one spawned job: {case: [rank 0's rollouts, rank 1's]}."""
    from tests.support.dist_cases import SAMPLING_CASES, sample_batches

    per_rank = run_ranks(each_case, sample_batches, [(case,) for case in SAMPLING_CASES])
    return {case: [results[i] for results in per_rank] for i, case in enumerate(SAMPLING_CASES)}


@pytest.mark.parametrize("case", ["plain", "paper", "keep-finished-rows"])
@pytest.mark.slow
def test_two_ranks_sampling_their_shares_draw_the_one_process_tokens(case, sampled_on_two_ranks):
    from tests.support.dist_cases import sample_batches

    one = sample_batches(case)  # the whole batch in this process, three rollouts from one generator
    ranks = sampled_on_two_ranks[case]
    for rank, rollouts in enumerate(ranks):
        for b, (got, expected) in enumerate(zip(rollouts, one)):
            what = f"rank {rank} rollout {b}"
            for key in ("input_ids", "attention_mask", "ended_with_eos"):
                assert torch.equal(got[key], expected[key]), f"{what}: {key}"
            torch.testing.assert_close(got["logprobs"], expected["logprobs"], atol=1e-5, rtol=0, msg=what)
            assert got["steps"] == expected["steps"], what
    # the case covers what the join must get right: shares ending at different decode steps (the
    # generator catches up), rows ending at different steps, and the early exit before max_new_tokens
    local = [[r["local_steps"] for r in rollouts] for rollouts in ranks]
    assert local[0] != local[1], local
    lengths = [int(n) for r in one for n in r["attention_mask"].sum(-1)]
    assert len(set(lengths)) > 2
    assert any(r["steps"] < 12 for r in one) and any(bool(r["ended_with_eos"].all()) for r in one)


@pytest.mark.slow
def test_every_rank_stops_when_rank_0_refuses_a_resume_or_finds_the_run_directory_taken(tmp_path):
    from rlhf.rundir.lock import run_dir_lock
    from tests.support.dist_cases import rank0_verdicts

    busy = tmp_path / "busy"
    with run_dir_lock(busy):  # this process holds it: rank 0's writer_lock is refused
        rank_0, rank_1 = run_ranks(rank0_verdicts, str(busy), collective_timeout=30.0)
    assert rank_0[0] == ("ran", 42) and rank_1[0] == ("ran", None)  # the result is rank 0's
    refused = "model.reward_model: rm/model.safetensors changed. Fix: --resume-allow-changed-models"
    assert rank_0[1] == rank_1[1] == ("ConfigError", refused)  # the same message on every rank
    assert rank_0[2] == ("KeyError", "'a bug'")
    assert rank_1[2][0] == "RuntimeError" and "rank 0 stopped ('a bug')" in rank_1[2][1]
    assert rank_0[3][0] == "RunDirInUse" and f"run directory {busy} is in use" in rank_0[3][1]
    assert rank_1[3] == ("ConfigError", rank_0[3][1])
