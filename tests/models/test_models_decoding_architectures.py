"""The sampler's engines on architectures other than Llama (rlhf/models/decoding.py): Qwen2, GPT-2 and
GPT-NeoX (absolute or rotary positions, other attention modules), and the sliding-window ones
(Mistral with `sliding_window`, Gemma 3) whose static cache steps through Python state. The static
engine draws the eager rollout on each; the compiled step (traced by dynamo, run by a counting
backend) draws it with one graph per call shape; a sliding-window model is kept off the engines that
cannot replay it (`sliding_windows`), and a model without static-cache support (Mamba) samples eagerly."""

from __future__ import annotations

import collections
from dataclasses import replace

import pytest
import torch
import transformers

from rlhf.models import decoding
from rlhf.models.decoding import resolve_engine, sliding_windows
from rlhf.models.sampling import SamplingConfig, generate
from tests.support.models_testing import left_pad

VOCAB, EOS, PAD = 48, 3, 0
PROMPTS = [[4 + (3 * i + j) % 40 for j in range(1 + i % 7)] for i in range(8)]  # widths 1-7
WINDOW = 6  # shorter than the calls below (7 prompt columns + 16 new tokens): the window fills
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
IDS = dict(vocab_size=VOCAB, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2)
ARCHITECTURES = {
    "qwen2": lambda: transformers.Qwen2Config(num_key_value_heads=2, **SMALL, **IDS),
    "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **IDS),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**SMALL, **IDS),
    "mistral_sliding": lambda: transformers.MistralConfig(
        num_key_value_heads=2, sliding_window=WINDOW, **SMALL, **IDS
    ),
    "gemma3_sliding": lambda: transformers.Gemma3TextConfig(
        num_key_value_heads=2, head_dim=8, sliding_window=WINDOW, **SMALL, **IDS
    ),
}
SLIDING = {"mistral_sliding", "gemma3_sliding"}
CONFIG = SamplingConfig(max_new_tokens=16, temperature=1.1, top_p=0.9, repetition_penalty=1.1)


def model_of(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(ARCHITECTURES[name]()).eval()
    with torch.no_grad():  # rows end at different steps
        model.get_output_embeddings().weight[EOS] *= 6  # (a LayerNorm's zero mean ignores a shift)
        model.get_output_embeddings().weight[EOS] += 0.4
    return model


def run(model, engine: str):
    ids, mask = left_pad(PROMPTS, PAD)
    return generate(
        model, ids, mask, replace(CONFIG, engine=engine), EOS, PAD, torch.Generator().manual_seed(5),
        return_logprobs=True,
    )  # fmt: skip


def assert_same_rollout(a, b, atol=1e-5):
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=atol)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_static_engine_draws_the_eager_rollout(name):
    model = model_of(name)
    eager = run(model, "eager")
    lengths = eager.response_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows that end early
    if name in SLIDING:  # the window fills within the call: the cache's sliding branch runs
        assert eager.input_ids.shape[1] > WINDOW
    assert_same_rollout(run(model, "static"), eager)


@pytest.mark.parametrize("name", sorted(set(ARCHITECTURES) - SLIDING))
def test_the_compiled_step_draws_the_static_rollout_with_one_graph(name, monkeypatch):
    graphs: list = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    # dynamo's recompile limit counts every earlier compile of `_decode_step` in this process: start anew
    torch._dynamo.reset()
    compiled = torch.compile(decoding._decode_step, backend=backend, dynamic=False)
    monkeypatch.setattr(decoding, "compiled_decode_step", lambda: compiled)
    model = model_of(name)
    assert_same_rollout(run(model, "compiled"), run(model, "static"))
    assert len(graphs) == 1  # one shape, one graph: no recompile at any step


@pytest.mark.parametrize("name", sorted(SLIDING))
def test_a_sliding_window_model_is_kept_off_the_engines_that_cannot_replay_it(name, monkeypatch):
    model, cuda = model_of(name), torch.device("cuda")
    assert sliding_windows(model, 64) == (True, WINDOW)  # a call of 64 columns fills the window
    assert sliding_windows(model, WINDOW) == (True, None)  # one within the window never does
    assert sliding_windows(model_of("qwen2"), 64) == (False, None)
    long_fill, long_within = (8, 64, 40), (8, WINDOW, 40)  # rows, columns, decode forwards
    monkeypatch.setattr(decoding, "_auto_calls", collections.Counter())
    monkeypatch.setattr(decoding.importlib.util, "find_spec", lambda name: object())  # triton is here
    # auto on CUDA: static where the window fills, the graph within it, never the compile (however often)
    assert {resolve_engine("auto", cuda, model, False, long_fill) for _ in range(4)} == {"static"}
    assert {resolve_engine("auto", cuda, model, False, long_within) for _ in range(4)} == {"cuda_graph"}
    assert resolve_engine("cuda_graph", cuda, model, False, long_within) == "cuda_graph"
    with pytest.raises(
        ValueError, match=f"cuda_graph cannot run here.*sliding window \\({WINDOW} positions\\)"
    ):
        resolve_engine("cuda_graph", cuda, model, False, long_fill)
    with pytest.raises(ValueError, match="compiled cannot run here.*sliding-window.*Fix: --rollout.engine"):
        resolve_engine("compiled", torch.device("cpu"), model, False, long_within)
    with pytest.raises(ValueError, match="compiled cannot run here"):  # through the sampler, before a step
        run(model, "compiled")


def test_a_model_without_static_cache_support_samples_eagerly_and_the_graphs_are_refused():
    """Mamba (state-space layers): transformers marks it `_can_compile_fullgraph = False`; the static
    engine fails on it, so `auto` takes the eager engine on every device and the graph engines are
    refused with the fix."""
    if transformers.MambaForCausalLM._can_compile_fullgraph:
        pytest.skip("this transformers marks Mamba as able to run a static cache under torch.compile")
    torch.manual_seed(0)
    config = transformers.MambaConfig(hidden_size=32, num_hidden_layers=2, state_size=4, **IDS)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    call = (8, 23, 15)
    for device in (torch.device("cpu"), torch.device("cuda")):
        assert resolve_engine("auto", device, model, False, call) == "eager"
    for engine in ("cuda_graph", "compiled"):
        with pytest.raises(
            ValueError, match=f"{engine} cannot run here: transformers marks MambaForCausalLM.*eager"
        ):
            resolve_engine(engine, torch.device("cuda"), model, False, call)
    rollout = run(model, "auto")  # the eager engine, as before
    assert rollout.response_ids.shape[1] == CONFIG.max_new_tokens or bool(rollout.ended_with_eos.all())
