"""On a CUDA GPU: the sampler's static and CUDA-graph decode engines (rlhf/models/decoding.py) draw the
eager engine's rollout (same tokens, masks and behaviour log-probs at the same seed), the graph is
captured once per call and replayed, and it follows the weights and the LoRA adapter of each call.

Skipped (with the reason shown by `pytest -ra`) on a machine without CUDA. Run them on a GPU machine
with `pytest tests/gpu -m gpu` (bench/speed/gpu_speed.sh runs them with the sampler's timings).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from rlhf.data.collate import left_pad
from rlhf.models.decoding import CudaGraphSteps
from rlhf.models.sampling import SamplingConfig, generate
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
    ),
]

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
CUDA = torch.device("cuda")
CONFIGS = [
    SamplingConfig(max_new_tokens=24, temperature=1.0),
    SamplingConfig(max_new_tokens=24, temperature=1.3, top_p=0.8, top_k=9, repetition_penalty=1.2),
    SamplingConfig.ppo_paper(max_new_tokens=24),
    SamplingConfig(max_new_tokens=24, do_sample=False, repetition_penalty=1.3),
    SamplingConfig(max_new_tokens=24, temperature=0.9, stop_at_eos=False),
]
CONFIG_IDS = ["t1", "filters-and-penalty", "paper", "greedy", "no-eos"]


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([" ".join(WORDS)])


@pytest.fixture()
def lm(tok):
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2)
    with torch.no_grad():  # rows end at different steps
        model.lm_head.weight[tok.eos_token_id] += 0.5
    return model.to(CUDA)


def prompt_batch(tok, rows: int = 10):
    prompts = [tok(" ".join(WORDS[i % 16 : i % 16 + 1 + i % 4]))["input_ids"] for i in range(rows)]
    return left_pad(prompts, tok.pad_token_id)


def sample(model, tok, config, engine, rows=10, seed=7):
    ids, mask = prompt_batch(tok, rows)
    return generate(
        model,
        ids,
        mask,
        replace(config, engine=engine),
        tok.eos_token_id,
        tok.pad_token_id,
        torch.Generator(CUDA).manual_seed(seed),
        return_logprobs=True,
    )


def assert_same_rollout(a, b, atol=1e-4, rtol=0.0):
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.ended_with_eos, b.ended_with_eos)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=rtol, atol=atol)


# bf16 log-probs of two kernel sets: bf16 keeps 8 bits of mantissa (a relative step of 0.4%), and
# fused kernels round their intermediates elsewhere than eager ones. An H200 showed
# 0.029 on a log-prob of -5.6 (1.3 steps) between compiled and static steps: atol 2e-2 plus 1%.
BF16 = dict(atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_static_and_graph_engines_draw_the_eager_rollout(lm, tok, config):
    eager = sample(lm, tok, config, "eager")
    if config.stop_at_eos:
        lengths = eager.response_mask.sum(1)
        assert lengths.min() < lengths.max()  # rows that end early
    assert_same_rollout(sample(lm, tok, config, "static"), eager)
    assert_same_rollout(sample(lm, tok, config, "cuda_graph"), eager)


def test_auto_is_the_graph_on_cuda(lm, tok, monkeypatch):
    captures: list[int] = []
    original = CudaGraphSteps._capture
    monkeypatch.setattr(
        CudaGraphSteps, "_capture", lambda self, mask: captures.append(1) or original(self, mask)
    )
    config = SamplingConfig(max_new_tokens=12, temperature=1.1)
    auto = sample(lm, tok, config, "auto")
    assert captures == [1]
    assert_same_rollout(auto, sample(lm, tok, config, "eager"))


def test_the_graph_is_captured_once_and_replayed(lm, tok, monkeypatch):
    """Python runs the decoder three times (prefill, warm-up step, capture); every later step is a
    replay of the graph."""
    forwards: list[int] = []
    lm.model.register_forward_hook(lambda *_: forwards.append(1))
    replays: list[int] = []
    original = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: replays.append(1) or original(self))
    config = SamplingConfig(max_new_tokens=20, stop_at_eos=False)
    rollout = sample(lm, tok, config, "cuda_graph")
    assert rollout.response_ids.shape[1] == 20
    assert len(forwards) == 3 and len(replays) == 20 - 2  # 19 decode forwards: a warm-up and 18 replays


def test_graph_batch_of_one_and_a_short_call(lm, tok):
    for config in (SamplingConfig(max_new_tokens=16, temperature=1.2), SamplingConfig(max_new_tokens=3)):
        assert_same_rollout(
            sample(lm, tok, config, "cuda_graph", rows=1), sample(lm, tok, config, "eager", rows=1)
        )
        assert_same_rollout(sample(lm, tok, config, "cuda_graph"), sample(lm, tok, config, "eager"))


@pytest.mark.parametrize("engine", ["cuda_graph", "compiled"])
def test_each_call_captures_the_current_weights(lm, tok, engine):
    """The policy trains between rollouts: a call after an in-place weight update samples the new
    weights (no graph outlives its call; a compiled step reads its weights as graph inputs)."""
    config = SamplingConfig(max_new_tokens=16, temperature=1.0)
    before = sample(lm, tok, config, engine)
    with torch.no_grad():
        for parameter in lm.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    after = sample(lm, tok, config, engine)
    assert not torch.equal(before.input_ids, after.input_ids)
    assert_same_rollout(after, sample(lm, tok, config, "eager"))


def test_graph_with_a_lora_policy_and_its_disabled_adapter(lm, tok):
    from peft import LoraConfig, get_peft_model

    from rlhf.models.backbone import peft_wrapping

    base = copy.deepcopy(lm)
    with peft_wrapping():
        policy = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.3)
    config = SamplingConfig(max_new_tokens=16, temperature=1.1, top_p=0.9)
    assert_same_rollout(sample(policy, tok, config, "cuda_graph"), sample(policy, tok, config, "eager"))
    with policy.disable_adapter():
        assert_same_rollout(sample(policy, tok, config, "cuda_graph"), sample(base, tok, config, "eager"))


def test_graph_under_bf16_autocast_replays_the_static_forward(lm, tok):
    """The trainer's bf16 policy samples under autocast: the graph replays the kernels of the static
    engine's forward, so its rollout is that one's (log-probs to bf16 rounding)."""
    config = SamplingConfig(max_new_tokens=16, temperature=1.0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        graph = sample(lm, tok, config, "cuda_graph")
        static = sample(lm, tok, config, "static")
    assert_same_rollout(graph, static, **BF16)


def test_graph_on_bfloat16_weights(lm, tok):
    model = lm.to(torch.bfloat16)
    config = SamplingConfig(max_new_tokens=16, temperature=1.0)
    assert_same_rollout(
        sample(model, tok, config, "cuda_graph"), sample(model, tok, config, "static"), **BF16
    )


# -- the compiled engine: torch.compile'd decode step, replayed from a CUDA graph --------------------


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_compiled_engine_draws_the_static_rollout(lm, tok, config):
    """Inductor's fused kernels round differently from eager ones: log-probs to 1e-4 (float32)."""
    assert_same_rollout(sample(lm, tok, config, "compiled"), sample(lm, tok, config, "static"))


