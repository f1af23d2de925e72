"""Pure tensor math of RLHF: no models, no I/O (names: docs/internals.md; formulas: docs/algorithms.md).

Tensors are ``[B, T]`` over response tokens, right-padded, with a 0/1 `mask` of the same shape.
Means are token means over the whole batch. No function reads values at masked positions, and a
fully masked input gives zeros, never NaN.
"""

from rlhf.core.advantages import (
    ESTIMATORS,
    AdvantageSettings,
    EstimatorSpec,
    estimate_advantages,
    estimator_params,
    estimator_spec,
    gae,
    register_estimator,
)
from rlhf.core.cispo import cispo_loss
from rlhf.core.covariance import covariance_selection, token_covariance
from rlhf.core.dapo import informative_groups, overlong_penalty
from rlhf.core.entropy import entropy_from_logits, entropy_target_gate, entropy_target_loss
from rlhf.core.gspo import gspo_loss
from rlhf.core.kl import AdaptiveKLController, FixedKLController
from rlhf.core.losses import (
    KL_KINDS,
    POLICY_LOSSES,
    PolicyLossSettings,
    PolicyLossSpec,
    apa_loss,
    awr_loss,
    kl_estimate,
    loss_unit_count,
    micro_batch_weight,
    policy_loss,
    policy_loss_params,
    policy_loss_spec,
    policy_loss_unit,
    ppo_loss,
    register_policy_loss,
    token_weighted_accumulate,
    value_loss,
)
from rlhf.core.online_dpo import ONLINE_DPO_LOSSES, online_dpo_loss, pair_preference, preference_pairs
from rlhf.core.preference import PREFERENCE_LOSSES, REFERENCE_FREE, preference_loss
from rlhf.core.rewards import ScoreProcessor, token_rewards
from rlhf.core.rollout_correction import rollout_correction
from rlhf.core.staleness import decoupled_is_weights
from rlhf.core.stats import (
    RunningMoments,
    explained_variance,
    masked_max,
    masked_mean,
    masked_min,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "ESTIMATORS",
    "KL_KINDS",
    "POLICY_LOSSES",
    "ONLINE_DPO_LOSSES",
    "PREFERENCE_LOSSES",
    "REFERENCE_FREE",
    "decoupled_is_weights",
    "AdaptiveKLController",
    "AdvantageSettings",
    "EstimatorSpec",
    "FixedKLController",
    "PolicyLossSettings",
    "PolicyLossSpec",
    "RunningMoments",
    "ScoreProcessor",
    "apa_loss",
    "awr_loss",
    "cispo_loss",
    "covariance_selection",
    "entropy_from_logits",
    "entropy_target_gate",
    "entropy_target_loss",
    "estimate_advantages",
    "estimator_params",
    "estimator_spec",
    "explained_variance",
    "gae",
    "gspo_loss",
    "informative_groups",
    "kl_estimate",
    "loss_unit_count",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "online_dpo_loss",
    "pair_preference",
    "micro_batch_weight",
    "overlong_penalty",
    "policy_loss",
    "policy_loss_params",
    "policy_loss_spec",
    "policy_loss_unit",
    "ppo_loss",
    "preference_loss",
    "preference_pairs",
    "register_estimator",
    "register_policy_loss",
    "rollout_correction",
    "token_covariance",
    "token_rewards",
    "token_weighted_accumulate",
    "value_loss",
]
