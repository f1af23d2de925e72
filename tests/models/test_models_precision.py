"""Devices and precision: resolving names, bfloat16 autocast over float32 weights, pure bfloat16
weights, and activation checkpointing that leaves gradients unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf.config import ConfigError
from rlhf.models.device import resolve_device, to_device
from rlhf.models.grad_checkpointing import gradient_checkpointing, is_gradient_checkpointing
from rlhf.models.logprobs import response_logprobs
from rlhf.models.lora import apply_lora
from rlhf.models.precision import Precision, cast_parameters
from rlhf.models.scalar_head import ScalarHeadModel
from tests.support.models_testing import rollout_batch

PAD = 0
CPU = torch.device("cpu")


def batch():
    return rollout_batch([[5, 6, 7], [8], [9, 10]], [[11, 12, 3], [13, 3], [14, 15, 16, 17]], PAD)


# -- devices --------------------------------------------------------------------------------------


def test_resolve_device_names(monkeypatch):
    assert resolve_device("cpu") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("CUDA:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_cuda_names_the_key_and_the_fix(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ConfigError, match=r"train\.device is 'cuda.*no usable CUDA device.*Fix: set train\.device to cpu"
    ):
        resolve_device(name)


def test_a_missing_cuda_index_and_an_unknown_name_are_config_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ConfigError, match=r"--device is 'cuda:2' but only 2 CUDA device\(s\).*cuda:0 to cuda:1"
    ):
        resolve_device("cuda:2", key="--device")
    for bad in ("gpu", "cuda:x", "cuda1", ""):
        with pytest.raises(ConfigError, match=r"train\.device must be one of auto, cpu, cuda, cuda:N"):
            resolve_device(bad)


def test_to_device_moves_tensors_and_keeps_other_values():
    source = {"ids": torch.ones(2, dtype=torch.long), "n": 3}
    moved = to_device(source, CPU)
    assert moved["n"] == 3 and torch.equal(moved["ids"], source["ids"]) and moved is not source


# -- precision policies ---------------------------------------------------------------------------


def test_precision_names_resolve_per_device(monkeypatch):
    assert Precision.resolve("auto", CPU).name == "float32"
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert Precision.resolve("auto", cuda).name == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert Precision.resolve("auto", cuda).name == "float32"
    with pytest.raises(
        ConfigError, match=r"model\.dtype is 'bfloat16' but cuda has no bfloat16.*set model\.dtype to float32"
    ):
        Precision.resolve("bfloat16", cuda, key="model.dtype")
    with pytest.raises(
        ConfigError, match=r"dtype must be one of auto, float32, bfloat16, bfloat16-pure, got 'fp16'"
    ):
        Precision.resolve("fp16", CPU)
    table = {
        name: (p.param_dtype, p.compute_dtype, p.uses_autocast)
        for name in ("float32", "bfloat16", "bfloat16-pure")
        for p in [Precision.resolve(name, CPU)]
    }
    assert table == {
        "float32": (torch.float32, torch.float32, False),
        "bfloat16": (torch.float32, torch.bfloat16, True),
        "bfloat16-pure": (torch.bfloat16, torch.bfloat16, False),
    }


def linear_output_dtypes(model, run) -> set[torch.dtype]:
    """The dtypes of every nn.Linear output while `run()` executes."""
    seen: set[torch.dtype] = set()
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_bfloat16_autocast_runs_bfloat16_matmuls_over_float32_weights_and_float32_logprobs(lm):
    ids, mask, prompt_len = batch()
    reference, _ = response_logprobs(lm, ids, mask, prompt_len)
    precision = Precision.resolve("bfloat16", CPU)
    precision.prepare(lm)
    assert {p.dtype for p in lm.parameters()} == {torch.float32}  # master weights
    result = {}

    def forward():
        with precision.autocast():
            result["logp"], _ = response_logprobs(lm, ids, mask, prompt_len)

    assert linear_output_dtypes(lm, forward) == {torch.bfloat16}
    logp = result["logp"]
    assert logp.dtype == torch.float32
    valid = mask[:, prompt_len:].bool()
    assert not torch.equal(logp, reference)  # bfloat16 products differ from float32 ones ...
    torch.testing.assert_close(logp[valid], reference[valid], rtol=0, atol=0.05)  # ... by rounding only
    assert (logp[~valid] == 0).all()
    # float32: no autocast, float32 products, the reference exactly
    plain = Precision.resolve("float32", CPU)
    assert linear_output_dtypes(lm, lambda: response_logprobs(lm, ids, mask, prompt_len)) == {torch.float32}
    with plain.autocast():
        assert torch.equal(response_logprobs(lm, ids, mask, prompt_len)[0], reference)


def test_autocast_gradients_reach_float32_weights_in_float32(lm):
    ids, mask, prompt_len = batch()
    precision = Precision.resolve("bfloat16", CPU)
    precision.prepare(lm)
    with precision.autocast():
        logp, _ = response_logprobs(lm, ids, mask, prompt_len)
    logp.sum().backward()
    grads = [p.grad for p in lm.parameters() if p.grad is not None]
    assert grads and {g.dtype for g in grads} == {torch.float32}


def test_pure_bfloat16_stores_bfloat16_weights_but_keeps_buffers_and_the_scalar_head_float32(lm):
    ids, mask, prompt_len = batch()
    model = ScalarHeadModel.from_causal_lm(lm)
    buffers = {name: b.dtype for name, b in model.named_buffers()}
    Precision.resolve("bfloat16-pure", CPU).prepare(model)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes.pop("head.weight") == dtypes.pop("head.bias") == torch.float32
    assert set(dtypes.values()) == {torch.bfloat16}
    assert {name: b.dtype for name, b in model.named_buffers()} == buffers  # rotary frequencies untouched
    values = model(ids, mask)
    assert values.dtype == torch.float32
    logp, _ = response_logprobs(model.causal_lm, ids, mask, prompt_len)
    assert logp.dtype == torch.float32


def test_the_scalar_head_computes_in_float32_under_autocast(lm):
    ids, mask, _ = batch()
    model = ScalarHeadModel.from_causal_lm(lm, head_init_std=0.5)
    hidden = model.hidden_states(ids, mask)
    expected = hidden @ model.head.weight[0] + model.head.bias[0]  # float32 by hand
    with Precision.resolve("bfloat16", CPU).autocast():
        values = model.values_from_hidden(hidden)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, expected, rtol=1e-6, atol=1e-6)


def test_cast_parameters_keeps_parameter_objects_and_their_gradients(lm):
    params = list(lm.parameters())
    params[0].grad = torch.ones_like(params[0])
    cast_parameters(lm, torch.bfloat16)
    assert [id(p) for p in lm.parameters()] == [id(p) for p in params]
    assert params[0].dtype == params[0].grad.dtype == torch.bfloat16
    cast_parameters(lm, torch.float32)
    assert {p.dtype for p in lm.parameters()} == {torch.float32}


# -- activation checkpointing ---------------------------------------------------------------------


def build(kind: str, lm):
    if kind == "lora":
        model = apply_lora(copy.deepcopy(lm), r=4, alpha=8)
        with torch.no_grad():  # LoRA B starts at 0, which would leave A without a gradient
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        return model
    if kind == "scalar-head":
        return ScalarHeadModel.from_causal_lm(copy.deepcopy(lm), head_init_std=0.5)
    return copy.deepcopy(lm)


def loss_of(model, ids, mask, prompt_len):
    if isinstance(model, ScalarHeadModel):
        return model(ids, mask).square().sum()
    logp, entropy = response_logprobs(model, ids, mask, prompt_len, with_entropy=True)
    return -(logp.sum() + 0.1 * entropy.sum())


def count_mlp_calls(model) -> list:
    """A list that grows by one at every run of a decoder layer's MLP (its forward is wrapped: module
    hooks do not fire in transformers' recompute)."""
    calls: list = []
    for module in model.modules():
        if type(module).__name__ == "LlamaDecoderLayer":
            forward = module.mlp.forward
            module.mlp.forward = lambda *a, _f=forward, **k: calls.append(1) or _f(*a, **k)
    return calls


