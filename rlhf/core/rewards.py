"""From reward-model scores to token rewards (docs/algorithms.md §6, §8; advantage whitening, §11, is
the trainer's `minibatch_advantages`, rlhf/rl/trainer.py).

Score reparameterization (PPO paper §5.3.1), each switch independent of the others:

    reward scaling:        s = r / std_run                  (scale=True)
    reward normalization:  s = (r - mean_run) / std_run     (normalize=True; implies the division)
    reward clipping:       s = clip(s, -clip, clip)         (clip=delta)

Order of one call: update the running moments with this batch, then scale or normalize, then clip.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from rlhf.core.stats import RunningMoments, as_bool_mask, fill_masked


class ScoreProcessor:
    """Running-statistics reparameterization of sequence scores ``[B] -> [B]``.

    Args:
        scale: divide by the running std (reward scaling, Engstrom et al. 2020).
        normalize: subtract the running mean and divide by the running std. Works with or
            without `scale` (with both, the result is the normalized score).
        clip: clip the processed score to [-clip, clip]; None disables clipping.
        discounted: the original scaling of Engstrom et al.: divide by the running std of the
            discounted sum ``R <- gamma * R + r`` of the score stream (in call order, row order
            within a batch) instead of the std of the scores. Needs `scale`, not `normalize`,
            and 0 <= gamma < 1 (with gamma = 1 the sum is a random walk whose std never settles;
            gamma = 0 is the plain scaling).
        gamma: discount of the `discounted` variant.
        eps: a running std at or below `eps` (or undefined: fewer than two scores seen) counts as
            1, so early or constant scores are left unscaled instead of divided by ~0.

    Raw-score moments are updated on every call (also with every switch off), so `moments` can be
    logged. ``state_dict()`` is a nested dict of plain numbers (checkpoint without pickle).
    """

    def __init__(
        self,
        scale: bool = False,
        normalize: bool = False,
        clip: float | None = None,
        discounted: bool = False,
        gamma: float = 1.0,
        eps: float = 1e-8,
    ) -> None:
        if clip is not None and not clip > 0:
            raise ValueError(f"reward clip must be > 0 or None (off), got {clip}")
        if discounted and (not scale or normalize):
            raise ValueError(
                "discounted=True selects the discounted variant of reward scaling: "
                "set scale=True and normalize=False (normalization uses the plain score moments)"
            )
        if discounted and not 0.0 <= gamma < 1.0:
            raise ValueError(f"discounted reward scaling needs 0 <= gamma < 1 (e.g. 0.99), got gamma={gamma}")
        self.scale, self.normalize, self.clip = scale, normalize, clip
        self.discounted, self.gamma, self.eps = discounted, gamma, eps
        self.moments = RunningMoments()  # raw scores
        self.return_moments = RunningMoments()  # discounted sums (discounted variant only)
        self._discounted_return = 0.0

    def __call__(self, scores: Tensor) -> Tensor:
        if scores.dim() != 1:
            raise ValueError(f"ScoreProcessor expects scores of shape [B], got {tuple(scores.shape)}")
        self.moments.update(scores)
        if self.discounted:
            self.return_moments.update(self._advance_discounted_returns(scores))
        processed = scores
        if self.normalize:
            processed = (processed - self.moments.mean) / self._safe_std(self.moments)
        elif self.scale:
            source = self.return_moments if self.discounted else self.moments
            processed = processed / self._safe_std(source)
        if self.clip is not None:
            processed = processed.clamp(-self.clip, self.clip)
        return processed

    def _advance_discounted_returns(self, scores: Tensor) -> Tensor:
        returns = []
        for score in scores.detach().to(torch.float64).tolist():
            self._discounted_return = self.gamma * self._discounted_return + score
            returns.append(self._discounted_return)
        return torch.tensor(returns, dtype=torch.float64)

    def _safe_std(self, moments: RunningMoments) -> float:
        std = moments.std
        return std if moments.count >= 2 and std > self.eps else 1.0

    def state_dict(self) -> dict[str, object]:
        return {
            "moments": self.moments.state_dict(),
            "return_moments": self.return_moments.state_dict(),
            "discounted_return": self._discounted_return,
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        missing = {"moments", "return_moments", "discounted_return"} - set(state)
        if missing:
            raise KeyError(f"ScoreProcessor state is missing {sorted(missing)}")
        self.moments.load_state_dict(state["moments"])  # type: ignore[arg-type]
        self.return_moments.load_state_dict(state["return_moments"])  # type: ignore[arg-type]
        self._discounted_return = float(state["discounted_return"])  # type: ignore[arg-type]


def token_rewards(scores: Tensor, kl: Tensor, mask: Tensor, beta: float | Tensor) -> Tensor:
    """Token-level reward ``[B, T]``: ``-beta * kl`` on valid tokens, plus the score at the last valid one.

    The last valid token of a row is found from the mask itself (the EOS in a right-padded row);
    padding gets 0, and a row with no valid token gets no score at all.
    """
    valid = as_bool_mask(mask, kl, name="kl")
    if scores.shape != kl.shape[:1]:
        raise ValueError(f"scores must have shape [B] = [{kl.shape[0]}], got {tuple(scores.shape)}")
    rewards = fill_masked(-beta * fill_masked(kl, valid), valid)
    positions = torch.arange(kl.shape[-1], device=kl.device)
    last = torch.where(valid, positions, -1).amax(dim=-1)  # -1 for a fully masked row
    at_last = positions.unsqueeze(0) == last.unsqueeze(1)
    return rewards + fill_masked(scores.to(rewards.dtype).unsqueeze(1).expand_as(rewards), at_last)
