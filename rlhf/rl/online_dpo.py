"""Online DPO's pieces of the loop (docs/algorithms.md §45; the math: rlhf/core/online_dpo.py).

    PreferencePairs   a rollout source over another (rlhf/rl/rollout_source.py): of each prompt's two
                      scored responses, a pair whose scores tie (or that lost a row to the truncation
                      policy) is dropped; online_dpo/* metrics of the pairs
    pair_weighted     in the policy's step (rlhf/rl/roles/policy.py): the minibatch's pair loss and
                      each row's advantage -N dL/dS_i, from one gradient-free forward of the whole
                      minibatch, before it is split into micro-batches
The pairs are ranked by the run's scorer (rlhf/rl/scorer.py): a reward model, reward functions, a
reward server, or any later source, unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from rlhf.config import OnlineDPOConfig
from rlhf.core import loss_unit_count, pair_preference
from rlhf.rl.dapo import Scored
from rlhf.rl.experience import Experience

if TYPE_CHECKING:
    from rlhf.rl.rollout_source import RolloutSource


def decisive_pairs(
    scores: torch.Tensor, group: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """(rows kept [B]: those of the groups of exactly two kept rows whose scores differ, the pairs'
    metrics): online_dpo/pairs (kept), online_dpo/tie_fraction (the share of the batch's groups whose
    two kept rows tie), online_dpo/score_gap (the mean over kept pairs of the higher score minus the
    lower)."""
    group, keep = group.to(scores.device), keep.to(scores.device)
    ids, index = torch.unique(group, return_inverse=True)
    zeros = torch.zeros(len(ids), dtype=torch.float64, device=scores.device)
    kept = zeros.index_add(0, index, keep.double())
    value = scores.double()
    top = zeros.scatter_reduce(0, index, torch.where(keep, value, -torch.inf), "amax", include_self=False)
    low = zeros.scatter_reduce(0, index, torch.where(keep, value, torch.inf), "amin", include_self=False)
    complete = kept == 2
    decisive = complete & (top > low)
    ties = int((complete & (top == low)).sum())
    pairs = int(decisive.sum())
    gap = float((top - low)[decisive].mean()) if pairs else 0.0
    metrics = {
        "online_dpo/pairs": float(pairs),
        "online_dpo/tie_fraction": ties / max(len(ids), 1),
        "online_dpo/score_gap": gap,
    }
    return keep & decisive[index], metrics


class PreferencePairs:
    """A rollout source whose batches keep the decisive pairs of another's (`decisive_pairs`)."""

    def __init__(self, source: RolloutSource) -> None:
        self.source = source

    def next_batch(self, iteration: int) -> Scored:
        scored = self.source.next_batch(iteration)
        keep, metrics = decisive_pairs(scored.scores, scored.group, scored.keep)
        return dataclasses.replace(scored, keep=keep, metrics={**scored.metrics, **metrics})

    def sample_ahead(self, iteration: int) -> None:
        self.source.sample_ahead(iteration)

    def state(self) -> dict[str, Any]:
        return self.source.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.source.load_state(state)


def pair_weighted(
    minibatch: Experience, logp: torch.Tensor, config: OnlineDPOConfig
) -> tuple[Experience, dict[str, float]]:
    """(the minibatch with each row's advantage -N dL/dS_i on its valid tokens, the pair loss's
    metrics): `logp` [B, T] the current policy's log-probs of its responses (no graph); the pairs are
    the rows of one group of opposite advantage sign (the pairwise estimator's); N its rows with a
    valid token, the online_dpo loss's unit (rlhf/core/online_dpo.py)."""
    mask = minibatch.response_mask
    sums = (logp * mask).sum(-1)
    ref_sums = (minibatch.ref_logp * mask).sum(-1)
    sign = torch.sign((minibatch.advantages * mask).sum(-1))
    loss, stats, slope = pair_preference(
        config.loss, sums, ref_sums, sign, minibatch.group, config.beta, config.label_smoothing
    )
    rows = loss_unit_count(mask, "rows")
    advantages = (-rows * slope)[:, None] * mask
    stats["pairs_per_step"] = stats.pop("pairs")  # online_dpo/pairs: the rollout's (`decisive_pairs`)
    metrics = {"policy/loss": float(loss), **{f"online_dpo/{k}": float(v) for k, v in stats.items()}}
    return dataclasses.replace(minibatch, advantages=advantages), metrics