@pytest.mark.parametrize("kind", ["plain", "lora", "scalar-head"])
def test_gradient_checkpointing_gives_the_same_gradients(kind, lm):
    ids, mask, prompt_len = batch()
    plain = build(kind, lm)
    checkpointed = copy.deepcopy(plain)
    assert gradient_checkpointing(checkpointed) is checkpointed
    assert is_gradient_checkpointing(checkpointed) and not is_gradient_checkpointing(plain)

    layer_calls = count_mlp_calls(checkpointed)
    layers = [m for m in checkpointed.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    for model in (plain, checkpointed):
        model.train()
        loss_of(model, ids, mask, prompt_len).backward()
    # each decoder layer ran twice: once in the forward, once more in the backward (recomputed)
    assert len(layer_calls) == 2 * len(layers) == 4

    # (the scalar-head loss leaves the LM head without a gradient, in both)
    grads = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
    assert {n for n, p in checkpointed.named_parameters() if p.grad is not None} == set(grads)
    assert any(float(g.abs().max()) > 0 for n, g in grads.items() if "layers" in n)
    for name, param in checkpointed.named_parameters():
        if name in grads:
            torch.testing.assert_close(param.grad, grads[name], rtol=0, atol=1e-5, msg=name)
    if kind == "lora":
        assert not any(p.requires_grad for n, p in checkpointed.named_parameters() if "lora" not in n)


def test_gradient_checkpointing_is_off_in_eval_mode(lm):
    ids, mask, prompt_len = batch()
    gradient_checkpointing(lm)
    calls = count_mlp_calls(lm)
    lm.eval()
    response_logprobs(lm, ids, mask, prompt_len)[0].sum().backward()
    assert len(calls) == len(lm.model.layers)  # once per layer: nothing recomputed
