"""Advantage estimators: a registry (gae, grpo, dr_grpo, rloo, reinforce_pp) of pure functions.

Every estimator maps the token rewards ``[B, T]`` of a rollout to ``(advantages, returns)``, both
``[B, T]`` and 0 at masked positions (docs/algorithms.md §10 and §27-30; `estimate_advantages`
lists them with their papers). `gae` needs values; the
group estimators need `group` (one integer id per row, equal for the rows of one prompt) and read a
row's R, the sum of its token rewards, broadcast to its valid tokens. A row with no valid token is
no member of its group and gets 0; so do the rows of a group of fewer than two members or of equal
rewards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from rlhf.core.keywords import call_with_keywords
from rlhf.core.stats import as_bool_mask, check_same_shape, fill_masked, masked_whiten

EstimatorOutput = tuple[Tensor, Tensor]


# (token_rewards, mask, values, group, **keyword parameters with defaults) -> (advantages, returns):
# each estimator names its own keyword parameters (the public `estimate_advantages(name, ..., **params)`)
EstimatorFn = Callable[..., EstimatorOutput]


class AdvantageSettings(Protocol):
    """The typed config group a registered estimator reads its keyword parameters from: the fields
    of rlhf.config.AdvantageConfig that the built-in estimators read (core sits below config, so it
    names them here; mypy checks that AdvantageConfig has each, where the trainer passes it)."""

    @property
    def gamma(self) -> float: ...
    @property
    def lam(self) -> float: ...
    @property
    def group_eps(self) -> float: ...
    @property
    def std_normalize(self) -> bool: ...


# The config group -> the estimator's keyword parameters, e.g. gae's
# ``lambda c: {"gamma": c.gamma, "lam": c.lam}``: the one declaration of which settings it reads
# (the config layer refuses the others with it, rlhf/config/registry_reads.py).
EstimatorSettingsFn = Callable[[AdvantageSettings], dict[str, object]]


@dataclass(frozen=True)
class EstimatorSpec:
    fn: EstimatorFn  # the tensor function
    needs_values: bool  # reads a critic's values: the run builds and trains a critic
    needs_group: bool  # compares the rows of one prompt: rollout.samples_per_prompt >= 2
    settings: EstimatorSettingsFn  # its keyword parameters from the config group


ESTIMATORS: dict[str, EstimatorSpec] = {}


def register_estimator(
    name: str,
    *,
    needs_values: bool,
    needs_group: bool,
    settings: EstimatorSettingsFn = lambda _: {},
    replace: bool = False,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator adding an advantage estimator to ``ESTIMATORS`` under `name`
    (``estimate_advantages(name, ...)``).

    The function takes ``(token_rewards, mask, values, group, **params)`` with keyword parameters
    that have defaults and returns ``(advantages, returns)``. `settings` reads its keyword
    parameters from the config group (`AdvantageSettings`); those it leaves out keep their defaults.
    """

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        if name in ESTIMATORS and not replace:
            raise ValueError(
                f"an advantage estimator named {name!r} is already registered; pass replace=True"
            )
        ESTIMATORS[name] = EstimatorSpec(fn, needs_values, needs_group, settings)
        return fn

    return decorator


def estimator_spec(name: str) -> EstimatorSpec:
    if name not in ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}: choose one of {', '.join(sorted(ESTIMATORS))}"
        )
    return ESTIMATORS[name]


def estimator_params(name: str, settings: AdvantageSettings) -> dict[str, object]:
    """The keyword parameters of estimator `name` read from the typed config group, e.g.
    ``estimator_params("gae", config.advantage)`` -> ``{"gamma": ..., "lam": ...}``."""
    return estimator_spec(name).settings(settings)


