"""The groups of `rlhf train` that make the algorithm: score processing, the KL penalty, the
advantage estimator, the policy loss and the critic. Every trick of the PPO paper (§5.3, §5.4) is
its own field here, independent of the others (docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlhf.config.checks import refuse, require, validate_groups, warn
from rlhf.config.fields import AdvantageEstimator, KLEstimator, PolicyLossName
from rlhf.config.keys import When, setting
from rlhf.config.llm_judge import LLMJudgeConfig
from rlhf.config.registry_reads import attributes_read
from rlhf.config.remote import RemoteRewardConfig
from rlhf.core.advantages import ESTIMATORS
from rlhf.core.losses import POLICY_LOSSES


@dataclass
class RewardProcessingConfig:
    scale: bool = False  # reward scaling: divide by the running std (PPO paper §5.3.1)
    normalize: bool = False  # reward normalization: subtract running mean, divide by running std
    clip: float | None = setting(None, "> 0")  # reward clipping to [-clip, clip] after scaling/normalization
    discounted: bool = False  # scaling uses the std of discounted returns (Engstrom et al.); needs scale
    # discount of the running return when discounted is on (< 1)
    discount_gamma: float = setting(0.99, "[0, 1)", when=When("discounted", True))
    # Python reward functions, "module:function" or {name: "module:function", weight: 1.0}, added to the
    # reward model's score (docs/algorithms.md §31); none imported unless named here
    functions: list[Any] = field(default_factory=list)
    # weight of the reward model's score in the sum (with reward functions)
    model_weight: float = setting(1.0, "any", why="negative turns the score into a penalty")
    remote: RemoteRewardConfig = field(default_factory=RemoteRewardConfig)  # a reward server (--reward-url)
    llm_judge: LLMJudgeConfig = field(default_factory=LLMJudgeConfig)  # an LLM judge's score (--judge-url)
    # one weight per reward source, in the order reward model (or --reward-url), LLM judge, then
    # reward.functions (TRL's reward_weights); []: model_weight and each function's own weight
    # (docs/algorithms.md §31)
    weights: list[float] = field(default_factory=list)
    # DAPO soft overlong punishment (DAPO paper §3.4, eq. 13; docs/algorithms.md §37): the share of
    # rollout.max_new_tokens over which the penalty ramps, L_cache = max(1, round(share * budget));
    # a response gets factor * 0 up to budget - L_cache tokens, then linear to -factor at the budget.
    # 0: off (DAPO: 0.2, 4096 of 20480 tokens)
    overlong_buffer: float = setting(0.0, "[0, 1]")
    # the penalty's scale (-factor at the length limit)
    overlong_penalty_factor: float = setting(1.0, ">= 0", when=When("overlong_buffer", ">0"))

    def validate(self, prefix: str) -> None:
        if self.discounted and not (self.scale and not self.normalize):
            refuse(
                f"{prefix}discounted is a variant of reward scaling, but {prefix}scale is {self.scale} and "
                f"{prefix}normalize is {self.normalize}. Fix: --{prefix}scale true --{prefix}normalize false "
                f"(or --{prefix}discounted false).",
                f"{prefix}discounted",
            )
        validate_groups(self, prefix)


@dataclass
class KLConfig:
    # token-level KL penalty coefficient in the reward (PPO paper 0.05); 0: off
    beta: float = setting(0.05, "[0, 10]", why="a penalty in nats per token: above 10 it drowns any reward")
    estimator: KLEstimator = "k1"  # docs/algorithms.md §7
    adaptive: bool = False  # Ziegler et al. adaptive controller instead of a fixed beta
    # adaptive target of the summed per-response KL
    target: float = setting(6.0, "> 0", unit="nats", when=When("adaptive", True))
    # adaptive controller horizon, in samples
    horizon: int = setting(10000, ">= 1", unit="samples", when=When("adaptive", True))

    def validate(self, prefix: str) -> None:
        if self.adaptive and self.beta <= 0:
            refuse(
                f"{prefix}adaptive needs {prefix}beta > 0 as its initial value, got {prefix}beta {self.beta!r}. "
                f"Fix: --{prefix}beta 0.05, or --{prefix}adaptive false.",
                f"{prefix}adaptive",
            )


def read_by(choice: Literal["estimator", "loss"], attribute: str, example: str) -> When:
    """The condition of a key of the advantage or policy group: the group's `choice` (its estimator or
    loss) is one whose registered `settings` function reads `attribute` (registry_reads.py). Read
    from the registry when checked, so one registered later counts."""

    def registry() -> dict[str, Any]:
        return ESTIMATORS if choice == "estimator" else POLICY_LOSSES

    def reads(name: Any) -> bool:
        if name not in registry():
            return False
        group = AdvantageConfig() if choice == "estimator" else PolicyLossConfig()
        return attribute in attributes_read(registry()[name].settings, group)

    def says(key: str) -> str:
        return f"{key} is one that reads it ({', '.join(n for n in registry() if reads(n))})"

    return When(choice, reads, says=says, fix=f"--{{key}} {example}", example=example)


@dataclass
class AdvantageConfig:
    # "gae" (critic) | "grpo" | "dr_grpo" | "rloo" (groups, no critic) | "reinforce_pp" (no critic);
    # any estimator registered in rlhf.core.advantages (docs/algorithms.md §27)
    estimator: AdvantageEstimator = "gae"
    gamma: float = setting(1.0, "[0, 1]", when=read_by("estimator", "gamma", "gae"))  # discount
    lam: float = setting(0.95, "[0, 1]", when=read_by("estimator", "lam", "gae"))  # GAE lambda
    whiten: bool = True  # advantage normalization per minibatch (PPO paper §5.3.1)
    # clip whitened advantages to [-clip, clip] (the PPO paper tries 0.12, 0.5, 0.8)
    clip: float | None = setting(None, "> 0")
    # grpo: added to the group std before dividing
    group_eps: float = setting(1e-6, ">= 0", when=read_by("estimator", "group_eps", "grpo"))
    # grpo: divide by the group std (false: the mean-centred reward only)
    std_normalize: bool = setting(True, when=read_by("estimator", "std_normalize", "grpo"))


@dataclass
class OnlineDPOConfig:
    """Online DPO's preference loss on each sampled pair (docs/algorithms.md §45)."""

    # sigmoid: DPO | ipo: IPO | robust: robust DPO (rlhf.core.preference_loss, docs/algorithms.md §32)
    loss: Literal["sigmoid", "ipo", "robust"] = "sigmoid"
    # strength of the reference anchor (TRL's OnlineDPOConfig default, the DPO paper's dialogue value)
    beta: float = setting(
        0.1, "(0, 100]", why="it scales the loss's logits: above 100 one token saturates it"
    )
    # eps: the rate of flipped preferences assumed (sigmoid: cDPO's smoothing; robust: its noise rate)
    label_smoothing: float = setting(0.0, "[0, 0.5)", when=When("loss", ("sigmoid", "robust")))


