"""ReferenceModel: a frozen copy, or the LoRA policy with its adapter disabled (no second copy)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf.models.logprobs import response_logprobs
from rlhf.models.lora import apply_lora
from rlhf.models.reference import ReferenceModel
from tests.support.models_testing import rollout_batch

BATCH = rollout_batch([[5, 6, 7], [8]], [[9, 10, 3], [11, 12]], pad_id=0)


def storages(*models) -> set[int]:
    return {p.data_ptr() for m in models for p in m.parameters()}


def perturb_(params) -> None:
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p) * 0.3)


def test_copy_mode_is_frozen_and_stays_the_initial_policy(lm):
    ids, mask, prompt_length = BATCH
    lm.train()
    initial, _ = response_logprobs(lm, ids, mask, prompt_length)
    reference = ReferenceModel(lm)  # auto -> copy for a plain model
    assert reference.mode == "copy"
    assert not reference.model.training and lm.training
    assert not any(p.requires_grad for p in reference.model.parameters())
    assert storages(reference.model).isdisjoint(storages(lm))
    perturb_(lm.parameters())  # the policy trains
    ref_logp = reference.logprobs(ids, mask, prompt_length)
    assert torch.allclose(ref_logp, initial.detach(), atol=1e-6)
    assert not torch.allclose(response_logprobs(lm, ids, mask, prompt_length)[0], ref_logp, atol=1e-3)
    assert not ref_logp.requires_grad


def test_adapter_mode_equals_the_base_model_without_a_copy(lm):
    ids, mask, prompt_length = BATCH
    base = copy.deepcopy(lm)
    policy = apply_lora(lm, r=2, alpha=4, dropout=0.1)
    perturb_(p for n, p in policy.named_parameters() if "lora_" in n)  # the adapter has trained
    policy.train()
    before = storages(policy)
    n_params = sum(p.numel() for p in policy.parameters())

    reference = ReferenceModel(policy)  # auto -> adapter for a PEFT policy
    assert reference.mode == "adapter" and reference.model is policy
    ref_logp = reference.logprobs(ids, mask, prompt_length, temperature=0.9)

    assert storages(policy) == before  # no new parameters allocated
    assert sum(p.numel() for p in policy.parameters()) == n_params
    want, _ = response_logprobs(base, ids, mask, prompt_length, temperature=0.9)
    assert torch.allclose(ref_logp, want, atol=1e-6)
    with torch.no_grad():
        policy_logp, _ = response_logprobs(policy.eval(), ids, mask, prompt_length, temperature=0.9)
    assert not torch.allclose(policy_logp, want, atol=1e-3)  # the adapter is back on afterwards


def test_adapter_mode_restores_each_modules_training_flag(lm):
    ids, mask, prompt_length = BATCH
    policy = apply_lora(lm, r=2, alpha=4, dropout=0.5)
    policy.train()
    flags = {name: m.training for name, m in policy.named_modules()}
    ReferenceModel(policy, mode="adapter").logprobs(ids, mask, prompt_length)
    assert {name: m.training for name, m in policy.named_modules()} == flags


def test_reference_runs_without_dropout(lm):
    """Dropout on (LoRA dropout 0.5, train mode): two reference calls still agree exactly."""
    ids, mask, prompt_length = BATCH
    policy = apply_lora(lm, r=2, alpha=4, dropout=0.5)
    policy.train()
    for mode in ("adapter", "copy"):
        reference = ReferenceModel(policy, mode=mode)
        assert torch.equal(
            reference.logprobs(ids, mask, prompt_length), reference.logprobs(ids, mask, prompt_length)
        )


def test_bad_modes_are_reported(lm):
    with pytest.raises(ValueError, match="apply_lora"):
        ReferenceModel(lm, mode="adapter")
    with pytest.raises(ValueError, match="mode must be"):
        ReferenceModel(lm, mode="shared")
