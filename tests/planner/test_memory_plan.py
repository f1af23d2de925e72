"""`rlhf plan` (rlhf/planner/memory_plan.py): parameter counts against real models, role bytes
against closed forms, sharding divides by the ranks, the verdict and its advice, the command's
JSON, and the prediction against the GPU peaks measured on an H200 (within 15%)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, LlamaConfig

from rlhf.cli import main
from rlhf.models.lora import apply_lora
from rlhf.planner.memory_plan import GIB, NAMED_SHAPES, Job, Shape, parse_bytes, plan, shape_of

TINY = Shape("tiny", hidden=16, layers=3, heads=4, kv_heads=2, intermediate=24, vocab=50)
MEASURED = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu_check_h200.json"


def hf_model(shape: Shape):
    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        tie_word_embeddings=shape.tied_embeddings,
    )
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_count_equals_a_real_models(tied, tmp_path):
    shape = Shape(**{**TINY.__dict__, "tied_embeddings": tied})
    model = hf_model(shape)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    model.config.save_pretrained(tmp_path)  # read back from a directory's config.json
    assert shape_of(str(tmp_path)).parameters == shape.parameters


def test_lora_count_equals_pefts_trainable_parameters():
    model = apply_lora(hf_model(TINY), r=4)  # the library's default targets (q_proj, v_proj)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result = plan(Job(TINY, lora=True, lora_rank=4, strategy="none", ranks=1))
    assert result.roles[0].trained == trainable


def test_role_bytes_are_the_closed_forms_in_one_process():
    p = TINY.parameters
    scalar = p + TINY.hidden + 1  # a causal LM with a scalar head
    result = plan(Job(TINY, dtype="bfloat16", strategy="none", ranks=1))  # float32 master weights
    roles = {r.role: r for r in result.roles}
    assert list(roles) == ["policy", "reference", "critic", "reward_model"]
    assert (roles["policy"].weights, roles["policy"].gradients, roles["policy"].optimizer) == (
        4 * p,
        4 * p,
        8 * p,
    )
    assert (roles["critic"].weights, roles["critic"].optimizer) == (4 * scalar, 8 * scalar)
    assert (roles["reference"].weights, roles["reward_model"].weights) == (4 * p, 4 * scalar)
    pure = {r.role: r for r in plan(Job(TINY, dtype="bfloat16-pure", strategy="none", ranks=1)).roles}
    assert pure["policy"].optimizer == 4 * p and pure["reference"].weights == 2 * p
    # critic-free and shared-critic presets hold no critic; a LoRA policy no reference copy
    assert [r.role for r in plan(Job(TINY, critic="none", ranks=1)).roles] == [
        "policy",
        "reference",
        "reward_model",
    ]
    assert "reference" not in [r.role for r in plan(Job(TINY, lora=True, ranks=1)).roles]


def test_per_layer_sharding_divides_every_role_and_ddp_none():
    one = {r.role: r for r in plan(Job(NAMED_SHAPES["7b"], strategy="none", ranks=1)).roles}
    layer = {r.role: r for r in plan(Job(NAMED_SHAPES["7b"], strategy="fsdp2", ranks=8)).roles}
    ddp = {r.role: r for r in plan(Job(NAMED_SHAPES["7b"], strategy="ddp", ranks=8)).roles}
    for role, whole in one.items():
        assert layer[role].weights == pytest.approx(whole.weights / 8, rel=1e-6)
        assert layer[role].optimizer == pytest.approx(whole.optimizer / 8, rel=1e-6)
        assert (ddp[role].weights, ddp[role].optimizer) == (whole.weights, whole.optimizer)


def test_the_supervised_stages_roles_and_phases_are_the_closed_forms():
    """`--preset sft|rm|dpo|simpo`: the trained model (DPO: and the reference copy, none for LoRA;
    SimPO: none ever), no rollout phase; a pair is two rows of activations; fsdp2 divides every role
    by the ranks."""
    p, scalar, layer = TINY.parameters, TINY.parameters + TINY.hidden + 1, TINY.layer_parameters
    tokens = 512 + 512
    per_token = 10 * TINY.hidden + 4 * TINY.intermediate  # ACTIVATION_H h + ACTIVATION_M m
    for stage, roles, rows in (
        ("sft", {"policy": (p, p)}, 2),
        ("rm", {"reward_model": (scalar, scalar)}, 4),
        ("dpo", {"policy": (p, p), "reference": (p, 0)}, 4),
        ("simpo", {"policy": (p, p)}, 4),
    ):
        result = plan(Job(TINY, stage=stage, dtype="float32", strategy="fsdp2", ranks=2, micro_batch=2))
        assert {r.role: (r.parameters, r.trained) for r in result.roles} == roles, stage
        for r in result.roles:  # float32: 4 bytes a parameter, half on each rank
            assert r.weights == 4 * -(-r.parameters // 2) and r.optimizer == 8 * -(-r.trained // 2), stage
        assert list(result.phases) == ["forward", "update"], stage
        # two decoder layers and the root unit (embeddings, output head, final norm), float32
        root = TINY.vocab * TINY.hidden * 2 + TINY.hidden
        assert result.extras["forward/update: gathered parameters"] == (2 * layer + root) * 4
        assert result.extras["update: saved activations"] == TINY.layers * rows * tokens * per_token * 4, (
            stage
        )
        resident = sum(r.weights + r.optimizer for r in result.roles)
        assert result.phases["update"] == resident + sum(
            result.extras[k]
            for k in (
                "forward/update: gathered parameters",
                "forward/update: logits chunk",
                "update: gradients of the largest role",
                "update: saved activations",
            )
        )
    assert "reference" not in [r.role for r in plan(Job(TINY, stage="dpo", lora=True, ranks=1)).roles]
    lora_simpo = plan(Job(TINY, stage="simpo", lora=True, ranks=1))
    assert [r.role for r in lora_simpo.roles] == ["policy"]


def test_the_verdict_and_its_advice():
    too_big = plan(Job(NAMED_SHAPES["7b"], strategy="ddp", ranks=8, gpu_memory=80 * GIB))
    assert not too_big.fits and too_big.per_rank_peak_bytes > 80 * GIB
    assert any("fsdp2" in line and "(fits)" in line for line in too_big.advice)
    ok = plan(Job(NAMED_SHAPES["7b"], strategy="fsdp2", ranks=8, gpu_memory=80 * GIB))
    assert ok.fits and ok.advice == [] and ok.per_rank_peak_bytes == max(ok.phases.values())
    assert plan(Job(NAMED_SHAPES["70b"], strategy="fsdp2", ranks=8, gpu_memory=80 * GIB)).fits is False


@pytest.mark.parametrize("workload,shape", [("m84", "m84"), ("smollm2", "smollm2-135m")])
def test_prediction_is_within_15_percent_of_the_measured_gpu_peak(workload, shape):
    """bench/memory/gpu_memory.py on an H200 (torch.cuda.max_memory_allocated over a PPO-max iteration)."""
    measured = next(
        r
        for r in json.loads(MEASURED.read_text())["gpu_memory"]
        if r["workload"] == workload and r["dtype"] == "bfloat16"
    )
    rollout = measured["rollout"]
    job = Job(
        NAMED_SHAPES[shape],
        dtype="bfloat16",
        strategy="none",
        ranks=1,
        micro_batch=rollout["micro_batch"],
        rollout_rows=rollout["prompts"],
        prompt_tokens=16,  # bench prompts: 8 to 16 words, one token each
        response_tokens=rollout["response_tokens"],
    )
    predicted = plan(job).per_rank_peak_bytes / 2**20
    assert predicted == pytest.approx(measured["peak_allocated_mb"], rel=0.15)


def test_parse_bytes():
    assert parse_bytes("80GB") == parse_bytes("80GiB") == 80 * GIB
    assert parse_bytes("512MiB") == 512 * 2**20 and parse_bytes("1024") == 1024


def test_the_command_prints_json_and_refuses_bad_input(capsys):
    assert (
        main(
            ["plan", "--model", "7b", "--preset", "ppo_max", "--gpus", "8", "--gpu-memory", "80GB", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out["per_rank_peak_bytes"], int) and out["fits"] is True
    assert main(["plan", "--model", "7b", "--strategy", "ddp", "--gpus", "8"]) == 0
    assert "does not fit" in capsys.readouterr().out
    assert main(["plan", "--model", "7b", "--preset", "dpo", "--gpus", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job"]["stage"] == "dpo" and [r["role"] for r in out["roles"]] == ["policy", "reference"]
    assert (
        main(["plan", "--model", "7b", "--strategy", "fsdp2-whole"]) == 2
    )  # gone: sft/rm/dpo shard per layer
    assert main(["plan", "--model", "no-such-shape"]) == 2
    assert "Fix:" in capsys.readouterr().err
    assert main(["plan", "--model", "7b", "--dtype", "fp8"]) == 2


RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
# bench/memory/dist_memory.py on this machine's CPU (float32, glibc returning freed blocks): (results file,
# named shape, prompt tokens, strategy, ranks); one process steps the policy and critic side by side
CPU_CASES = [
    ("dist_memory_m84.json", "m84", 16, "none", 1),
    ("dist_memory_m84.json", "m84", 16, "fsdp2", 2),
    ("dist_memory_smollm2.json", "smollm2-135m", None, "none", 1),  # SmolLM2-135M's own files
    ("dist_memory_smollm2.json", "smollm2-135m", None, "fsdp2", 1),  # torchrun at 1 rank: one process
    ("dist_memory_smollm2.json", "smollm2-135m", None, "fsdp2", 2),
]


@pytest.mark.parametrize("results,shape,prompt_tokens,strategy,ranks", CPU_CASES)
def test_prediction_is_within_15_percent_of_the_measured_cpu_peak(
    results, shape, prompt_tokens, strategy, ranks
):
    """PPO-max, one iteration of 8 rollouts x 8 tokens, micro-batch 4, on the CPU at 1 and 2 ranks
    (bench/memory/dist_memory.py): the largest rank's peak resident memory above the interpreter against
    the plan, float32 (one process: the critic's step beside the policy's, `overlap_critic`)."""
    measured_run = json.loads((RESULTS / results).read_text())["live_malloc"]
    measured = next(c for c in measured_run["cases"] if (c["strategy"], c["ranks"]) == (strategy, ranks))
    job = Job(NAMED_SHAPES[shape], strategy=strategy, ranks=ranks, dtype="float32", micro_batch=4,
              rollout_rows=8, prompt_tokens=prompt_tokens or measured_run["prompt_tokens"], response_tokens=8,
              overlap_critic=ranks == 1)  # fmt: skip
    predicted = plan(job).per_rank_peak_bytes / 2**20
    assert predicted == pytest.approx(measured["largest_rank_peak_above_interpreter_mib"], rel=0.15)


def test_one_process_on_a_cpu_holds_the_critics_gradients_and_activations_beside_the_policys():
    """--overlap-critic (runtime.overlap_critic, one process on a CPU): the update adds the critic's
    gradients (float32: 4 bytes per parameter of the LM with its scalar head) and a second micro-
    batch's saved activations; nothing without a separate critic, refused under a strategy."""
    job = {"shape": TINY, "dtype": "float32", "strategy": "none", "ranks": 1, "micro_batch": 2}
    alone, beside = plan(Job(**job)), plan(Job(**job, overlap_critic=True))
    activations = TINY.layers * 2 * (512 + 512) * (10 * TINY.hidden + 4 * TINY.intermediate) * 4
    critic_gradients = 4 * (TINY.parameters + TINY.hidden + 1)
    assert beside.phases["update"] == alone.phases["update"] + critic_gradients + activations
    assert beside.phases["rollout"] == alone.phases["rollout"]
    free = plan(Job(**job, critic="none", overlap_critic=True))
    assert free.phases == plan(Job(**job, critic="none")).phases
    with pytest.raises(ValueError, match="--overlap-critic"):
        plan(Job(**{**job, "strategy": "fsdp2", "ranks": 2}, overlap_critic=True))