@dataclass
class PolicyLossConfig:
    # "ppo" | "apa" | "awr" | "gspo" | "cispo" | "online_dpo" | any loss registered in rlhf.core.losses
    loss: PolicyLossName = "ppo"
    # online_dpo: the pairs' preference loss (docs/algorithms.md §45)
    dpo: OnlineDPOConfig = setting(factory=OnlineDPOConfig, when=When("loss", "online_dpo"))
    # PPO ratio clip: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high] (below 1: a lower bound above 0)
    clip_eps: float = setting(0.2, "(0, 1)", when=read_by("loss", "clip_eps", "ppo"))
    # the upper bound's epsilon; None: clip_eps. DAPO's clip-higher 0.28 (DAPO paper §3.1; docs/algorithms.md §35)
    clip_eps_high: float | None = setting(None, "> 0", when=read_by("loss", "clip_eps_high", "ppo"))
    # dual-clip constant c > 1 for negative advantages; None: off
    dual_clip: float | None = setting(None, "> 1", when=read_by("loss", "dual_clip", "ppo"))
    # cispo: its weight's lower bound 1 - this; None: none (MiniMax-M1 §3.1; docs/algorithms.md §42)
    cispo_clip_eps_low: float | None = setting(
        None, "(0, 1]", when=read_by("loss", "cispo_clip_eps_low", "cispo")
    )
    # Clip-Cov / KL-Cov on the ppo loss (Cui et al. 2025 §4.3; docs/algorithms.md §43): "none" | "clip_cov"
    # (detach the gradient of a random cov_ratio of the tokens whose covariance lies in
    # (clip_cov_low, clip_cov_high)) | "kl_cov" (penalise |logp - old_logp| on the top cov_ratio)
    cov_control: Literal["none", "clip_cov", "kl_cov"] = "none"
    # the share of a minibatch's tokens selected (the paper's code: 2e-4)
    cov_ratio: float = setting(2e-4, "(0, 1]", when=When("cov_control", ("clip_cov", "kl_cov")))
    # Clip-Cov's band of covariance (the paper's code: 1 and 5)
    clip_cov_low: float = setting(
        1.0, "any", when=When("cov_control", "clip_cov"), why="a covariance of either sign bounds the band"
    )
    clip_cov_high: float = setting(
        5.0, "any", when=When("cov_control", "clip_cov"), why="a covariance of either sign bounds the band"
    )
    # KL-Cov's penalty coefficient (the paper's code: 1)
    kl_cov_coef: float = setting(1.0, ">= 0", when=When("cov_control", "kl_cov"))
    # importance-sampling denominator: "old" (behaviour policy) | "ref" (PPO paper §5.3.2)
    ratio_against: Literal["old", "ref"] = setting("old", when=read_by("loss", "ratio_against", "ppo"))
    # APA lambda (= 1/c_sq of the APA code, which uses c_sq = 10)
    apa_lam: float = setting(0.1, "> 0", when=read_by("loss", "apa_lam", "apa"))
    # AWR temperature (the APA code's c_log = 1/lam = 0.5)
    awr_lam: float = setting(2.0, "> 0", when=read_by("loss", "awr_lam", "awr"))
    # AWR weight clip; None: off
    awr_max_weight: float | None = setting(20.0, "> 0", when=read_by("loss", "awr_max_weight", "awr"))
    # entropy bonus (PPO paper §5.3.2: sensitive, off by default)
    entropy_coef: float = setting(0.0, ">= 0")
    # with a target: the term is entropy_coef * max(|H - target| - entropy_clip, 0) instead of
    # -entropy_coef * H, pulling the token-mean entropy H (nats) into a region around the target
    # (PPO paper appendix B.3); None: the plain bonus
    entropy_target: float | None = setting(None, ">= 0", unit="nats")
    # half-width of that region (0: the authors' code's |H - target|)
    entropy_clip: float = setting(0.0, ">= 0", unit="nats", when=When("entropy_target", "set", example=2.0))
    ptx_coef: float = setting(0.0, ">= 0")  # PPO-ptx: weight of the SFT loss on data.ptx (needs data.ptx)
    # KL(pi || pi_ref) added to the loss per token (GRPO eq. 3: 0.04); 0: off
    kl_loss_coef: float = setting(0.0, ">= 0")
    # estimator of the KL in the loss (GRPO: k3)
    kl_loss_estimator: KLEstimator = setting("k3", when=When("kl_loss_coef", ">0"))
    # "token_mean": loss / valid tokens | "fixed_length": loss / (rows * rollout.max_new_tokens) (Dr. GRPO)
    loss_aggregation: Literal["token_mean", "fixed_length"] = "token_mean"
    # rollout.max_staleness > 0: the decoupled PPO weight pi_prox / pi_behav of each token truncated
    # at this value (docs/algorithms.md §34); below 1 it cuts weights the correction needs at 1
    is_truncation: float = setting(
        2.0,
        ">= 1",
        when=When("rollout.max_staleness", ">0", root=True, says="{key} > 0 (asynchronous rollouts)"),
    )

    def validate(self, prefix: str) -> None:
        if self.entropy_target is not None and self.entropy_coef == 0:
            warn(
                "%sentropy_target is set but %sentropy_coef is 0: the entropy term is off. "
                "Fix: --%sentropy_coef 0.01 (PPO paper appendix B.3).",
                prefix,
                prefix,
                prefix,
            )
        self._validate_new_losses(prefix)

    def _validate_new_losses(self, prefix: str) -> None:
        """GSPO's row mean, CISPO's bounds, Clip-Cov/KL-Cov's settings (docs/algorithms.md §41-43)."""
        if self.loss == "cispo" and self.clip_eps_high is None:
            refuse(
                f"{prefix}loss cispo caps its importance weight at 1 + {prefix}clip_eps_high, which is null. "
                f"Fix: --{prefix}clip_eps_high 4.0 (the ScaleRL recipe's cap of 5), or --preset cispo.",
                f"{prefix}clip_eps_high",
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
            self.clip_cov_low < self.clip_cov_high,
            f"{prefix}clip_cov_high",
            self.clip_cov_high,
            f"must exceed {prefix}clip_cov_low ({self.clip_cov_low})",
            f"--{prefix}clip_cov_low 1.0 --{prefix}clip_cov_high 5.0",
        )


PRETRAIN = When("pretrain_iterations", ">0")  # the critic pre-training's own settings


@dataclass
class CriticConfig:
    # clipped value loss (docs/algorithms.md §15); None: unclipped
    value_clip: float | None = setting(0.2, "> 0")
    # value-only iterations before policy updates (PPO paper §5.3.3)
    pretrain_iterations: int = setting(0, ">= 0", unit="iterations")
    # stop pre-training after this many iterations without improvement
    pretrain_patience: int = setting(3, ">= 1", unit="iterations", when=PRETRAIN)
    # relative value-loss improvement that counts
    pretrain_min_delta: float = setting(0.01, ">= 0", when=PRETRAIN)
