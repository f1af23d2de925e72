"""`rlhf rm`: a reward model trained on preference pairs (ranking loss + LM loss)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.checks import refuse
from rlhf.config.common import OptimConfig
from rlhf.config.keys import When, setting
from rlhf.config.supervised import SupervisedConfig, SupervisedDataConfig, SupervisedTrainConfig


@dataclass
class RewardDataConfig(SupervisedDataConfig):
    """Preference pairs: prompt/chosen/rejected, HH-RLHF dialogues, or chat messages (the held-out
    part gives the accuracy and margins)."""


BY_TOKENS = When("batching", "tokens")  # the settings of token-budget batching


@dataclass
class RewardTrainConfig(SupervisedTrainConfig):
    """Steps over pairs (batch_size, micro_batch_size: pairs): a fixed number per step, or about
    `max_tokens` tokens per step. About one epoch, as in the PPO paper §4.2."""

    # "pairs": batch_size pairs per step | "tokens": about max_tokens per step (PPO paper §4)
    batching: Literal["pairs", "tokens"] = "pairs"
    # tokens per step when batching == "tokens"
    max_tokens: int = setting(8192, ">= 1", unit="tokens", when=BY_TOKENS)
    # pairs per step when batching == "tokens" (PPO paper §4.2: at least 4, at most 128); the
    # minimum wins over max_tokens for long pairs
    min_batch: int = setting(4, ">= 1", unit="pairs", when=BY_TOKENS)
    max_batch: int = setting(128, ">= 1", unit="pairs", when=BY_TOKENS)
    # beta_rm: weight of the LM imitation loss on the chosen response (PPO paper: 1, its code: 0)
    lm_coef: float = setting(1.0, ">= 0")

    def validate(self, prefix: str) -> None:
        if self.max_batch < self.min_batch:
            refuse(
                f"{prefix}max_batch ({self.max_batch!r}) must be >= {prefix}min_batch ({self.min_batch!r}). "
                f"Fix: --{prefix}max_batch 128 --{prefix}min_batch 4.",
                f"{prefix}max_batch",
            )


@dataclass
class RewardConfig(SupervisedConfig):
    model: str = ""  # initialization: usually the SFT run directory
    out: str = "runs/rm"  # run directory; the best checkpoint (by held-out accuracy) lands in it
    data: RewardDataConfig = field(default_factory=RewardDataConfig)
    train: RewardTrainConfig = field(default_factory=RewardTrainConfig)
    optim: OptimConfig = field(
        # PPO paper §4.2: lr 5e-6, warmup over the first 10% of the steps
        default_factory=lambda: OptimConfig(lr=5e-6, warmup_fraction=0.1, schedule="cosine")
    )