def estimate_advantages(
    name: str,
    token_rewards: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    group: Tensor | None = None,
    **params: object,
) -> EstimatorOutput:
    """``(advantages, returns)`` ``[B, T]`` by estimator `name` ("gae", "grpo", "dr_grpo", "rloo",
    "reinforce_pp", or one added with ``register_estimator``); 0 at masked positions. A keyword the
    estimator does not take is refused (ValueError).

    gae           needs values: Generalized Advantage Estimation (Schulman et al. 2016)
    grpo          needs groups: (R - group mean) / (group std + eps)   (Shao et al. 2024, DeepSeekMath)
    dr_grpo       needs groups: R - group mean                          (Liu et al. 2025, Dr. GRPO)
    rloo          needs groups: R - mean of the group's other rows      (Ahmadian et al. 2024)
    reinforce_pp  discounted return-to-go, whitened over the batch      (Hu 2025, REINFORCE++)
    """
    spec = estimator_spec(name)
    if token_rewards.dim() != 2:
        raise ValueError(f"token_rewards must be [B, T], got shape {tuple(token_rewards.shape)}")
    if spec.needs_values and values is None:
        raise ValueError(f"advantage estimator {name!r} needs values (a critic's V [B, T]), got None")
    if spec.needs_group:
        if group is None:
            raise ValueError(f"advantage estimator {name!r} needs group ids [B] (one per prompt), got None")
        if group.shape != token_rewards.shape[:1]:
            raise ValueError(
                f"group must have shape [B] = [{token_rewards.shape[0]}], got {tuple(group.shape)}"
            )
    what = f"advantage estimator {name!r}"
    return call_with_keywords(what, spec.fn, token_rewards, mask, values, group, **params)


