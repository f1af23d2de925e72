"""Packed linear weights for CPU sampling: which modules are routed, the products, the restore, the
fallbacks, and the sampler's tokens with and without them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rlhf.models.packed_linear as packed_linear
from rlhf.models.packed_linear import packable, packed_linears
from rlhf.models.sampling import SamplingConfig, generate
from tests.support.models_testing import left_pad

needs_packing = pytest.mark.skipif(
    not packed_linear.packing_available(), reason="no oneDNN in this torch build"
)


@pytest.fixture()
def no_size_floor(monkeypatch):
    """Route even the tests' tiny models (their weights are far below MIN_PACKED_BYTES)."""
    monkeypatch.setattr(packed_linear, "MIN_PACKED_BYTES", 0)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test starts with no checked shapes and packing not disabled."""
    monkeypatch.setattr(packed_linear, "_checked_shapes", set())
    monkeypatch.setattr(packed_linear, "_disabled_reason", None)


def two_layer_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4, bias=False))


@needs_packing
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (5, 24), (2, 3, 24)])
def test_packed_product_matches_f_linear_on_rows_batches_and_strided_inputs(no_size_floor, bias, shape):
    torch.manual_seed(1)
    layer = nn.Linear(24, 40, bias=bias)
    inputs = {"contiguous": torch.randn(shape), "strided": torch.randn(*shape[:-1], 3, 24)[..., 1, :]}
    with torch.inference_mode(), packed_linears(layer) as routed:
        assert routed == 1 and "forward" in layer.__dict__
        for x in inputs.values():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert "forward" not in layer.__dict__


@needs_packing
def test_inputs_the_packed_weight_cannot_take_behave_as_with_f_linear(no_size_floor):
    """A float64 input fails as it does on a plain Linear; under CPU autocast the layer computes in
    bfloat16 as a plain Linear does (autocast casts a Linear's inputs, not a oneDNN op's)."""
    layer = nn.Linear(6, 5)
    x = torch.randn(2, 6)
    with torch.inference_mode():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = layer(x)
        with pytest.raises(RuntimeError) as plain_error:
            layer(x.double())
        with packed_linears(layer) as routed:
            assert routed == 1
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = layer(x)
            with pytest.raises(RuntimeError) as packed_error:
                layer(x.double())
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    assert str(packed_error.value) == str(plain_error.value)


@needs_packing
def test_routes_plain_linears_and_restores_them(no_size_floor):
    net = two_layer_net()
    x = torch.randn(3, 8)
    before = net(x)
    with torch.inference_mode(), packed_linears(net) as routed:
        assert routed == 2
        assert all("forward" in m.__dict__ for m in net if isinstance(m, nn.Linear))
        torch.testing.assert_close(net(x), before, rtol=1e-5, atol=1e-6)
    assert all("forward" not in m.__dict__ for m in net)
    assert torch.equal(net(x), before)  # back on F.linear: bit for bit


@needs_packing
def test_restores_after_an_error_inside_the_block(no_size_floor):
    net = two_layer_net()
    with pytest.raises(KeyError), torch.inference_mode(), packed_linears(net) as routed:
        assert routed == 2
        raise KeyError("boom")
    assert all("forward" not in m.__dict__ for m in net)


@needs_packing
def test_leaves_other_modules_alone(no_size_floor):
    class MyLinear(nn.Linear):
        pass

    def own_forward(x):
        return x

    hooked = nn.Linear(8, 8)
    hooked.forward = own_forward  # e.g. accelerate's hooks
    subclass = MyLinear(8, 8)
    double = nn.Linear(8, 8).double()
    assert not any(packable(m) for m in (hooked, subclass, double, nn.Embedding(4, 8), nn.ReLU()))
    with packed_linears(nn.Sequential(hooked, subclass, double)) as routed:
        assert routed == 0
    assert hooked.forward is own_forward

    compiled = nn.Sequential(nn.Linear(8, 8))
    compiled._orig_mod = nn.Linear(8, 8)  # what torch.compile's wrapper has
    with packed_linears(compiled) as routed:
        assert routed == 0


def test_off_when_disabled_small_or_unavailable(monkeypatch):
    net = two_layer_net()
    with packed_linears(net) as routed:  # 0.5 kB of weights: below MIN_PACKED_BYTES
        assert routed == 0
    monkeypatch.setattr(packed_linear, "MIN_PACKED_BYTES", 0)
    with packed_linears(net, enabled=False) as routed:
        assert routed == 0
    monkeypatch.setattr(packed_linear, "packing_available", lambda: False)
    with packed_linears(net) as routed:
        assert routed == 0
    assert all("forward" not in m.__dict__ for m in net)


@needs_packing
def test_a_failed_check_turns_packing_off_with_a_warning(no_size_floor, monkeypatch):
    net = two_layer_net()
    monkeypatch.setattr(packed_linear._PackedForward, "__call__", lambda self, x: torch.zeros(x.shape[0], 16))
    with pytest.warns(RuntimeWarning, match="differs from F.linear"), packed_linears(net) as routed:
        assert routed == 0
    assert all("forward" not in m.__dict__ for m in net)
    assert not packed_linear.packing_available()  # for the rest of the process
    with packed_linears(net) as routed:
        assert routed == 0


@needs_packing
@pytest.mark.parametrize("do_sample", [False, True])
def test_sampler_draws_the_same_tokens_with_packed_weights(lm, no_size_floor, do_sample):
    seen = []
    lm.lm_head.register_forward_hook(lambda module, args, out: seen.append("forward" in module.__dict__))
    ids, mask = left_pad([[5, 6, 7, 8], [9], [10, 11]], 0)
    config = SamplingConfig(
        max_new_tokens=packed_linear.MIN_PACKED_NEW_TOKENS, do_sample=do_sample, temperature=0.9
    )
    rollouts = {}
    for pack in (False, True):
        seen.clear()
        generator = torch.Generator().manual_seed(3)
        rollouts[pack] = generate(
            lm, ids, mask, replace(config, pack_weights=pack), 3, 0, generator, return_logprobs=True
        )
        assert seen and all(seen) == pack  # the head ran on the packed weights exactly when asked
    plain, packed = rollouts[False], rollouts[True]
    assert torch.equal(plain.input_ids, packed.input_ids)
    assert torch.equal(plain.response_mask, packed.response_mask)
    torch.testing.assert_close(packed.logprobs, plain.logprobs, rtol=0, atol=1e-5)
    assert "forward" not in lm.lm_head.__dict__


@needs_packing
def test_a_lora_policy_samples_through_its_packed_base_layers(lm, no_size_floor):
    """peft's LoRA layers are not plain Linears: their frozen base_layer (and the adapter's own
    Linears) are routed, the wrapper runs its usual forward, and the tokens do not change."""
    from rlhf.models.lora import apply_lora

    policy = apply_lora(lm, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():  # a non-zero adapter, so that its path counts
        for name, q in policy.named_parameters():
            if "lora_B" in name:
                q.normal_(0, 0.5)
    linears = [m for m in policy.modules() if type(m) is nn.Linear]
    bases = [
        m.base_layer for m in policy.modules() if hasattr(m, "base_layer") and type(m.base_layer) is nn.Linear
    ]
    assert bases
    with torch.inference_mode(), packed_linears(policy) as routed:
        assert routed == len(linears) and all("forward" in m.__dict__ for m in bases)
    ids, mask = left_pad([[5, 6, 7, 8], [9]], 0)
    config = SamplingConfig(max_new_tokens=packed_linear.MIN_PACKED_NEW_TOKENS, temperature=0.9)
    rollouts = [
        generate(
            policy, ids, mask, replace(config, pack_weights=p), 3, 0, torch.Generator().manual_seed(5), True
        )
        for p in (False, True)
    ]
    assert torch.equal(rollouts[0].input_ids, rollouts[1].input_ids)
    torch.testing.assert_close(rollouts[1].logprobs, rollouts[0].logprobs, rtol=0, atol=1e-5)


@needs_packing
def test_short_generations_are_not_packed(lm, no_size_floor):
    """Under MIN_PACKED_NEW_TOKENS new tokens the packing would cost more than it saves."""
    seen = []
    lm.lm_head.register_forward_hook(lambda module, args, out: seen.append("forward" in module.__dict__))
    ids, mask = left_pad([[5, 6, 7], [8, 9]], 0)
    for new_tokens, packed in (
        (packed_linear.MIN_PACKED_NEW_TOKENS - 1, False),
        (packed_linear.MIN_PACKED_NEW_TOKENS, True),
    ):
        seen.clear()
        generate(lm, ids, mask, SamplingConfig(max_new_tokens=new_tokens, stop_at_eos=False), 3, 0)
        assert len(seen) == new_tokens and all(seen) == packed and any(seen) == packed


def test_a_batch_of_one_is_not_packed_and_one_row_takes_f_linear(lm, no_size_floor, monkeypatch):
    """A batch of one multiplies one row per step, where oneDNN's packed product is no faster than
    MKL's and far slower on two threads (docs/speed.md, `runtime.pack_weights`): not packed; and a packed layer
    given one row computes it with F.linear."""
    seen = []
    lm.lm_head.register_forward_hook(lambda module, args, out: seen.append("forward" in module.__dict__))
    ids, mask = left_pad([[5, 6, 7]], 0)
    generate(lm, ids, mask, SamplingConfig(max_new_tokens=packed_linear.MIN_PACKED_NEW_TOKENS), 3, 0)
    assert seen and not any(seen)
    calls = []
    monkeypatch.setattr(
        torch.ops.mkldnn, "_linear_pointwise", lambda *args: calls.append(1) or pytest.fail("packed one row")
    )
    layer = torch.nn.Linear(8, 4)
    packed = packed_linear._PackedForward(layer.weight, layer.bias)
    x = torch.randn(1, 1, 8)
    torch.testing.assert_close(packed(x), layer(x))
    assert calls == []
