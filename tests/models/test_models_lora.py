"""apply_lora on a policy (causal LM) and on scalar-head models."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf.models.backbone import is_peft_model
from rlhf.models.logprobs import response_logprobs
from rlhf.models.lora import apply_lora
from rlhf.models.scalar_head import ScalarHeadModel
from tests.support.models_testing import left_pad


def test_policy_gets_trainable_adapters_and_a_frozen_base(lm):
    policy = apply_lora(lm, r=4, alpha=8)
    assert is_peft_model(policy)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("q_proj" in n for n in trainable) and any("v_proj" in n for n in trainable)


def test_fresh_adapter_changes_nothing_and_gets_gradients(lm):
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10]], pad_id=0)
    with torch.no_grad():
        before, _ = response_logprobs(lm, ids, mask, 2)
    policy = apply_lora(lm, r=4, alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    after, _ = response_logprobs(policy, ids, mask, 2)
    assert torch.allclose(after, before, atol=1e-6)  # LoRA B starts at zero
    after.sum().backward()
    grads = [p.grad for n, p in policy.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_scalar_head_keeps_its_head_trainable(lm):
    model = apply_lora(ScalarHeadModel.from_causal_lm(lm, head_init_std=0.1), r=2)
    assert isinstance(model, ScalarHeadModel) and is_peft_model(model.causal_lm)
    assert model.head.weight.requires_grad and model.head.bias.requires_grad
    assert not any(
        p.requires_grad for n, p in model.named_parameters() if "lora_" not in n and "head." not in n
    )


def test_misuse_is_reported(lm):
    with pytest.raises(ValueError, match="target_modules"):
        apply_lora(ScalarHeadModel.from_causal_lm(copy.deepcopy(lm)), target_modules=["no_such_layer"])
    with pytest.raises(ValueError, match="rank"):
        apply_lora(lm, r=0)
    with pytest.raises(ValueError, match="dropout"):
        apply_lora(lm, dropout=1.0)
    policy = apply_lora(lm, r=2)
    with pytest.raises(ValueError, match="twice"):
        apply_lora(policy)
