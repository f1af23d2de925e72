"""Micro-batches with gradient accumulation weighted by token counts give the full-batch gradient."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from rlhf.core import masked_mean, micro_batch_weight, policy_loss, token_weighted_accumulate, value_loss

LENGTHS = [6, 1, 3, 0, 5, 2, 4]  # micro-batches below hold 6, 4 and 11 tokens; one row is empty
SLICES = [slice(0, 1), slice(1, 4), slice(4, 7)]
WIDTH, FEATURES = 6, 4


def make_batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shape = (len(LENGTHS), WIDTH)
    mask = (torch.arange(WIDTH)[None, :] < torch.tensor(LENGTHS)[:, None]).float()
    return {
        "features": torch.randn(*shape, FEATURES, generator=gen),
        "old_logp": -torch.rand(shape, generator=gen) * 2 - 0.1,
        "ref_logp": -torch.rand(shape, generator=gen) * 2 - 0.1,
        "advantages": torch.randn(shape, generator=gen),
        "returns": torch.randn(shape, generator=gen),
        "mask": mask,
    }


def model_outputs(weights: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A shared-parameter stand-in for the policy/critic: every token depends on the same weights."""
    return batch["old_logp"] + 0.5 * torch.tanh(batch["features"] @ weights)


LOSSES: dict[str, Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, dict]]] = {
    "ppo": lambda out, b: policy_loss(
        "ppo", out, b["old_logp"], b["ref_logp"], b["advantages"], b["mask"], clip_eps=0.1
    ),
    "ppo_dual": lambda out, b: policy_loss(
        "ppo", out, b["old_logp"], None, b["advantages"], b["mask"], clip_eps=0.1, dual_clip=1.5
    ),
    "apa": lambda out, b: policy_loss(
        "apa", out, b["old_logp"], b["ref_logp"], b["advantages"], b["mask"], lam=0.5
    ),
    "awr": lambda out, b: policy_loss("awr", out, None, None, b["advantages"], b["mask"], max_weight=1.5),
    "value": lambda out, b: value_loss(out, b["old_logp"], b["returns"], b["mask"], clip_eps=0.2),
}
# a token-mean stat of each loss: combines across micro-batches like the loss itself
TOKEN_MEAN_STAT = {
    "ppo": "clip_fraction",
    "ppo_dual": "dual_clip_fraction",
    "apa": "residual_abs_mean",
    "awr": "weight_clip_fraction",
    "value": "value_clip_fraction",
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_accumulated_gradient_equals_full_batch_gradient(name: str) -> None:
    batch = make_batch()
    loss_fn = LOSSES[name]
    weights = torch.randn(FEATURES, generator=torch.Generator().manual_seed(1), requires_grad=True)

    full_loss, full_stats = loss_fn(model_outputs(weights, batch), batch)
    (full_grad,) = torch.autograd.grad(full_loss, weights)

    total = int(batch["mask"].sum())
    accumulated = torch.zeros_like(weights)
    naive = torch.zeros_like(weights)
    micro_losses, micro_stats, micro_masks = [], [], []
    for part in SLICES:
        micro = {k: v[part] for k, v in batch.items()}
        loss, stats = loss_fn(model_outputs(weights, micro), micro)
        (grad,) = torch.autograd.grad(
            loss * micro_batch_weight(micro["mask"], total), weights, retain_graph=True
        )
        accumulated += grad
        naive += torch.autograd.grad(loss / len(SLICES), weights)[0]
        micro_losses.append(loss.detach())
        micro_stats.append(stats)
        micro_masks.append(micro["mask"])

    assert torch.allclose(accumulated, full_grad, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(naive, full_grad, rtol=1e-3, atol=1e-5)  # a plain mean of means is wrong
    assert token_weighted_accumulate(micro_losses, micro_masks).item() == pytest.approx(
        full_loss.item(), rel=1e-5
    )
    key = TOKEN_MEAN_STAT[name]
    assert full_stats[key].item() > 0  # the stat is exercised
    combined = token_weighted_accumulate([s[key] for s in micro_stats], micro_masks)
    assert combined.item() == pytest.approx(full_stats[key].item(), rel=1e-5)


def test_token_weighted_accumulate_is_differentiable() -> None:
    batch = make_batch()
    weights = torch.randn(FEATURES, generator=torch.Generator().manual_seed(2), requires_grad=True)
    full_loss, _ = LOSSES["ppo"](model_outputs(weights, batch), batch)
    micro = [{k: v[part] for k, v in batch.items()} for part in SLICES]
    losses = [LOSSES["ppo"](model_outputs(weights, m), m)[0] for m in micro]
    combined = token_weighted_accumulate(losses, [m["mask"] for m in micro])
    (grad_combined,) = torch.autograd.grad(combined, weights)
    (grad_full,) = torch.autograd.grad(full_loss, weights)
    assert torch.allclose(grad_combined, grad_full, rtol=1e-5, atol=1e-7)


def test_masked_mean_with_normalizer_sums_to_the_full_mean() -> None:
    batch = make_batch()
    x, mask = batch["advantages"], batch["mask"]
    total = int(mask.sum())
    parts = sum(masked_mean(x[p], mask[p], normalizer=total) for p in SLICES)
    assert parts.item() == pytest.approx(masked_mean(x, mask).item(), rel=1e-6)


def test_micro_batch_weight_edge_cases() -> None:
    assert micro_batch_weight(torch.zeros(2, 3), total_tokens=0) == 0.0
    assert micro_batch_weight(torch.ones(1, 3), total_tokens=12) == 0.25
    with pytest.raises(ValueError, match="whole minibatch"):
        micro_batch_weight(torch.ones(2, 3), total_tokens=4)
    assert token_weighted_accumulate([torch.tensor(5.0)], [torch.zeros(1, 2)]).item() == 0.0
    with pytest.raises(ValueError, match="one value per micro-batch"):
        token_weighted_accumulate([1.0, 2.0], [torch.ones(1, 1)])
