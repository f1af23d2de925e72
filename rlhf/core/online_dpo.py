"""Online DPO (Guo et al. 2024 §3; TRL's OnlineDPOTrainer; docs/algorithms.md §45): DPO's loss on
pairs sampled from the current policy, the higher-scored response of each pair chosen.

    pairwise         advantage +1 on the higher-scored row of a pair, -1 on the lower's; 0 for a tie
                     and for a row without a partner
    pair_preference  the pairs' loss L (`preference_loss`) over the rows' summed log-probs S_i, and dL/dS_i
    online_dpo       the policy loss whose gradient is L's: A_i = -N dL/dS_i (N rows with a valid token),
                     mean over rows of -A_i * sum_t (logp_it - sg(logp_it)); value 0, L reported beside
L couples a pair's two rows, so dL/dS_i is computed once on the whole minibatch and each row's term
is then linear in its own log-probs: any micro-batch or rank split gives L's gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core.advantages import EstimatorOutput, _broadcast, register_estimator, sequence_rewards
from rlhf.core.losses import LossOutput, _approx_kl_old_new, register_policy_loss
from rlhf.core.preference import preference_loss
from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked

ONLINE_DPO_LOSSES = ("sigmoid", "ipo", "robust")  # preference losses with a reference


def preference_pairs(sign: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """(chosen rows [P], rejected rows [P]), pair k from one group: the groups whose rows of nonzero
    `sign` are exactly one above 0 (chosen) and one below (rejected), ordered by group id."""
    ids, index = torch.unique(group, return_inverse=True)
    count = torch.zeros(len(ids), dtype=torch.long, device=sign.device)
    above = count.index_add(0, index, (sign > 0).long())
    below = count.index_add(0, index, (sign < 0).long())
    paired = ((above == 1) & (below == 1))[index]
    chosen = torch.nonzero(paired & (sign > 0)).squeeze(1)
    rejected = torch.nonzero(paired & (sign < 0)).squeeze(1)
    chosen = chosen[torch.argsort(index[chosen])]
    rejected = rejected[torch.argsort(index[rejected])]
    return chosen, rejected


@register_estimator("pairwise", needs_values=False, needs_group=True)
def pairwise_estimator(
    token_rewards: Tensor, mask: Tensor, values: Tensor | None, group: Tensor | None
) -> EstimatorOutput:
    """Online DPO's preference within each pair (module docstring): A_i = sign(R_i - R_j) for the two
    rows i, j of a group with exactly two valid rows, 0 for every other row (a tie gives 0 to both)."""
    assert group is not None
    scores, present = sequence_rewards(token_rewards, mask)
    _, index = torch.unique(group, return_inverse=True)
    size = int(index.max()) + 1 if index.numel() else 0
    zeros = torch.zeros(size, dtype=scores.dtype, device=scores.device)
    count = zeros.index_add(0, index, present.to(scores.dtype))[index]
    total = zeros.index_add(0, index, fill_masked(scores, present))[index]
    other = total - scores  # the partner's score in a group of two
    sign = torch.where(present & (count == 2), torch.sign(scores - other), torch.zeros_like(scores))
    return _broadcast(sign, mask, present)


def pair_preference(
    name: str,
    logp_sums: Tensor,
    ref_sums: Tensor,
    sign: Tensor,
    group: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor], Tensor]:
    """(L, its stats, dL/dS [B]): the mean over the pairs (`preference_pairs` of `sign`, `group`) of
    preference loss `name` on the rows' summed policy log-probs S = `logp_sums` and reference
    log-probs `ref_sums`, the stats of `preference_loss`, and L's derivative with respect to each
    S_i (0 for a row outside a pair). Nothing here keeps a graph: S is taken as a constant."""
    if name not in ONLINE_DPO_LOSSES:
        raise ValueError(f"online DPO's loss must be one of {', '.join(ONLINE_DPO_LOSSES)}, got {name!r}")
    chosen, rejected = preference_pairs(sign, group)
    with torch.enable_grad():
        s = logp_sums.detach().clone().requires_grad_(True)
        ref = ref_sums.detach().clone()
        loss, stats = preference_loss(
            name, s[chosen], s[rejected], ref[chosen], ref[rejected], beta, label_smoothing
        )
        (slope,) = torch.autograd.grad(loss, s)
    stats["pairs"] = torch.tensor(float(len(chosen)))
    return loss.detach(), stats, slope


@register_policy_loss("online_dpo", unit="rows")
def online_dpo_loss(
    logp: Tensor, old_logp: Tensor | None, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor
) -> LossOutput:
    """Online DPO's gradient form (module docstring): mean over the rows with a valid token of
    -A_i * sum_t (logp_it - sg(logp_it)), A_i the row's advantage (the same on its valid tokens,
    -N dL/dS_i from `pair_preference`). Value 0; gradient -(1/n) sum_i A_i dS_i, that of L when the
    trainer divides by the minibatch's n = N rows. Stats: approx_kl (k3, old vs new, a token mean);
    L's are `pair_preference`'s."""
    check_same_shape(logp, "logp", advantages=advantages)
    valid = as_bool_mask(mask, logp, name="logp")
    counts = valid.sum(dim=-1)
    rows = counts > 0
    adv = fill_masked(advantages, valid).sum(dim=-1) / counts.clamp(min=1).to(logp.dtype)  # A_i
    moved = fill_masked(logp - logp.detach(), valid).sum(dim=-1)  # 0, with d S_i as its gradient
    loss = (-adv * moved).sum() / max(int(rows.sum()), 1)
    with torch.no_grad():
        stats = _approx_kl_old_new(old_logp, fill_masked(logp, valid), valid)
    return loss, stats
