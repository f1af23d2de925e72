"""`rlhf sft`: supervised fine-tuning of a causal LM on prompt/response data."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhf.config.common import OptimConfig
from rlhf.config.supervised import SupervisedConfig, SupervisedDataConfig, SupervisedTrainConfig


@dataclass
class SFTDataConfig(SupervisedDataConfig):
    """SFT data: prompt/response, prompt/completion or chat messages (the held-out part gives the
    evaluation loss and perplexity)."""


@dataclass
class SFTTrainConfig(SupervisedTrainConfig):
    """Steps over examples: batch_size examples per optimizer step."""


@dataclass
class SFTConfig(SupervisedConfig):
    model: str = ""  # base model: a save_pretrained directory, a hub id (online) or a GGUF directory
    out: str = "runs/sft"  # run directory
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=2e-5, warmup_steps=10, schedule="cosine")
    )
