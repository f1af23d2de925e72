"""`rlhf dpo`: the SFT model trained directly on preference pairs (docs/algorithms.md §32)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.checks import at_least, positive, require
from rlhf.config.common import OptimConfig
from rlhf.config.supervised import SupervisedConfig, SupervisedDataConfig, SupervisedTrainConfig


@dataclass
class DPODataConfig(SupervisedDataConfig):
    """Preference pairs, every format `rlhf rm` reads (the held-out part gives the evaluation)."""


@dataclass
class DPOTrainConfig(SupervisedTrainConfig):
    """Steps over pairs: batch_size pairs per optimizer step, micro_batch_size per forward/backward."""


@dataclass
class DPOLossConfig:
    # sigmoid: DPO (Rafailov et al. 2023) | ipo: IPO (Azar et al. 2023) | robust: robust DPO
    # (Chowdhury et al. 2024) | simpo: SimPO (Meng et al. 2024), reference-free; docs/algorithms.md §32
    loss: Literal["sigmoid", "ipo", "robust", "simpo"] = "sigmoid"
    # strength of the reference anchor (DPO paper's dialogue value, TRL's default); simpo: the reward
    # scale of a mean token log-prob, larger (the SimPO paper's 2.0-2.5)
    beta: float = 0.1
    # eps: the rate of flipped labels assumed (sigmoid, simpo: cDPO's smoothing; robust: its noise rate)
    label_smoothing: float = 0.0
    # simpo: the target reward margin gamma (TRL's default 0.5; the SimPO paper's 0.5-1.6 with beta 2.0-2.5)
    simpo_gamma: float = 0.5
    # the reference's log-probs of every pair computed once before training (one forward of the
    # data) instead of in every step (one more forward per step, no cache); simpo has no reference
    precompute_reference: bool = True

    def validate(self, prefix: str) -> None:
        positive(self.beta, f"{prefix}beta", 0.1)
        require(
            math.isfinite(self.simpo_gamma) and self.simpo_gamma >= 0,
            f"{prefix}simpo_gamma",
            self.simpo_gamma,
            "must be >= 0 (SimPO's target reward margin)",
            f"--{prefix}simpo_gamma 0.5",
        )
        if self.loss == "robust":
            require(
                0 <= self.label_smoothing < 0.5,
                f"{prefix}label_smoothing",
                self.label_smoothing,
                "must be in [0, 0.5) for dpo.loss robust (it divides by 1 - 2 eps)",
                f"--{prefix}label_smoothing 0.1",
            )
        else:  # cDPO: at 0.5 each label counts as much as its flip (nothing to learn), above it flips them
            require(
                0 <= self.label_smoothing < 0.5,
                f"{prefix}label_smoothing",
                self.label_smoothing,
                "must be in [0, 0.5) (the rate of flipped labels: at 0.5 the pairs carry no preference, above "
                "it the loss learns the flipped one)",
                f"--{prefix}label_smoothing 0.1",
            )
        if self.loss == "ipo":
            require(
                self.label_smoothing == 0,
                f"{prefix}label_smoothing",
                self.label_smoothing,
                "has no meaning for dpo.loss ipo",
                f"--{prefix}label_smoothing 0, or --{prefix}loss robust",
            )


@dataclass
class DPOCheckpointConfig:
    # save a resumable checkpoint (`rlhf dpo --resume`) every N optimizer steps; 0: none (the
    # exported model is the run's only output)
    every: int = 0
    keep: int = 2  # checkpoints kept (older ones removed)

    def validate(self, prefix: str) -> None:
        at_least(self.every, 0, f"{prefix}every", " (0: no checkpoints)")
        at_least(self.keep, 1, f"{prefix}keep")


@dataclass
class DPOConfig(SupervisedConfig):
    model: str = ""  # the SFT model: trained, and (frozen) the reference
    out: str = "runs/dpo"  # run directory
    data: DPODataConfig = field(default_factory=DPODataConfig)
    train: DPOTrainConfig = field(default_factory=DPOTrainConfig)
    optim: OptimConfig = field(
        # the DPO paper's learning rate 1e-6 with a warmup of 150 steps (its appendix B); here 10%
        default_factory=lambda: OptimConfig(lr=1e-6, warmup_fraction=0.1, schedule="linear")
    )
    dpo: DPOLossConfig = field(default_factory=DPOLossConfig)
    checkpoint: DPOCheckpointConfig = field(default_factory=DPOCheckpointConfig)