def test_one_rank_of_any_strategy_is_the_one_process_run():
    """torchrun at world size 1 runs the local runtime: fsdp2 (with offload, a per-layer rollout) or
    ddp on 1 rank plan as --strategy none (no gathered policy or layers, nothing offloaded)."""
    none = plan(Job(TINY, strategy="none", ranks=1))
    for change in (
        {"strategy": "ddp"},
        {"strategy": "fsdp2", "offload": True, "rollout_gather": "per_layer"},
    ):
        one = plan(Job(TINY, ranks=1, **change))
        assert one.phases == none.phases and one.extras == none.extras and one.host_bytes_per_rank == 0
        assert one.job["strategy"] == "none"
    assert plan(Job(TINY, strategy="fsdp2", ranks=2)).extras["rollout: gathered policy"] > 0


def test_offload_moves_the_resident_shards_to_cpu_memory():
    """--offload: the sharded weights, AdamW state and gradients leave the GPU's count (whole, to
    the byte) and are reported as host memory; the phases' transients stay."""
    on_gpu = plan(Job(NAMED_SHAPES["7b"], strategy="fsdp2", ranks=8))
    offloaded = plan(Job(NAMED_SHAPES["7b"], strategy="fsdp2", ranks=8, offload=True))
    resident = sum(r.weights + r.optimizer for r in on_gpu.roles)
    gradients = on_gpu.extras["update: gradients of the largest role"]
    assert offloaded.host_bytes_per_rank == resident + gradients
    assert offloaded.phases["update"] == on_gpu.phases["update"] - resident - gradients
    assert offloaded.phases["rollout"] == on_gpu.phases["rollout"] - resident
    with pytest.raises(ValueError, match="--offload needs --strategy fsdp2"):
        plan(Job(NAMED_SHAPES["7b"], strategy="ddp", ranks=8, offload=True))
    for stage in ("sft", "rm", "dpo"):  # the supervised stages offload as `rlhf train` does
        job = {"shape": NAMED_SHAPES["7b"], "stage": stage, "strategy": "fsdp2", "ranks": 8}
        on_gpu, offloaded = plan(Job(**job)), plan(Job(**job, offload=True))
        resident = sum(r.weights + r.optimizer for r in on_gpu.roles)
        gradients = on_gpu.extras["update: gradients of the largest role"]
        assert offloaded.host_bytes_per_rank == resident + gradients, stage
        assert offloaded.phases["update"] == on_gpu.phases["update"] - resident - gradients, stage


