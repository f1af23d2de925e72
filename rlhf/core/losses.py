"""Policy losses (a registry: ppo, apa, awr), the value loss, micro-batch gradient accumulation, and
the per-token KL estimators (docs/algorithms.md §7) that the losses use as a term.

Every loss is a token mean over the whole batch it is given (docs/algorithms.md §12-15) and
returns ``(loss, stats)``; stats are detached 0-d tensors (call ``float()`` to log them). Values at
masked positions are never read: they change neither the loss nor its gradient. A micro-batch's
loss times ``micro_batch_weight`` (its token share of the minibatch) gives exactly the minibatch's
gradient (docs/algorithms.md#18-token-mean-accumulation-over-micro-batches);
``token_weighted_accumulate`` combines micro-batch token means for logging."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from rlhf.core.keywords import call_with_keywords
from rlhf.core.stats import (
    as_bool_mask,
    check_same_shape,
    explained_variance,
    fill_masked,
    masked_max,
    masked_mean,
    masked_min,
)

LossOutput = tuple[Tensor, dict[str, Tensor]]

# exp() of a log-ratio beyond +-20 (a ratio above 4.9e8) is a blown-up policy; clamping keeps the
# loss finite (0 * inf would be NaN) and only zeroes gradients in that already-broken regime.
MAX_LOG_RATIO = 20.0


KLKind = Literal["k1", "k2", "k3"]
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: KLKind = "k1", mask: Tensor | None = None) -> Tensor:
    """Per-token estimate of KL(policy || ref) from the sampled tokens' log-probs, same shape as `logp`.

    With ``d = logp - ref_logp`` for tokens sampled from the policy whose log-prob is `logp`
    (Schulman, "Approximating KL divergence", 2020):

        k1 = d                    unbiased for KL(policy || ref); negative on some tokens
        k2 = d^2 / 2              biased, >= 0
        k3 = exp(-d) - 1 + d      unbiased, >= 0

    With `mask`, masked positions are 0 and never read; without it every position is computed.
    Read by the losses (the policy's KL loss term, PPO's approx_kl) and, outside them, by the
    reward's per-token KL penalty and the sampler-trainer mismatch (rlhf/core/mismatch.py).
    """
    check_same_shape(logp, "logp", ref_logp=ref_logp)
    valid = None
    if mask is not None:
        valid = as_bool_mask(mask, logp, name="logp")
        logp, ref_logp = fill_masked(logp, valid), fill_masked(ref_logp, valid)
    d = logp - ref_logp
    if kind == "k1":
        kl = d
    elif kind == "k2":
        kl = 0.5 * d.square()
    elif kind == "k3":
        # expm1 keeps precision for small d; the clamp only removes rounding below 0.
        kl = (d.neg().expm1() + d).clamp_min(0.0)
    else:
        raise ValueError(f"unknown KL estimator {kind!r}: choose one of {', '.join(KL_KINDS)}")
    return kl if valid is None else fill_masked(kl, valid)


# (logp, old_logp, ref_logp, advantages, mask, **keyword parameters with defaults) -> (loss, stats):
# each loss names its own keyword parameters (the public `policy_loss(name, ..., **params)`)
PolicyLossFn = Callable[..., LossOutput]


class PolicyLossSettings(Protocol):
    """The typed config group a registered loss reads its keyword parameters from: the fields of
    rlhf.config.PolicyLossConfig that the built-in losses read (core sits below config, so it names
    them here; mypy checks that PolicyLossConfig has each, where the trainer passes it)."""

    @property
    def clip_eps(self) -> float: ...
    @property
    def clip_eps_high(self) -> float | None: ...
    @property
    def dual_clip(self) -> float | None: ...
    @property
    def ratio_against(self) -> str: ...
    @property
    def apa_lam(self) -> float: ...
    @property
    def awr_lam(self) -> float: ...
    @property
    def awr_max_weight(self) -> float | None: ...
    @property
    def cispo_clip_eps_low(self) -> float | None: ...


# The config group -> the loss's keyword parameters, e.g. apa's ``lambda c: {"lam": c.apa_lam}``.
# The one declaration of which settings a loss reads: the config layer counts the attributes it
# reads (rlhf/config/registry_reads.py) to refuse a setting that the chosen loss would ignore.
PolicyLossSettingsFn = Callable[[PolicyLossSettings], dict[str, object]]

# The unit a loss's mean is over, "tokens" (a token mean: ppo, apa, awr, cispo) or "rows" (a mean
# over the rows with a valid token: gspo). The trainer divides a minibatch's summed loss by the
# global count of that unit, so any micro-batch split gives the same value and gradient
# (docs/algorithms.md §18).
LossUnit = Literal["tokens", "rows"]


@dataclass(frozen=True)
class PolicyLossSpec:
    fn: PolicyLossFn  # the tensor function
    settings: PolicyLossSettingsFn  # its keyword parameters from the config group
    unit: LossUnit  # what its mean is over (`loss_unit_count`)


POLICY_LOSSES: dict[str, PolicyLossSpec] = {}


def register_policy_loss(
    name: str,
    *,
    settings: PolicyLossSettingsFn = lambda _: {},
    unit: LossUnit = "tokens",
    replace: bool = False,
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a policy loss to ``POLICY_LOSSES`` under `name` (``policy_loss(name, ...)``).

    The function takes ``(logp, old_logp, ref_logp, advantages, mask, **params)`` with keyword
    parameters that have defaults, and returns ``(loss, stats)``. `settings` reads its keyword
    parameters from the config group (`PolicyLossSettings`); those it leaves out keep their
    defaults. `unit`: what its mean is over, "tokens" or "rows" (`loss_unit_count`).
    """
    if unit not in ("tokens", "rows"):
        raise ValueError(f"policy loss {name!r}: unit must be 'tokens' or 'rows', got {unit!r}")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES and not replace:
            raise ValueError(f"a policy loss named {name!r} is already registered; pass replace=True")
        POLICY_LOSSES[name] = PolicyLossSpec(fn, settings, unit)
        return fn

    return decorator