def test_compiled_engine_replays_a_graph_and_compiles_once_for_two_calls(lm, tok, monkeypatch):
    from rlhf.models import decoding

    graphs: list = []

    def backend(graph_module, example_inputs):  # inductor, counted
        from torch._inductor.compile_fx import compile_fx

        graphs.append(1)
        return compile_fx(graph_module, example_inputs)

    compiled = torch.compile(decoding._decode_step, backend=backend, dynamic=False)
    monkeypatch.setattr(decoding, "compiled_decode_step", lambda: compiled)
    replays: list[int] = []
    original = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: replays.append(1) or original(self))
    config = SamplingConfig(max_new_tokens=20, stop_at_eos=False)
    first, second = sample(lm, tok, config, "compiled", seed=1), sample(lm, tok, config, "compiled", seed=2)
    assert first.response_ids.shape[1] == second.response_ids.shape[1] == 20
    assert len(graphs) == 1 and len(replays) == 2 * (20 - 2)


def test_auto_compiles_a_long_call_once_it_repeats_on_cuda(lm, tok, monkeypatch):
    """`auto` on CUDA: the graph for the first COMPILE_AFTER_CALLS calls of a shape, the compiled
    engine from then on for calls of MIN_COMPILE_FORWARDS decode forwards or more (triton ships with
    torch's CUDA wheels), the graph for shorter ones."""
    import collections

    from rlhf.models import decoding

    monkeypatch.setattr(decoding, "_auto_calls", collections.Counter())
    made: list[str] = []
    original = decoding.engine_steps
    monkeypatch.setattr(
        "rlhf.models.sampling.engine_steps",
        lambda engine, *a, **k: made.append(engine) or original(engine, *a, **k),
    )
    long_call = SamplingConfig(max_new_tokens=decoding.MIN_COMPILE_FORWARDS + 1, temperature=1.1)
    rollouts = [sample(lm, tok, long_call, "auto") for _ in range(decoding.COMPILE_AFTER_CALLS + 1)]
    assert made == ["cuda_graph"] * decoding.COMPILE_AFTER_CALLS + ["compiled"]
    static = sample(lm, tok, long_call, "static")
    for rollout in rollouts:
        assert_same_rollout(rollout, static)
    made.clear()
    sample(lm, tok, SamplingConfig(max_new_tokens=12), "auto")
    assert made == ["cuda_graph"]


def test_compiled_engine_under_bf16_autocast_and_with_lora(lm, tok):
    from peft import LoraConfig, get_peft_model

    from rlhf.models.backbone import peft_wrapping

    config = SamplingConfig(max_new_tokens=16, temperature=1.0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert_same_rollout(sample(lm, tok, config, "compiled"), sample(lm, tok, config, "static"), **BF16)
    with peft_wrapping():
        policy = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert_same_rollout(sample(policy, tok, config, "compiled"), sample(policy, tok, config, "static"))


def test_a_sliding_window_model_samples_with_the_engine_that_replays_it(monkeypatch):
    """Mistral with a sliding window (its static cache steps through Python state): `auto` takes the
    static engine where the window fills within the call, the graph where it does not; either draws
    the eager rollout (rlhf/models/decoding.py `sliding_windows`)."""
    import transformers

    from rlhf.models import decoding

    made: list[str] = []
    original = decoding.engine_steps
    monkeypatch.setattr(
        "rlhf.models.sampling.engine_steps",
        lambda engine, *a, **k: made.append(engine) or original(engine, *a, **k),
    )
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=8, vocab_size=24, pad_token_id=0, eos_token_id=3, bos_token_id=2,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config).eval().to(CUDA)
    ids, mask = left_pad([[4 + i % 9, 5 + i % 7][: 1 + i % 2] for i in range(6)], 0)
    for new_tokens, engine in ((40, "static"), (6, "cuda_graph")):  # 2 + 40 > 8 columns; 2 + 6 <= 8
        made.clear()
        config_ = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, stop_at_eos=False)
        rollouts = [
            generate(
                model,
                ids,
                mask,
                replace(config_, engine=e),
                3,
                0,
                torch.Generator(CUDA).manual_seed(4),
                return_logprobs=True,
            )  # fmt: skip
            for e in ("auto", "eager")
        ]
        assert made == [engine, "eager"]
        assert_same_rollout(*rollouts)