def test_per_layer_rollout_holds_one_layer_and_the_root_unit_instead_of_the_whole_policy():
    """--rollout-gather per_layer (`dist.rollout_gather`): the rollout's gathered policy is one
    decoder layer (twice: its all-gather buffer and the parameters copied out of it) and the root
    unit (embeddings, final norm) in the compute dtype, not the whole policy; nothing else changes."""
    for tied in (False, True):
        shape = Shape(**{**TINY.__dict__, "tied_embeddings": tied})
        whole = plan(Job(shape, dtype="bfloat16", strategy="fsdp2", ranks=2))
        per_layer = plan(Job(shape, dtype="bfloat16", strategy="fsdp2", ranks=2, rollout_gather="per_layer"))
        root = shape.vocab * shape.hidden * (1 if tied else 2) + shape.hidden
        assert whole.extras["rollout: gathered policy"] == 2 * shape.parameters  # bf16
        assert per_layer.extras["rollout: gathered policy"] == 2 * (2 * shape.layer_parameters + root)
        assert shape.parameters == shape.layers * shape.layer_parameters + root
        saved = 2 * (shape.layers - 2) * shape.layer_parameters
        assert per_layer.phases["rollout"] == whole.phases["rollout"] - saved
        assert {k: v for k, v in per_layer.phases.items() if k != "rollout"} == {
            k: v for k, v in whole.phases.items() if k != "rollout"
        }
    with pytest.raises(ValueError, match="--rollout-gather per_layer needs --strategy fsdp2"):
        plan(Job(TINY, strategy="ddp", ranks=2, rollout_gather="per_layer"))
    with pytest.raises(ValueError, match="whole or per_layer"):
        plan(Job(TINY, ranks=2, rollout_gather="per-token"))


