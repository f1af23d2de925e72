"""The groups of `rlhf train` that make the algorithm: score processing, the KL penalty, the
advantage estimator, the policy loss and the critic. Every trick of the PPO paper (§5.3, §5.4) is
its own field here, independent of the others (docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlhf.config.checks import (
    at_least,
    fraction,
    positive,
    positive_or_off,
    refuse,
    require,
    validate_groups,
    warn,
)
from rlhf.config.fields import AdvantageEstimator, KLEstimator, PolicyLossName
from rlhf.config.remote import RemoteRewardConfig


@dataclass
class RewardProcessingConfig:
    scale: bool = False  # reward scaling: divide by the running std (PPO paper §5.3.1)
    normalize: bool = False  # reward normalization: subtract running mean, divide by running std
    clip: float | None = None  # reward clipping to [-clip, clip] after scaling/normalization
    discounted: bool = False  # scaling uses the std of discounted returns (Engstrom et al.); needs scale
    discount_gamma: float = 0.99  # discount of the running return when discounted is on (< 1)
    # Python reward functions, "module:function" or {name: "module:function", weight: 1.0}, added to the
    # reward model's score (docs/algorithms.md §31); none imported unless named here
    functions: list[Any] = field(default_factory=list)
    model_weight: float = 1.0  # weight of the reward model's score in the sum (with reward functions)
    remote: RemoteRewardConfig = field(default_factory=RemoteRewardConfig)  # a reward server (--reward-url)
    # DAPO soft overlong punishment (DAPO paper §3.4, eq. 13; docs/algorithms.md §37): the share of
    # rollout.max_new_tokens over which the penalty ramps, L_cache = max(1, round(share * budget));
    # a response gets factor * 0 up to budget - L_cache tokens, then linear to -factor at the budget.
    # 0: off (DAPO: 0.2, 4096 of 20480 tokens)
    overlong_buffer: float = 0.0
    overlong_penalty_factor: float = 1.0  # the penalty's scale (-factor at the length limit)

    def validate(self, prefix: str) -> None:
        if self.discounted and not (self.scale and not self.normalize):
            refuse(
                f"{prefix}discounted is a variant of reward scaling, but {prefix}scale is {self.scale} and "
                f"{prefix}normalize is {self.normalize}. Fix: --{prefix}scale true --{prefix}normalize false "
                f"(or --{prefix}discounted false).",
                f"{prefix}discounted",
            )
        fraction(self.discount_gamma, f"{prefix}discount_gamma", 0.99)
        fraction(self.overlong_buffer, f"{prefix}overlong_buffer", 0.2, closed=True)
        at_least(self.overlong_penalty_factor, 0, f"{prefix}overlong_penalty_factor")
        positive_or_off(self.clip, f"{prefix}clip", 10.0)
        validate_groups(self, prefix)


@dataclass
class KLConfig:
    beta: float = 0.05  # token-level KL penalty coefficient in the reward (PPO paper 0.05); 0: off
    estimator: KLEstimator = "k1"  # docs/algorithms.md §7
    adaptive: bool = False  # Ziegler et al. adaptive controller instead of a fixed beta
    target: float = 6.0  # adaptive target of the summed per-response KL
    horizon: int = 10000  # adaptive controller horizon, in samples

    def validate(self, prefix: str) -> None:
        at_least(self.beta, 0, f"{prefix}beta", " (0 turns the KL penalty off)")
        if self.adaptive and self.beta <= 0:
            refuse(
                f"{prefix}adaptive needs {prefix}beta > 0 as its initial value, got {prefix}beta {self.beta!r}. "
                f"Fix: --{prefix}beta 0.05, or --{prefix}adaptive false.",
                f"{prefix}adaptive",
            )
        positive(self.target, f"{prefix}target", 6.0)
        at_least(self.horizon, 1, f"{prefix}horizon")


@dataclass
class AdvantageConfig:
    # "gae" (critic) | "grpo" | "dr_grpo" | "rloo" (groups, no critic) | "reinforce_pp" (no critic);
    # any estimator registered in rlhf.core.advantages (docs/algorithms.md §27)
    estimator: AdvantageEstimator = "gae"
    gamma: float = 1.0  # discount
    lam: float = 0.95  # GAE lambda
    whiten: bool = True  # advantage normalization per minibatch (PPO paper §5.3.1)
    clip: float | None = (
        None  # clip whitened advantages to [-clip, clip] (the PPO paper tries 0.12, 0.5, 0.8)
    )
    group_eps: float = 1e-6  # grpo: added to the group std before dividing
    std_normalize: bool = True  # grpo: divide by the group std (false: the mean-centred reward only)

    def validate(self, prefix: str) -> None:
        fraction(self.gamma, f"{prefix}gamma", 1.0, closed=True)
        fraction(self.lam, f"{prefix}lam", 0.95, closed=True)
        positive_or_off(self.clip, f"{prefix}clip", 0.5)
        at_least(self.group_eps, 0, f"{prefix}group_eps")


@dataclass
class PolicyLossConfig:
    # "ppo" | "apa" | "awr" | "gspo" | "cispo" | any loss registered in rlhf.core.losses
    loss: PolicyLossName = "ppo"
    clip_eps: float = 0.2  # PPO ratio clip: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]
    # the upper bound's epsilon; None: clip_eps. DAPO's clip-higher 0.28 (DAPO paper §3.1; docs/algorithms.md §35)
    clip_eps_high: float | None = None
    dual_clip: float | None = None  # dual-clip constant c > 1 for negative advantages; None: off
    # cispo: its weight's lower bound 1 - this; None: none (MiniMax-M1 §3.1; docs/algorithms.md §42)
    cispo_clip_eps_low: float | None = None
    # Clip-Cov / KL-Cov on the ppo loss (Cui et al. 2025 §4.3; docs/algorithms.md §43): "none" | "clip_cov"
    # (detach the gradient of a random cov_ratio of the tokens whose covariance lies in
    # (clip_cov_low, clip_cov_high)) | "kl_cov" (penalise |logp - old_logp| on the top cov_ratio)
    cov_control: Literal["none", "clip_cov", "kl_cov"] = "none"
    cov_ratio: float = 2e-4  # the share of a minibatch's tokens selected (the paper's code: 2e-4)
    clip_cov_low: float = 1.0  # Clip-Cov's band of covariance (the paper's code: 1 and 5)
    clip_cov_high: float = 5.0
    kl_cov_coef: float = 1.0  # KL-Cov's penalty coefficient (the paper's code: 1)
    # importance-sampling denominator: "old" (behaviour policy) | "ref" (PPO paper §5.3.2)
    ratio_against: Literal["old", "ref"] = "old"
    apa_lam: float = 0.1  # APA lambda (= 1/c_sq of the APA code, which uses c_sq = 10)
    awr_lam: float = 2.0  # AWR temperature (the APA code's c_log = 1/lam = 0.5)
    awr_max_weight: float | None = 20.0  # AWR weight clip; None: off
    entropy_coef: float = 0.0  # entropy bonus (PPO paper §5.3.2: sensitive, off by default)
    # with a target: the term is entropy_coef * max(|H - target| - entropy_clip, 0) instead of
    # -entropy_coef * H, pulling the token-mean entropy H (nats) into a region around the target
    # (PPO paper appendix B.3); None: the plain bonus
    entropy_target: float | None = None
    entropy_clip: float = 0.0  # half-width of that region (0: the authors' code's |H - target|)
    ptx_coef: float = 0.0  # PPO-ptx: weight of the SFT loss on data.ptx (needs data.ptx)
    kl_loss_coef: float = 0.0  # KL(pi || pi_ref) added to the loss per token (GRPO eq. 3: 0.04); 0: off
    kl_loss_estimator: KLEstimator = "k3"  # estimator of the KL in the loss (GRPO: k3)
    # "token_mean": loss / valid tokens | "fixed_length": loss / (rows * rollout.max_new_tokens) (Dr. GRPO)
    loss_aggregation: Literal["token_mean", "fixed_length"] = "token_mean"
    # rollout.max_staleness > 0: the decoupled PPO weight pi_prox / pi_behav of each token truncated
    # at this value (docs/algorithms.md §34)
    is_truncation: float = 2.0

    def validate(self, prefix: str) -> None:
        positive(self.clip_eps, f"{prefix}clip_eps", 0.2)
        positive_or_off(
            self.clip_eps_high, f"{prefix}clip_eps_high", 0.28, "for the symmetric clip (= clip_eps)"
        )
        positive(self.is_truncation, f"{prefix}is_truncation", 2.0)
        self._validate_new_losses(prefix)
        positive_or_off(self.dual_clip, f"{prefix}dual_clip", 3.0, low=1)
        positive(self.apa_lam, f"{prefix}apa_lam", 0.1)
        positive(self.awr_lam, f"{prefix}awr_lam", 2.0)
        positive_or_off(self.awr_max_weight, f"{prefix}awr_max_weight", 20.0)
        at_least(self.entropy_coef, 0, f"{prefix}entropy_coef")
        at_least(self.entropy_clip, 0, f"{prefix}entropy_clip", " (0: no flat region around the target)")
        require(
            self.entropy_target is None or self.entropy_target >= 0,
            f"{prefix}entropy_target",
            self.entropy_target,
            "must be >= 0 (an entropy in nats), or null for the plain bonus",
            f"--{prefix}entropy_target 2.0",
        )
        if self.entropy_target is not None and self.entropy_coef == 0:
            warn(
                "%sentropy_target is set but %sentropy_coef is 0: the entropy term is off. "
                "Fix: --%sentropy_coef 0.01 (PPO paper appendix B.3).",
                prefix,
                prefix,
                prefix,
            )
        at_least(self.ptx_coef, 0, f"{prefix}ptx_coef")
        at_least(self.kl_loss_coef, 0, f"{prefix}kl_loss_coef", " (0: no KL term in the loss)")

    def _validate_new_losses(self, prefix: str) -> None:
        """GSPO's row mean, CISPO's bounds, Clip-Cov/KL-Cov's settings (docs/algorithms.md §41-43)."""
        if self.loss == "cispo" and self.clip_eps_high is None:
            refuse(
                f"{prefix}loss cispo caps its importance weight at 1 + {prefix}clip_eps_high, which is null. "
                f"Fix: --{prefix}clip_eps_high 4.0 (the ScaleRL recipe's cap of 5), or --preset cispo.",
                f"{prefix}clip_eps_high",
            )
        require(
            self.cispo_clip_eps_low is None or 0 < self.cispo_clip_eps_low <= 1,
            f"{prefix}cispo_clip_eps_low",
            self.cispo_clip_eps_low,
            "must be in (0, 1], or null for no lower bound",
            f"--{prefix}cispo_clip_eps_low 0.2",
        )
        if self.loss == "gspo" and self.loss_aggregation != "token_mean":
            refuse(
                f"{prefix}loss gspo is a mean over responses, which {prefix}loss_aggregation "
                f"{self.loss_aggregation} (a per-token denominator) does not apply to. "
                f"Fix: --{prefix}loss_aggregation token_mean.",
                f"{prefix}loss_aggregation",
            )
        if self.cov_control != "none" and self.loss != "ppo":
            refuse(
                f"{prefix}cov_control {self.cov_control} acts on the ppo loss's tokens, but {prefix}loss is "
                f"{self.loss!r}. Fix: --{prefix}loss ppo, or --{prefix}cov_control none.",
                f"{prefix}cov_control",
            )
        require(
            0 < self.cov_ratio <= 1,
            f"{prefix}cov_ratio",
            self.cov_ratio,
            "must be in (0, 1]",
            f"--{prefix}cov_ratio 2e-4",
        )
        require(
            self.clip_cov_low < self.clip_cov_high,
            f"{prefix}clip_cov_high",
            self.clip_cov_high,
            f"must exceed {prefix}clip_cov_low ({self.clip_cov_low})",
            f"--{prefix}clip_cov_low 1.0 --{prefix}clip_cov_high 5.0",
        )
        at_least(self.kl_cov_coef, 0, f"{prefix}kl_cov_coef")


@dataclass
class CriticConfig:
    value_clip: float | None = 0.2  # clipped value loss (docs/algorithms.md §15); None: unclipped
    pretrain_iterations: int = 0  # value-only iterations before policy updates (PPO paper §5.3.3)
    pretrain_patience: int = 3  # stop pre-training after this many iterations without improvement
    pretrain_min_delta: float = 0.01  # relative value-loss improvement that counts

    def validate(self, prefix: str) -> None:
        positive_or_off(self.value_clip, f"{prefix}value_clip", 0.2)
        at_least(self.pretrain_iterations, 0, f"{prefix}pretrain_iterations")
        at_least(self.pretrain_patience, 1, f"{prefix}pretrain_patience")
        at_least(self.pretrain_min_delta, 0, f"{prefix}pretrain_min_delta")
