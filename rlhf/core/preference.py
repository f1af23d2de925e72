"""Preference losses over response log-probs (DPO and its relatives; docs/algorithms.md §32).

Each takes [B] sequence log-probs of the chosen and rejected responses under the policy and the
reference, and returns ``(loss, stats)``: the loss is the batch mean, stats are detached 0-d tensors.
With ``h = (chosen_logp - ref_chosen_logp) - (rejected_logp - ref_rejected_logp)``: `sigmoid` (DPO;
label smoothing eps), `ipo`, `robust` (robust DPO) and `simpo` (reference-free, on mean token
log-probs, with a target margin gamma); `preference_loss`'s docstring gives each formula.
An empty batch gives a zero loss and zero stats (never NaN)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

PREFERENCE_LOSSES = ("sigmoid", "ipo", "robust", "simpo")
REFERENCE_FREE = ("simpo",)  # losses without a reference model: their inputs are mean token log-probs


def _sigmoid(h: Tensor, beta: float, eps: float) -> Tensor:
    return -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)


def _ipo(h: Tensor, beta: float, eps: float) -> Tensor:
    return (h - 1 / (2 * beta)) ** 2


def _robust(h: Tensor, beta: float, eps: float) -> Tensor:
    return ((1 - eps) * -F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1 - 2 * eps)


_LOSSES: dict[str, Callable[[Tensor, float, float], Tensor]] = {
    "sigmoid": _sigmoid,
    "ipo": _ipo,
    "robust": _robust,
    "simpo": _sigmoid,  # on the margin shifted by gamma / beta (preference_loss)
}


def preference_loss(
    name: str,
    chosen_logp: Tensor,
    rejected_logp: Tensor,
    ref_chosen_logp: Tensor | None,
    ref_rejected_logp: Tensor | None,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    gamma: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The batch-mean preference loss `name` and its stats: implicit rewards of the chosen and
    rejected responses (`chosen_reward`, `rejected_reward`), their `margin`, the `accuracy`
    (chosen reward above the rejected one) and the mean policy log-probs (`chosen_logp`,
    `rejected_logp`). A reference-free loss (`REFERENCE_FREE`: simpo) takes None for both reference
    log-probs and each response's mean token log-prob; `gamma` is SimPO's target reward margin.

    With the implicit reward ``r = beta * (logp - ref_logp)`` and the margin ``h`` (module docstring):

        sigmoid  -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)       DPO (Rafailov et al.
                 2023, eq. 7); eps > 0 is conservative DPO (label smoothing, Mitchell 2023)
        ipo      (h - 1 / (2 beta))^2                                            IPO (Azar et al. 2023, eq. 17)
        robust   ((1 - eps)(-log sigmoid(beta h)) + eps log sigmoid(-beta h)) / (1 - 2 eps)
                 robust DPO (Chowdhury et al. 2024, eq. 8): unbiased under labels flipped with rate eps
        simpo    -(1 - eps) log sigmoid(beta h - gamma) - eps log sigmoid(-(beta h - gamma))
                 SimPO (Meng et al. 2024, eq. 6): reference-free (r = beta * logp) on each response's
                 *mean* token log-prob
    """
    if name not in _LOSSES:
        raise ValueError(f"unknown preference loss {name!r}; one of {', '.join(PREFERENCE_LOSSES)}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    free = name in REFERENCE_FREE
    if free != (ref_chosen_logp is None and ref_rejected_logp is None):
        needs = "no reference log-probs (None)" if free else "the reference's log-probs"
        raise ValueError(f"preference loss {name!r} takes {needs}")
    if not (math.isfinite(gamma) and gamma >= 0) or (gamma != 0 and not free):
        raise ValueError(
            f"gamma is SimPO's target margin: >= 0 for simpo, 0 otherwise; got {gamma} for {name!r}"
        )
    if name == "robust" and not 0 <= label_smoothing < 0.5:
        raise ValueError(
            f"robust needs 0 <= label_smoothing < 0.5 (it divides by 1 - 2 eps), got {label_smoothing}"
        )
    if not 0 <= label_smoothing <= 1:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if ref_chosen_logp is None or ref_rejected_logp is None:  # reference-free: r = beta * logp
        ref_chosen_logp = ref_rejected_logp = torch.zeros_like(chosen_logp)
    shapes = {t.shape for t in (chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp)}
    if len(shapes) != 1 or chosen_logp.dim() != 1:
        raise ValueError(
            f"preference_loss takes four [B] tensors of one shape, got {sorted(map(tuple, shapes))}"
        )
    dtype = torch.promote_types(chosen_logp.dtype, torch.float32)  # bf16 in, float32 math
    chosen_logratio = chosen_logp.to(dtype) - ref_chosen_logp.to(dtype)
    rejected_logratio = rejected_logp.to(dtype) - ref_rejected_logp.to(dtype)
    h = chosen_logratio - rejected_logratio
    if h.numel() == 0:
        zero = h.new_zeros(())
        keys = ("chosen_reward", "rejected_reward", "margin", "accuracy", "chosen_logp", "rejected_logp")
        return zero + 0 * chosen_logp.sum(), {k: zero.clone() for k in keys}
    # SimPO's target margin: sigmoid(beta h - gamma), the DPO loss of the margin h - gamma / beta
    loss = _LOSSES[name](h - gamma / beta, beta, label_smoothing).mean()
    with torch.no_grad():
        chosen_reward = beta * chosen_logratio
        rejected_reward = beta * rejected_logratio
        stats = {
            "chosen_reward": chosen_reward.mean(),
            "rejected_reward": rejected_reward.mean(),
            "margin": (chosen_reward - rejected_reward).mean(),
            "accuracy": (chosen_reward > rejected_reward).float().mean(),
            "chosen_logp": chosen_logp.detach().to(dtype).mean(),
            "rejected_logp": rejected_logp.detach().to(dtype).mean(),
        }
    return loss, stats
