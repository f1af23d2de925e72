"""`rlhf plan` (rlhf/runtime/memory_plan.py): parameter counts against real models, role bytes
against closed forms, sharding divides by the ranks, the verdict and its advice, the command's
JSON, and the prediction against the GPU peaks measured on an H200 (within 15%)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, LlamaConfig

from rlhf.cli import main
from rlhf.models.lora import apply_lora
from rlhf.runtime.memory_plan import GIB, NAMED_SHAPES, Job, Shape, parse_bytes, plan, shape_of

TINY = Shape("tiny", hidden=16, layers=3, heads=4, kv_heads=2, intermediate=24, vocab=50)
MEASURED = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu_h200_session10.json"


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
    """`--preset sft|rm|dpo`: the trained model (DPO: and the reference copy, none for LoRA), no
    rollout phase; a pair is two rows of activations; fsdp2 divides every role by the ranks."""
    p, scalar, layer = TINY.parameters, TINY.parameters + TINY.hidden + 1, TINY.layer_parameters
    tokens = 512 + 512
    per_token = 10 * TINY.hidden + 4 * TINY.intermediate  # ACTIVATION_H h + ACTIVATION_M m
    for stage, roles, rows in (
        ("sft", {"policy": (p, p)}, 2),
        ("rm", {"reward_model": (scalar, scalar)}, 4),
        ("dpo", {"policy": (p, p), "reference": (p, 0)}, 4),
    ):
        result = plan(Job(TINY, stage=stage, dtype="float32", strategy="fsdp2", ranks=2, micro_batch=2))
        assert {r.role: (r.parameters, r.trained) for r in result.roles} == roles, stage
        for r in result.roles:  # float32: 4 bytes a parameter, half on each rank
            assert r.weights == 4 * -(-r.parameters // 2) and r.optimizer == 8 * -(-r.trained // 2), stage
        assert list(result.phases) == ["forward", "update"], stage
        assert result.extras["forward/update: gathered parameters"] == 2 * layer * 4
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


def test_the_verdict_and_its_advice():
    too_big = plan(Job(NAMED_SHAPES["7b"], strategy="ddp", ranks=8, gpu_memory=80 * GIB))
    assert not too_big.fits and too_big.per_rank_peak_bytes > 80 * GIB
    assert any("fsdp2" in line and "(fits)" in line for line in too_big.advice)
    ok = plan(Job(NAMED_SHAPES["7b"], strategy="fsdp2", ranks=8, gpu_memory=80 * GIB))
    assert ok.fits and ok.advice == [] and ok.per_rank_peak_bytes == max(ok.phases.values())
    assert plan(Job(NAMED_SHAPES["70b"], strategy="fsdp2", ranks=8, gpu_memory=80 * GIB)).fits is False


@pytest.mark.parametrize("workload,shape", [("m84", "m84"), ("smollm2", "smollm2-135m")])
def test_prediction_is_within_15_percent_of_the_measured_gpu_peak(workload, shape):
    """bench/gpu_memory.py on an H200 (torch.cuda.max_memory_allocated over a PPO-max iteration)."""
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


SHARDED = Path(__file__).resolve().parents[2] / "bench" / "results" / "dist_memory_m84.json"


def test_prediction_is_within_15_percent_of_the_measured_two_rank_fsdp2_peak():
    """2 CPU ranks under fsdp2 on the 84M workload (bench/dist_memory.py, glibc returning freed
    blocks so the resident set follows the live tensors): the largest rank's peak above the
    interpreter against the plan of per-layer sharding at 2 ranks, float32."""
    cases = json.loads(SHARDED.read_text())["live_malloc"]["cases"]
    measured = next(c for c in cases if c["strategy"] == "fsdp2" and c["ranks"] == 2)
    job = Job(NAMED_SHAPES["m84"], strategy="fsdp2", ranks=2, dtype="float32", micro_batch=4, rollout_rows=8,
              prompt_tokens=16, response_tokens=8)  # fmt: skip
    predicted = plan(job).per_rank_peak_bytes / 2**20
    assert predicted == pytest.approx(measured["largest_rank_peak_above_interpreter_mib"], rel=0.15)


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
