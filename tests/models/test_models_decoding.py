"""The sampler's decode engines (rlhf/models/decoding.py): the static-cache engine draws the rollout
of the eager one (same tokens, masks and behaviour log-probs at the same seed) on CPU, for every
sampling setting, left-padded prompts of different lengths, rows that end early, a batch of one,
stop tokens, lockstep and a LoRA policy. The CUDA-graph engine: tests/gpu/test_gpu_sampler_engines.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import StaticCache

from rlhf.models.decoding import (
    AUTO_CPU_ENGINE,
    CudaGraphSteps,
    OneDtypeStaticCache,
    StaticSteps,
    resolve_engine,
)
from rlhf.models.sampling import SamplingConfig, generate
from tests.support.models_testing import left_pad

EOS, PAD = 3, 0
MIXED_PROMPTS = [[4 + (3 * i + j) % 40 for j in range(1 + i % 5)] for i in range(12)]

CONFIGS = [
    SamplingConfig(max_new_tokens=24, temperature=1.0),
    SamplingConfig(max_new_tokens=24, temperature=0.7),
    SamplingConfig(max_new_tokens=24, temperature=1.3, top_k=7),
    SamplingConfig(max_new_tokens=24, temperature=1.1, top_p=0.8),
    SamplingConfig(max_new_tokens=24, temperature=1.3, top_p=0.8, top_k=9, repetition_penalty=1.2),
    SamplingConfig.ppo_paper(max_new_tokens=24),
    SamplingConfig(max_new_tokens=24, do_sample=False, repetition_penalty=1.3),
    SamplingConfig(max_new_tokens=24, temperature=0.9, stop_at_eos=False),
]
CONFIG_IDS = ["t1", "t0.7", "top-k", "top-p", "filters-and-penalty", "paper", "greedy", "no-eos"]


def run(lm, prompts, config, engine, seed=11, **options):
    ids, mask = left_pad(prompts, PAD)
    return generate(
        lm,
        ids,
        mask,
        replace(config, engine=engine),
        options.pop("eos", EOS),
        PAD,
        torch.Generator().manual_seed(seed),
        return_logprobs=True,
        **options,
    )


def assert_same_rollout(a, b, atol=1e-5):
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.ended_with_eos, b.ended_with_eos)
    assert a.decode_steps == b.decode_steps
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=atol)


@pytest.mark.parametrize("drop", [True, False], ids=["drop", "keep"])
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_static_cache_draws_the_eager_rollout(lm, config, drop):
    with torch.no_grad():
        lm.lm_head.weight[EOS] += 0.6  # rows end at different steps
    config = replace(config, drop_finished_rows=drop)
    eager = run(lm, MIXED_PROMPTS, config, "eager")
    static = run(lm, MIXED_PROMPTS, config, "static")
    if config.stop_at_eos:
        lengths = eager.response_mask.sum(1)
        assert lengths.min() < lengths.max()  # mixed lengths: rows end early, some leave the batch
    assert_same_rollout(static, eager)


def test_static_cache_is_preallocated_with_fixed_shapes(lm, monkeypatch):
    """Every forward of the static engine sees the same cache, sized batch x (prompt + max_new),
    and an attention mask of that width; the prefill sees the prompt block."""
    shapes: list[tuple] = []
    caches: set[int] = set()

    def spy(_module, _args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        assert isinstance(cache, StaticCache)
        caches.add(id(cache))
        shapes.append((tuple(kwargs["input_ids"].shape), tuple(kwargs["attention_mask"].shape)))

    lm.model.register_forward_pre_hook(spy, with_kwargs=True)
    config = SamplingConfig(max_new_tokens=10, stop_at_eos=False)
    rollout = run(lm, MIXED_PROMPTS[:5], config, "static")
    width = rollout.prompt_length + 10
    assert len(caches) == 1 and len(shapes) == 10
    assert shapes[0] == ((5, rollout.prompt_length), (5, width))
    assert set(shapes[1:]) == {((5, 1), (5, width))}


@pytest.mark.parametrize("config", CONFIGS[:1] + CONFIGS[4:5] + CONFIGS[6:7], ids=["t1", "filters", "greedy"])
def test_static_cache_batch_of_one(lm, config):
    with torch.no_grad():
        lm.lm_head.weight[EOS] += 0.6
    for prompt in ([5, 6, 7, 8, 9], [10]):
        assert_same_rollout(run(lm, [prompt], config, "static"), run(lm, [prompt], config, "eager"))


def test_static_cache_several_stop_tokens_and_all_rows_ending_early(lm):
    with torch.no_grad():
        lm.lm_head.weight[EOS] += 3.0
        lm.lm_head.weight[17] += 1.5
    config = SamplingConfig(max_new_tokens=30, temperature=1.2)
    eager = run(lm, MIXED_PROMPTS, config, "eager", eos=[EOS, 17])
    static = run(lm, MIXED_PROMPTS, config, "static", eos=[EOS, 17])
    assert eager.response_ids.shape[1] < 30 and bool(eager.ended_with_eos.all())  # the early exit
    assert_same_rollout(static, eager)


def test_static_cache_in_lockstep_steps_on_with_the_same_rollout(lm):
    """`all_ranks_done` (per-layer FSDP2 rollouts): the static engine also steps on until every
    rank has ended, one ended row left in its batch, with the rollout of the engine alone."""
    with torch.no_grad():
        lm.lm_head.weight[EOS] += 3.0
    config = SamplingConfig(max_new_tokens=30, temperature=1.2, repetition_penalty=1.2)
    alone = run(lm, MIXED_PROMPTS, config, "static", seed=5)
    longest = int(alone.response_lengths.max())
    asked: list[bool] = []

    def all_ranks_done(mine: bool) -> bool:
        asked.append(mine)
        return len(asked) == longest + 5

    stepped = run(lm, MIXED_PROMPTS, config, "static", seed=5, all_ranks_done=all_ranks_done)
    assert stepped.decode_steps == longest + 5
    assert torch.equal(stepped.input_ids, alone.input_ids)
    assert torch.equal(stepped.attention_mask, alone.attention_mask)
    assert_same_rollout(run(lm, MIXED_PROMPTS, config, "eager", seed=5), alone)


def test_static_cache_with_a_lora_policy(lm):
    from peft import LoraConfig, get_peft_model

    from rlhf.models.backbone import peft_wrapping

    with peft_wrapping():
        policy = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a trained adapter: B != 0
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    config = SamplingConfig(max_new_tokens=16, temperature=1.1, top_p=0.9)
    assert_same_rollout(
        run(policy, MIXED_PROMPTS, config, "static"), run(policy, MIXED_PROMPTS, config, "eager")
    )
    with policy.disable_adapter():  # the reference's rollout: the base model's
        assert_same_rollout(
            run(policy, MIXED_PROMPTS, config, "static"), run(lm, MIXED_PROMPTS, config, "eager")
        )


def test_auto_engine_per_device_and_cuda_graph_refused_where_it_cannot_run(lm, monkeypatch):
    import collections

    from rlhf.models import decoding

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(decoding, "_auto_calls", collections.Counter())
    monkeypatch.setattr(decoding, "_auto_compile_failed", False)
    long_call = (8, 40, decoding.MIN_COMPILE_FORWARDS)  # rows, columns, decode forwards
    assert resolve_engine("auto", cpu, lm, False, long_call) == AUTO_CPU_ENGINE
    monkeypatch.setattr(decoding.importlib.util, "find_spec", lambda name: object())  # triton is here

    def on_cuda(shape):
        return resolve_engine("auto", cuda, lm, False, shape)

    # a long call compiles once its shape repeats: the graph for the first COMPILE_AFTER_CALLS calls
    assert [on_cuda(long_call) for _ in range(decoding.COMPILE_AFTER_CALLS + 2)] == ["cuda_graph"] * (
        decoding.COMPILE_AFTER_CALLS
    ) + ["compiled"] * 2
    assert on_cuda((8, 63, decoding.MIN_COMPILE_FORWARDS)) == "compiled"  # the same column bucket
    assert on_cuda((8, 70, decoding.MIN_COMPILE_FORWARDS)) == "cuda_graph"  # another bucket: counted anew
    assert on_cuda((4, 40, decoding.MIN_COMPILE_FORWARDS)) == "cuda_graph"  # other rows too
    short_call = (8, 40, decoding.MIN_COMPILE_FORWARDS - 1)
    assert {on_cuda(short_call) for _ in range(4)} == {"cuda_graph"}  # never compiled
    monkeypatch.setattr(decoding, "_auto_compile_failed", True)  # a compile of this process failed
    assert on_cuda(long_call) == "cuda_graph"
    monkeypatch.setattr(decoding, "_auto_compile_failed", False)
    monkeypatch.setattr(decoding.importlib.util, "find_spec", lambda name: None)  # no triton
    assert on_cuda(long_call) == "cuda_graph"
    assert resolve_engine("auto", cuda, lm, lockstep=True) == "static"  # collectives in every step
    assert resolve_engine("static", cpu, lm, lockstep=True) == "static"
    with pytest.raises(ValueError, match="not a CUDA GPU.*--rollout.engine static"):
        resolve_engine("cuda_graph", cpu, lm, lockstep=False)
    with pytest.raises(ValueError, match="lockstep"):
        resolve_engine("cuda_graph", cuda, lm, lockstep=True)
    with pytest.raises(ValueError, match="SamplingConfig.engine"):
        SamplingConfig(engine="graph")
    ids, mask = left_pad(MIXED_PROMPTS[:2], PAD)
    with pytest.raises(ValueError, match="cuda_graph cannot run here"):
        generate(lm, ids, mask, SamplingConfig(max_new_tokens=4, engine="cuda_graph"), EOS, PAD)


def test_the_graph_engine_keeps_its_rows_and_the_static_one_drops_them():
    assert StaticSteps.can_drop_rows and not CudaGraphSteps.can_drop_rows


def test_the_rollout_config_offers_the_engines_the_sampler_runs():
    import typing

    from rlhf.config.rollout import RolloutConfig
    from rlhf.models.decoding import ENGINES, Engine

    field = typing.get_type_hints(RolloutConfig)["engine"]
    assert typing.get_args(field) == typing.get_args(Engine) == ENGINES
    assert RolloutConfig().engine == SamplingConfig().engine == "auto"


def test_an_rl_run_samples_with_rollout_engine():
    from rlhf.config import RLConfig, load_config
    from rlhf.rl.roles.assemble import rollout_sampling_config

    config = load_config(RLConfig, overrides={"rollout": {"engine": "static"}})
    assert rollout_sampling_config(config).engine == "static"
    assert rollout_sampling_config(load_config(RLConfig)).engine == "auto"


def test_the_static_cache_takes_float32_keys_and_bf16_values_in_one_dtype(lm):
    """Under bf16 autocast over float32 weights RoPE leaves the keys in float32 and the values in bf16;
    transformers 5.17 allocates both buffers in the keys' dtype and refuses the values (seen on an
    H200). The values are promoted exactly, so attention (which casts under autocast) reads
    what the eager cache holds."""
    cache = OneDtypeStaticCache(config=lm.config, max_cache_len=6)
    heads, dim = lm.config.num_key_value_heads, lm.config.hidden_size // lm.config.num_attention_heads
    keys = torch.randn(2, heads, 3, dim)
    values = torch.randn(2, heads, 3, dim).to(torch.bfloat16)
    stored_keys, stored_values = cache.update(keys, values, 0)
    assert stored_keys.dtype == stored_values.dtype == torch.float32
    assert torch.equal(stored_keys[:, :, :3], keys)
    assert torch.equal(stored_values[:, :, :3], values.float())
    assert not stored_values[:, :, 3:].any()  # the columns not yet written


# -- the compiled engine ----------------------------------------------------------------------------


def counting_compile(monkeypatch) -> list:
    """`compiled_decode_step` compiled by a backend that counts its graphs and runs them eagerly (no
    inductor: fast), one fresh wrapper for the test. Returns the list of graphs compiled."""
    from rlhf.models import decoding

    graphs: list = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()  # the recompile limit counts every earlier compile of `_decode_step` here
    compiled = torch.compile(decoding._decode_step, backend=backend, dynamic=False)
    monkeypatch.setattr(decoding, "compiled_decode_step", lambda: compiled)
    return graphs


@pytest.mark.parametrize("config", CONFIGS[:2] + CONFIGS[5:6], ids=["t1", "t0.7", "paper"])
def test_compiled_engine_draws_the_static_rollout_and_compiles_once_per_bucket(lm, config, monkeypatch):
    """The compiled engine's step is the static engine's step traced by dynamo: the same rollout.
    Prompt widths in one column bucket (prompt + max_new rounded up to COLUMN_BUCKET) share one
    compiled step; a second call compiles nothing."""
    from rlhf.models.decoding import COLUMN_BUCKET

    graphs = counting_compile(monkeypatch)
    with torch.no_grad():
        lm.lm_head.weight[EOS] += 0.6  # rows end at different steps
    for prompts in (MIXED_PROMPTS, MIXED_PROMPTS[:11] + [[5, 6, 7]], [p + [9] for p in MIXED_PROMPTS]):
        assert_same_rollout(run(lm, prompts, config, "compiled"), run(lm, prompts, config, "static"))
    assert len(graphs) == 1, [g.code for g in graphs]
    widths = {max(map(len, p)) + config.max_new_tokens for p in (MIXED_PROMPTS, [[1] * 6])}
    assert len({-(-w // COLUMN_BUCKET) for w in widths}) == 1  # the widths above share one bucket


def test_compiled_engine_pads_its_mask_to_the_bucket_and_keeps_its_rows(lm, monkeypatch):
    from rlhf.models.decoding import COLUMN_BUCKET, CompiledSteps

    counting_compile(monkeypatch)
    seen = []
    original = CompiledSteps.step_mask
    monkeypatch.setattr(
        CompiledSteps, "step_mask", lambda self, *a: seen.append(a[0].shape) or original(self, *a)
    )
    rollout = run(lm, MIXED_PROMPTS, SamplingConfig(max_new_tokens=5), "compiled")
    assert {shape[1] for shape in seen} == {COLUMN_BUCKET}  # 5 prompt columns + 5 new, rounded up
    assert rollout.attention_mask.shape[1] == 5 + rollout.response_ids.shape[1]  # the rollout's own width
    assert not CompiledSteps.can_drop_rows


def test_compiled_engine_refused_in_lockstep(lm):
    cpu = torch.device("cpu")
    assert resolve_engine("compiled", cpu, lm, lockstep=False) == "compiled"
    with pytest.raises(ValueError, match="compiled cannot run here.*lockstep.*--rollout.engine static"):
        resolve_engine("compiled", cpu, lm, lockstep=True)


@pytest.mark.slow
def test_compiled_engine_with_inductor_on_the_cpu_draws_the_static_rollout(lm):
    """The real compile (inductor, C++ on the CPU): its fused kernels round differently from eager
    ones, so the log-probs agree to 1e-4 and, on this model, the tokens exactly."""
    config = SamplingConfig(max_new_tokens=12, temperature=0.9)
    compiled = run(lm, MIXED_PROMPTS[:6], config, "compiled")
    assert_same_rollout(compiled, run(lm, MIXED_PROMPTS[:6], config, "static"), atol=1e-4)
    # the policy trains between rollouts: the compiled step reads the weights as they are now (its
    # parameters are inputs of the compiled graph, not constants folded in at compile time)
    with torch.no_grad():
        for parameter in lm.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    after = run(lm, MIXED_PROMPTS[:6], config, "compiled")
    assert not torch.equal(after.input_ids, compiled.input_ids)
    assert_same_rollout(after, run(lm, MIXED_PROMPTS[:6], config, "static"), atol=1e-4)


def test_a_compile_that_fails_here_is_one_message_with_the_fix(lm, monkeypatch):
    from torch._dynamo.exc import BackendCompilerFailed

    from rlhf.models import decoding

    def fails(*args, **kwargs):
        raise BackendCompilerFailed(None, RuntimeError("no working C++ compiler found"), None)

    monkeypatch.setattr(decoding, "compiled_decode_step", lambda: fails)
    with pytest.raises(ValueError, match="could not compile.*C\\+\\+ compiler.*Fix: --rollout.engine static"):
        run(lm, MIXED_PROMPTS, SamplingConfig(max_new_tokens=6), "compiled")


def test_a_compile_auto_chose_that_fails_warns_and_decodes_with_the_graph_step(lm, monkeypatch):
    """`auto` picked the compile (on CUDA it does for long calls); its failure must not stop the run:
    one warning, the uncompiled step's rollout (the static engine's tokens), and `auto` takes the
    graph for the rest of the process."""
    from torch._dynamo.exc import BackendCompilerFailed

    from rlhf.models import decoding, sampling

    def fails(*args, **kwargs):
        raise BackendCompilerFailed(None, RuntimeError("triton not found"), None)

    monkeypatch.setattr(decoding, "compiled_decode_step", lambda: fails)
    monkeypatch.setattr(decoding, "_auto_compile_failed", False)
    resolve = sampling.resolve_engine
    monkeypatch.setattr(  # auto compiles, as on CUDA for a long call
        sampling,
        "resolve_engine",
        lambda engine, *a, **k: "compiled" if engine == "auto" else resolve(engine, *a, **k),
    )
    config = SamplingConfig(max_new_tokens=6, temperature=0.9)
    with pytest.warns(UserWarning, match="auto: torch.compile failed.*triton not found.*cuda_graph"):
        fallen_back = run(lm, MIXED_PROMPTS, config, "auto")
    assert decoding._auto_compile_failed
    assert_same_rollout(fallen_back, run(lm, MIXED_PROMPTS, config, "static"))


def test_a_new_compiled_shape_is_announced_once(lm, monkeypatch, capsys):
    from rlhf.models import decoding
    from rlhf.models.decoding import COLUMN_BUCKET

    counting_compile(monkeypatch)
    monkeypatch.setattr(decoding.CompiledSteps, "compiled_shapes", set())
    config = SamplingConfig(max_new_tokens=5)
    run(lm, MIXED_PROMPTS, config, "compiled")
    first = capsys.readouterr().err
    assert f"compiling the decode step for {len(MIXED_PROMPTS)} rows x {COLUMN_BUCKET} columns" in first
    assert "compiled the decode step (" in first
    run(lm, MIXED_PROMPTS, config, "compiled")  # the same shape: compiled already, nothing said
    assert "compiling" not in capsys.readouterr().err


def test_a_shape_past_dynamos_recompile_limit_decodes_uncompiled_and_says_so(lm, monkeypatch):
    """Past `torch._dynamo.config.recompile_limit` compiled shapes dynamo would run the step uncompiled
    without a word; the engine says so and draws the static rollout."""
    from rlhf.models import decoding

    if not decoding.RECOMPILE_LIMIT_HIT:
        pytest.skip("this torch has no FailOnRecompileLimitHit (dynamo falls back silently)")
    graphs = counting_compile(monkeypatch)
    config = SamplingConfig(max_new_tokens=5, temperature=0.9)
    with torch._dynamo.config.patch(recompile_limit=1):
        run(lm, MIXED_PROMPTS, config, "compiled")  # one shape: compiled
        with pytest.warns(UserWarning, match="recompile limit.*decodes uncompiled"):
            past_the_limit = run(lm, MIXED_PROMPTS[:3], config, "compiled")  # another batch size
    assert len(graphs) == 1
    assert_same_rollout(past_the_limit, run(lm, MIXED_PROMPTS[:3], config, "static"))