# ---------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Advantages and returns ``[B, T]`` by GAE, 0 at masked positions.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        G_t     = A_t + V_t

    The episode ends at the last valid token (the EOS): the value and advantage after it are 0, so
    a right-padded row is one episode and a fully masked row gives zeros. A masked position inside
    a row (an environment's reply in a multi-turn episode, docs/algorithms.md#39-multi-turn-episodes)
    is no time step: the recursion skips it, so the last token of a turn bootstraps from the first
    token of the next turn (V_{t+1} and A_{t+1} are those of the next valid position).
    lam = 0 gives the TD error, lam = 1 the discounted return minus V.
    Call it under ``torch.no_grad()`` (or with detached values) to get plain targets.
    """
    check_same_shape(rewards, "rewards", values=values)
    if rewards.dim() != 2:
        raise ValueError(f"gae expects [B, T] tensors, got shape {tuple(rewards.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae needs gamma and lam in [0, 1], got gamma={gamma}, lam={lam}")
    valid = as_bool_mask(mask, rewards, name="rewards")
    r, v = fill_masked(rewards, valid), fill_masked(values, valid)
    if r.shape[1] == 0:
        return torch.zeros_like(r), torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_advantage = torch.zeros_like(r[:, 0])
    reversed_advantages = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        here = valid[:, t]
        advantage = fill_masked(delta + gamma * lam * next_advantage, here)
        reversed_advantages.append(advantage)
        # a masked position passes the next valid one's value and advantage on (0 after the last)
        next_value = torch.where(here, v[:, t], next_value)
        next_advantage = torch.where(here, advantage, next_advantage)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = fill_masked(advantages + v, valid)
    return advantages, returns


@register_estimator(
    "gae", needs_values=True, needs_group=False, settings=lambda c: {"gamma": c.gamma, "lam": c.lam}
)
def gae_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    values: Tensor | None,
    group: Tensor | None,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> EstimatorOutput:
    """GAE over the critic's values (PPO paper §3.2.2; docs/algorithms.md#10-gae)."""
    assert values is not None
    return gae(token_rewards, values, mask, gamma, lam)


# ---------------------------------------------------------------------------------------------
# Group baselines: GRPO, Dr. GRPO, RLOO
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupStats:
    """Per row, over the members of its group: member count, reward sum, mean and unbiased std."""

    count: Tensor
    total: Tensor
    mean: Tensor
    std: Tensor


def sequence_rewards(token_rewards: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(R [B]: each row's summed token rewards over its valid tokens, present [B]: rows with one)."""
    valid = as_bool_mask(mask, token_rewards, name="token_rewards")
    return fill_masked(token_rewards, valid).sum(dim=-1), valid.any(dim=-1)


def group_stats(scores: Tensor, group: Tensor, present: Tensor) -> GroupStats:
    """Count, sum, mean and unbiased std of `scores` over each row's group, counting `present` rows
    only (a group of one has std 0; the mean of a group without members is 0)."""
    _, index = torch.unique(group, return_inverse=True)
    size = int(index.max()) + 1 if index.numel() else 0
    weight = present.to(scores.dtype)
    scores = fill_masked(scores, present)

    def per_group(x: Tensor) -> Tensor:
        return torch.zeros(size, dtype=scores.dtype, device=scores.device).index_add_(0, index, x)

    count = per_group(weight)
    total = per_group(scores)
    mean = total / count.clamp(min=1)
    squares = per_group(weight * (scores - mean[index]).square())
    std = (squares / (count - 1).clamp(min=1)).sqrt()
    return GroupStats(count[index], total[index], mean[index], std[index])


def _broadcast(per_row: Tensor, mask: Tensor, present: Tensor) -> EstimatorOutput:
    """A per-row advantage on the row's valid tokens (0 elsewhere); the returns are the same."""
    valid = as_bool_mask(mask, mask)
    advantages = fill_masked(fill_masked(per_row, present).unsqueeze(1).expand(valid.shape), valid)
    return advantages, advantages.clone()


@register_estimator(
    "grpo",
    needs_values=False,
    needs_group=True,
    settings=lambda c: {"eps": c.group_eps, "std_normalize": c.std_normalize},
)
def grpo_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    values: Tensor | None,
    group: Tensor | None,
    *,
    eps: float = 1e-6,
    std_normalize: bool = True,
) -> EstimatorOutput:
    """GRPO outcome supervision (Shao et al. 2024, DeepSeekMath paper §4.1.2):
    ``A_i = (R_i - mean(R_group)) / (std(R_group) + eps)`` on every valid token of row i (unbiased
    std; ``std_normalize=False`` keeps the numerator only). Groups of one and groups of equal
    rewards give 0."""
    assert group is not None
    scores, present = sequence_rewards(token_rewards, mask)
    stats = group_stats(scores, group, present)
    centered = torch.where(stats.count >= 2, scores - stats.mean, torch.zeros_like(scores))
    advantage = centered / (stats.std + eps) if std_normalize else centered
    return _broadcast(advantage, mask, present)


@register_estimator("dr_grpo", needs_values=False, needs_group=True)
def dr_grpo_estimator(
    token_rewards: Tensor, mask: Tensor, values: Tensor | None, group: Tensor | None
) -> EstimatorOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", Dr. GRPO paper §3.2):
    ``A_i = R_i - mean(R_group)``, without GRPO's division by the group std (which up-weights
    groups that are nearly all right or all wrong). Its other half, the loss summed over tokens and
    divided by a constant instead of each response's length, is ``policy.loss_aggregation:
    fixed_length`` (docs/algorithms.md §28)."""
    return grpo_estimator(token_rewards, mask, values, group, std_normalize=False)


@register_estimator("rloo", needs_values=False, needs_group=True)
def rloo_estimator(
    token_rewards: Tensor, mask: Tensor, values: Tensor | None, group: Tensor | None
) -> EstimatorOutput:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", RLOO paper §3.2; Kool et al. 2019):
    ``A_i = R_i - (sum_{j != i} R_j) / (k - 1)`` over the k members of row i's group, on every valid
    token of row i. A group of one has no other member and gives 0."""
    assert group is not None
    scores, present = sequence_rewards(token_rewards, mask)
    stats = group_stats(scores, group, present)
    others = (stats.total - scores) / (stats.count - 1).clamp(min=1)
    advantage = torch.where(stats.count >= 2, scores - others, torch.zeros_like(scores))
    return _broadcast(advantage, mask, present)


# ---------------------------------------------------------------------------------------------
# REINFORCE++
# ---------------------------------------------------------------------------------------------
@register_estimator(
    "reinforce_pp", needs_values=False, needs_group=False, settings=lambda c: {"gamma": c.gamma}
)
def reinforce_pp_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    values: Tensor | None,
    group: Tensor | None,
    *,
    gamma: float = 1.0,
) -> EstimatorOutput:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262, REINFORCE++ paper §3): the return-to-go of the token rewards
    (token-level KL penalty included), ``G_t = r_t + gamma * G_{t+1}`` within each row's valid
    tokens, whitened over the whole batch's valid tokens (mean 0, unbiased var 1): the global
    batch normalization that replaces a critic. Returns are the unwhitened ``G``."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"reinforce_pp needs gamma in [0, 1], got {gamma}")
    valid = as_bool_mask(mask, token_rewards, name="token_rewards")
    # the return-to-go is GAE with V = 0 and lam = 1
    returns, _ = gae(token_rewards, torch.zeros_like(token_rewards), valid, gamma, 1.0)
    return masked_whiten(returns, valid), returns
