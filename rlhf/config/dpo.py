"""`rlhf dpo`: the SFT model trained directly on preference pairs (docs/algorithms.md §32)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.common import OptimConfig
from rlhf.config.keys import When, setting
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
    beta: float = setting(
        0.1, "(0, 100]", why="it scales the loss's logits: above 100 one token saturates it"
    )
    # eps: the rate of flipped labels assumed (sigmoid, simpo: cDPO's smoothing; robust: its noise rate);
    # at 0.5 the pairs carry no preference, above it the loss learns the flipped one (robust divides by 1 - 2 eps)
    label_smoothing: float = setting(0.0, "[0, 0.5)", when=When("loss", ("sigmoid", "robust", "simpo")))
    # simpo: the target reward margin gamma (TRL's default 0.5; the SimPO paper's 0.5-1.6 with beta 2.0-2.5)
    simpo_gamma: float = setting(0.5, ">= 0", when=When("loss", "simpo"))
    # the reference's log-probs of every pair computed once before training (one forward of the
    # data) instead of in every step (one more forward per step, no cache); simpo has no reference
    precompute_reference: bool = setting(True, when=When("loss", ("sigmoid", "ipo", "robust")))


@dataclass
class DPOCheckpointConfig:
    # save a resumable checkpoint (`rlhf dpo --resume`) every N optimizer steps; 0: none (the
    # exported model is the run's only output)
    every: int = setting(0, ">= 0", unit="optimizer steps")
    # checkpoints kept (older ones removed)
    keep: int = setting(2, ">= 1", when=When("every", ">0", says="{key} > 0 (checkpoints are saved)"))


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