def policy_loss_spec(name: str) -> PolicyLossSpec:
    """Policy loss `name`'s registration; an unknown name is refused with the registered ones."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}: choose one of {', '.join(sorted(POLICY_LOSSES))}")
    return POLICY_LOSSES[name]


def policy_loss_params(name: str, settings: PolicyLossSettings) -> dict[str, object]:
    """The keyword parameters of policy loss `name` read from the typed config group, e.g.
    ``policy_loss_params("awr", config.policy)`` ->
    ``{"lam": config.policy.awr_lam, "max_weight": config.policy.awr_max_weight}``."""
    return policy_loss_spec(name).settings(settings)


def policy_loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    **params: object,
) -> LossOutput:
    """Policy loss `name` from the registry ("ppo", "apa", "awr", or one added with the decorator);
    a keyword the loss does not take is refused (ValueError)."""
    fn = policy_loss_spec(name).fn
    return call_with_keywords(
        f"policy loss {name!r}", fn, logp, old_logp, ref_logp, advantages, mask, **params
    )


def policy_loss_unit(name: str) -> LossUnit:
    """The unit policy loss `name` is a mean over: "tokens" or "rows" (its registration's `unit`)."""
    return policy_loss_spec(name).unit


def loss_unit_count(mask: Tensor, unit: LossUnit) -> float:
    """How many `unit`s a `[B, T]` mask holds: its valid tokens, or its rows with a valid token."""
    valid = mask != 0
    if unit == "tokens":
        return float(valid.sum())
    if unit == "rows":
        return float(valid.any(dim=-1).sum())
    raise ValueError(f"unknown loss unit {unit!r}: 'tokens' or 'rows'")


def _require(tensor: Tensor | None, name: str, loss: str, why: str) -> Tensor:
    if tensor is None:
        raise ValueError(f"policy loss {loss!r} needs {name} ({why}), got None")
    return tensor


def _approx_kl_old_new(old_logp: Tensor | None, logp: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """k3 estimate of KL(old || new) on the behaviour policy's samples (a drift monitor)."""
    if old_logp is None:
        return {}
    return {"approx_kl": masked_mean(kl_estimate(old_logp, logp, "k3", valid), valid)}


@register_policy_loss(
    "ppo",
    settings=lambda c: {
        "clip_eps": c.clip_eps,
        "clip_eps_high": c.clip_eps_high,
        "dual_clip": c.dual_clip,
        "ratio_against": c.ratio_against,
    },
)
def ppo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    ratio_against: str = "old",
    cov_detach: Tensor | None = None,
    cov_kl: Tensor | None = None,
    cov_kl_coef: float = 1.0,
) -> LossOutput:
    """PPO clipped surrogate ``mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps_high)))``.

    clip_eps_high: the upper bound's epsilon; None: clip_eps (the symmetric clip). DAPO's
        clip-higher (Yu et al. 2025, arXiv 2503.14476, DAPO paper §3.1) raises it (0.28 with
        clip_eps 0.2) so that low-probability tokens with A > 0 can grow: against entropy collapse.

    dual_clip: c > 1 caps the loss of tokens with A < 0 at ``-c * A`` (Ye et al. 2020, dual-clip PPO).
    ratio_against: the importance-sampling denominator, "old" (behaviour policy, the default) or
        "ref" (the reference policy: PPO paper §5.3.2, "infinite experience buffer").
    cov_detach, cov_kl: Clip-Cov and KL-Cov (Cui et al. 2025, arXiv 2505.22617 §4.3; docs/algorithms.md
        §43), `[B, T]` 0/1 selections (rlhf/core/covariance.py `covariance_selection`): Clip-Cov keeps the
        selected tokens' loss but detaches its gradient; KL-Cov adds ``cov_kl_coef * |logp - old_logp|``
        to the selected tokens' loss. Stats cov_fraction (selected tokens) when either is given.
    Stats: clip_fraction (tokens where either bound binds: the clipped term is the larger),
    clip_fraction_low (A < 0, ratio below 1 - clip_eps) and clip_fraction_high (A > 0, ratio above
    1 + clip_eps_high), which sum to clip_fraction; dual_clip_fraction, approx_kl (k3, old vs new),
    ratio_mean/min/max.
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if ratio_against not in ("old", "ref"):
        raise ValueError(f"ppo ratio_against must be 'old' or 'ref', got {ratio_against!r}")
    if not clip_eps > 0:
        raise ValueError(f"ppo clip_eps must be > 0, got {clip_eps}")
    if not eps_high > 0:
        raise ValueError(f"ppo clip_eps_high must be > 0 or None (= clip_eps), got {clip_eps_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"ppo dual_clip must be > 1 or None (off), got {dual_clip}")
    denominator = (
        _require(old_logp, "old_logp", "ppo", "ratio_against='old'")
        if ratio_against == "old"
        else _require(ref_logp, "ref_logp", "ppo", "ratio_against='ref'")
    )
    check_same_shape(logp, "logp", old_logp=old_logp, ref_logp=ref_logp, advantages=advantages)
    valid = as_bool_mask(mask, logp, name="logp")
    logp, adv = fill_masked(logp, valid), fill_masked(advantages, valid)
    log_ratio = (logp - fill_masked(denominator, valid)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(valid)
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual_clipped = (adv < 0) & (per_token > cap)
        per_token = torch.where(dual_clipped, cap, per_token)
    cov_stats = {}
    if cov_detach is not None:  # Clip-Cov: the selected tokens' gradient detached
        chosen = as_bool_mask(cov_detach, logp, name="cov_detach") & valid
        per_token = torch.where(chosen, per_token.detach(), per_token)
        cov_stats["cov_fraction"] = masked_mean(chosen.float(), valid)
    if cov_kl is not None:  # KL-Cov: |logp - old_logp| penalised on the selected tokens
        chosen = as_bool_mask(cov_kl, logp, name="cov_kl") & valid
        old = fill_masked(_require(old_logp, "old_logp", "ppo", "KL-Cov's penalty"), valid)
        per_token = per_token + cov_kl_coef * torch.where(chosen, (logp - old).abs(), 0.0)
        cov_stats["cov_fraction"] = masked_mean(chosen.float(), valid)
    loss = masked_mean(per_token, valid)
    with torch.no_grad():
        stats = {
            **cov_stats,
            "clip_fraction": masked_mean((clipped > unclipped).float(), valid),
            # the clipped term exceeds the unclipped one only where the bound on A's side binds
            "clip_fraction_low": masked_mean(((clipped > unclipped) & (adv < 0)).float(), valid),
            "clip_fraction_high": masked_mean(((clipped > unclipped) & (adv > 0)).float(), valid),
            "dual_clip_fraction": masked_mean(dual_clipped.float(), valid),
            "ratio_mean": masked_mean(ratio, valid),
            "ratio_min": masked_min(ratio, valid),
            "ratio_max": masked_max(ratio, valid),
            **_approx_kl_old_new(old_logp, logp, valid),
        }
    return loss, stats


@register_policy_loss("apa", settings=lambda c: {"lam": c.apa_lam})
def apa_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    lam: float = 0.1,
) -> LossOutput:
    """APA (APA paper eq. 9): ``mean((logp - ref_logp - A / lam)^2)``; lam = 1/c_sq, code c_sq = 10.

    Uses the reference (initial) policy, not the behaviour policy, and no importance ratio.
    Stats: log_ratio_ref_mean (mean logp - ref_logp), target_mean (mean A/lam), residual_abs_mean,
    approx_kl (k3, old vs new, when old_logp is given).
    """
    if not lam > 0:
        raise ValueError(f"apa lam must be > 0, got {lam}")
    ref_logp = _require(ref_logp, "ref_logp", "apa", "the loss is anchored on the reference policy")
    check_same_shape(logp, "logp", old_logp=old_logp, ref_logp=ref_logp, advantages=advantages)
    valid = as_bool_mask(mask, logp, name="logp")
    logp, ref_logp = fill_masked(logp, valid), fill_masked(ref_logp, valid)
    target = fill_masked(advantages, valid) / lam
    residual = logp - ref_logp - target
    loss = masked_mean(residual.square(), valid)
    with torch.no_grad():
        stats = {
            "log_ratio_ref_mean": masked_mean(logp - ref_logp, valid),
            "target_mean": masked_mean(target, valid),
            "residual_abs_mean": masked_mean(residual.abs(), valid),
            **_approx_kl_old_new(old_logp, logp, valid),
        }
    return loss, stats


@register_policy_loss("awr", settings=lambda c: {"lam": c.awr_lam, "max_weight": c.awr_max_weight})
def awr_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    lam: float = 2.0,
    max_weight: float | None = None,
) -> LossOutput:
    """AWR (APA paper eq. 6): ``-mean(min(exp(A / lam), max_weight) * logp)``, weights detached.

    lam = 1/c_log (reference code c_log = 0.5 for HH: lam 2). exp weights explode for large A:
    `max_weight` caps them. Stats: weight_mean, weight_max, weight_clip_fraction (tokens whose
    weight was capped), approx_kl (k3, old vs new, when old_logp is given).
    """
    if not lam > 0:
        raise ValueError(f"awr lam must be > 0, got {lam}")
    if max_weight is not None and not max_weight > 0:
        raise ValueError(f"awr max_weight must be > 0 or None (off), got {max_weight}")
    check_same_shape(logp, "logp", old_logp=old_logp, ref_logp=ref_logp, advantages=advantages)
    valid = as_bool_mask(mask, logp, name="logp")
    logp = fill_masked(logp, valid)
    with torch.no_grad():
        raw_weights = (fill_masked(advantages, valid) / lam).exp()
        capped = torch.zeros_like(valid) if max_weight is None else raw_weights > max_weight
        weights = raw_weights if max_weight is None else raw_weights.clamp(max=max_weight)
        weights = fill_masked(weights, valid)
    loss = masked_mean(-weights * logp, valid)
    with torch.no_grad():
        stats = {
            "weight_mean": masked_mean(weights, valid),
            "weight_max": masked_max(weights, valid),
            "weight_clip_fraction": masked_mean(capped.float(), valid),
            **_approx_kl_old_new(old_logp, logp, valid),
        }
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor | None,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float | None = None,
) -> LossOutput:
    """Critic loss ``0.5 * mean((V - G)^2)``, or clipped (docs/algorithms.md#15-value-loss; PPO paper §5.4)::

        V_clip = V_old + clip(V - V_old, -eps, eps)
        L      = 0.5 * mean(max((V - G)^2, (V_clip - G)^2))

    Stats: value_clip_fraction (tokens where the clipped term is the larger), explained_variance
    (1 - Var(G - V) / Var(G)), value_mean, return_mean, value_mse (mean (V - G)^2).
    """
    if clip_eps is not None and not clip_eps > 0:
        raise ValueError(f"value clip_eps must be > 0 or None (off), got {clip_eps}")
    if clip_eps is not None and old_values is None:
        raise ValueError("the clipped value loss needs old_values (the critic's values at rollout)")
    check_same_shape(values, "values", old_values=old_values, returns=returns)
    valid = as_bool_mask(mask, values, name="values")
    v, g = fill_masked(values, valid), fill_masked(returns, valid)
    squared_error = (v - g).square()
    clipped_active = torch.zeros_like(valid)
    per_token = squared_error
    if clip_eps is not None:
        assert old_values is not None
        old = fill_masked(old_values, valid)
        moved = v - old
        clipped_error = (old + moved.clamp(-clip_eps, clip_eps) - g).square()
        # inside the region old + (v - old) can round to v +- 1 ulp (v, old of unlike size or sign),
        # so the two errors differ by rounding there: only a value that left the region is clipped
        clipped_active = (moved.abs() > clip_eps) & (clipped_error > squared_error)
        per_token = torch.maximum(squared_error, clipped_error)
    loss = 0.5 * masked_mean(per_token, valid)
    with torch.no_grad():
        stats = {
            "value_clip_fraction": masked_mean(clipped_active.float(), valid),
            "explained_variance": explained_variance(v, g, valid),
            "value_mean": masked_mean(v, valid),
            "return_mean": masked_mean(g, valid),
            "value_mse": masked_mean(squared_error, valid),
        }
    return loss, stats


def micro_batch_weight(mask: Tensor, total_tokens: int | float | Tensor) -> float:
    """``n_tokens(mask) / total_tokens``: the factor on a micro-batch's token-mean loss before backward.

    `total_tokens` counts the valid tokens of the whole minibatch (over every rank if data-parallel).
    A micro-batch with no valid token gets weight 0.
    """
    n_tokens = float((mask != 0).sum())
    total = float(total_tokens)
    if n_tokens == 0:
        return 0.0
    if total < n_tokens:
        raise ValueError(
            f"total_tokens={total:g} is smaller than this micro-batch's {n_tokens:g} valid tokens: "
            "pass the valid-token count of the whole minibatch"
        )
    return n_tokens / total


def token_weighted_accumulate(values: Sequence[Tensor | float], masks: Sequence[Tensor]) -> Tensor:
    """Token-count weighted mean ``sum_i n_i * v_i / sum_i n_i`` of per-micro-batch token means.

    Turns micro-batch losses or stats into the value over the whole minibatch (0 if no token).
    Differentiable: if `values` are live losses, ``.backward()`` on the result gives the minibatch
    gradient (to free memory between micro-batches use ``micro_batch_weight`` instead).
    """
    if len(values) != len(masks):
        raise ValueError(f"got {len(values)} values for {len(masks)} masks: pass one value per micro-batch")
    counts = [float((m != 0).sum()) for m in masks]
    total = sum(counts)
    if total == 0:
        return torch.zeros(())
    return sum(torch.as_tensor(v) * (n / total) for v, n in zip(values, counts))  # type: ignore[return-value]