def test_the_verdict_names_the_per_layer_rollout_first_when_the_whole_policy_is_what_does_not_fit(capsys):
    job = dict(strategy="fsdp2", ranks=32, gpu_memory=80 * GIB, gradient_checkpointing=True)
    too_big = plan(Job(NAMED_SHAPES["70b"], **job))
    assert not too_big.fits and too_big.peak_phase == "rollout"
    assert too_big.advice[0].startswith("--rollout-gather per_layer") and "(fits)" in too_big.advice[0]
    assert "is what does not fit" in too_big.advice[0]
    assert plan(Job(NAMED_SHAPES["70b"], **job, rollout_gather="per_layer")).fits
    # where it is not enough alone (70B on 8 GPUs), it is one remedy among the others, ranked by peak
    eight = plan(Job(NAMED_SHAPES["70b"], strategy="fsdp2", ranks=8, gpu_memory=80 * GIB))
    assert not any("is what does not fit" in line for line in eight.advice)
    args = ["plan", "--model", "70b", "--nodes", "4", "--gpus", "8", "--gradient-checkpointing"]
    assert main(args) == 0
    assert "try --rollout-gather per_layer" in capsys.readouterr().out
    assert main([*args, "--rollout-gather", "per_layer"]) == 0
    out = capsys.readouterr().out
    assert "(rollout gathered per layer)" in out and out.rstrip().splitlines()[-1].startswith("fits")
    assert main([*args, "--rollout-gather", "per_layer", "--strategy", "ddp"]) == 2


@pytest.mark.parametrize("preset", ["gspo", "cispo"])
def test_the_critic_free_new_presets_plan_no_critic(preset, capsys):
    assert main(["plan", "--model", "7b", "--preset", preset, "--gpus", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job"]["critic"] == "none"
    assert [r["role"] for r in out["roles"]] == ["policy", "reference", "reward_model"]


def test_a_sequence_longer_than_the_models_positions_is_refused_naming_both(tmp_path, capsys):
    from rlhf.cli import main

    config = hf_model(TINY).config
    config.max_position_embeddings = 64
    config.save_pretrained(tmp_path)
    assert shape_of(str(tmp_path)).positions == 64 and NAMED_SHAPES["7b"].positions == 4096
    assert main(["plan", "--model", str(tmp_path), "--prompt-tokens", "40", "--response-tokens", "24"]) == 0
    capsys.readouterr()
    assert main(["plan", "--model", str(tmp_path), "--prompt-tokens", "40", "--response-tokens", "25"]) == 2
    err = capsys.readouterr().err
    assert "--prompt-tokens 40 + --response-tokens 25 = 65" in err and "64 positions" in err and "Fix:" in err
    assert main(["plan", "--model", "7b", "--prompt-tokens", "4000", "--response-tokens", "512"]) == 2
    assert "4096 positions" in capsys.readouterr().err
