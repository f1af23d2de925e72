"""What `rlhf sft` and `rlhf rm` share: the data file and its budgets, the step and evaluation
cadence, and the stage's top-level settings. `sft.py` and `rm.py` specialize them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.checks import at_least, fraction, positive, require, token_budget, validate_groups
from rlhf.config.common import (
    DistConfig,
    LoraConfig,
    OptimConfig,
    compile_backend_known,
    compile_needs_no_fsdp2,
)
from rlhf.config.fields import ChatTemplate, DataFormat, Dtype, SystemPrompt


@dataclass
class SupervisedDataConfig:
    path: str = ""  # the data file (.jsonl/.json/.parquet)
    format: DataFormat = "auto"  # "auto": detected from the first valid record
    test_fraction: float = 0.05  # held out for the evaluation
    max_prompt_tokens: int = 256  # longer prompts drop their oldest turns, then left-truncate
    max_response_tokens: int = 256  # longer responses right-truncate (EOS kept)
    skip_invalid: bool = False  # skip malformed lines (counted) instead of stopping
    chat_template: ChatTemplate = "auto"  # fields.ChatTemplate
    system_prompt: SystemPrompt = "template"  # the template's default system prompt (fields.SystemPrompt)

    def validate(self, prefix: str) -> None:
        fraction(self.test_fraction, f"{prefix}test_fraction", 0.05)
        at_least(self.max_prompt_tokens, 1, f"{prefix}max_prompt_tokens")
        at_least(self.max_response_tokens, 1, f"{prefix}max_response_tokens")


@dataclass
class SupervisedTrainConfig:
    epochs: float = 1.0  # passes over the training data (fractional allowed)
    max_steps: int | None = None  # stop after this many optimizer steps (overrides epochs)
    batch_size: int = 16  # examples per optimizer step
    micro_batch_size: int = 8  # examples per forward/backward (gradient accumulation)
    # micro-batches cut by tokens instead: each step's rows sorted longest first, as many per
    # forward/backward as fit rows x longest row <= N (a longer row alone; rm/dpo: a pair's both
    # rows); the same gradient and metrics to float rounding (docs/speed.md). None or 0: by rows
    micro_batch_tokens: int | None = None
    # sequence packing: a forward's rows laid end to end in fewer rows, positions restarting and
    # attention kept within each sequence; micro-batches cut by packed tokens (micro_batch_tokens,
    # else micro_batch_size x the longest row). The same losses and metrics (docs/speed.md)
    packing: bool = False
    # torch.compile the trained model's forwards with gradients on (docs/speed.md "Compiled training
    # forwards"): fewer, fused kernels where launching ops bounds a step (small models on a GPU); the
    # first steps pay the compile; evaluation runs uncompiled. Not with dist.strategy fsdp2
    compile: bool = False
    compile_backend: str = "inductor"  # torch.compile's backend ("aot_eager": a quick check, no speed-up)
    # less padding (docs/padding.md): "within_step" sorts each step's rows by length before cutting
    # micro-batches (the same step gradient, to float rounding) | "across_steps" also makes steps of
    # similar-length rows (HF group_by_length: another random order) | "none"
    group_by_length: Literal["none", "within_step", "across_steps"] = "within_step"
    eval_every: int = 100  # evaluate every N steps (and at the end)
    log_every: int = 10  # write metrics every N steps
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N"

    def validate(self, prefix: str) -> None:
        positive(self.epochs, f"{prefix}epochs", 1)
        require(
            self.max_steps is None or self.max_steps >= 1,
            f"{prefix}max_steps",
            self.max_steps,
            f"must be >= 1 (or null to run {prefix}epochs)",
            f"--{prefix}max_steps 1 or more",
        )
        at_least(self.batch_size, 1, f"{prefix}batch_size", " (examples per optimizer step)")
        at_least(self.micro_batch_size, 1, f"{prefix}micro_batch_size", " (examples per forward/backward)")
        token_budget(self.micro_batch_tokens, f"{prefix}micro_batch_tokens")
        at_least(self.log_every, 1, f"{prefix}log_every")
        at_least(self.eval_every, 0, f"{prefix}eval_every", " (0: evaluate at the end only)")


@dataclass
class SupervisedConfig:
    """The settings of `rlhf sft` and `rlhf rm` outside their data and train groups."""

    model: str = ""  # the model to train: a save_pretrained directory, a hub id (online) or a GGUF directory
    gguf_file: str | None = None  # GGUF file name inside `model` (loads through transformers)
    out: str = "runs/supervised"  # run directory
    seed: int = 0  # seed of data order and initialization
    data: SupervisedDataConfig = field(default_factory=SupervisedDataConfig)
    train: SupervisedTrainConfig = field(default_factory=SupervisedTrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    dtype: Dtype = "auto"  # precision of the trained model (fields.Dtype; rlhf/models/precision.py)
    # recompute each decoder layer in the backward: activations of one layer kept instead of all
    gradient_checkpointing: bool = False
    sinks: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # + "tensorboard", "wandb"
    dist: DistConfig = field(default_factory=DistConfig)  # torchrun: data-parallel ranks

    def validate(self, prefix: str = "") -> None:
        validate_groups(self, prefix)
        compile_needs_no_fsdp2(self.train.compile, self.dist.strategy, prefix)
        if self.train.compile:
            compile_backend_known(self.train.compile_backend, f"{prefix}train.compile_backend")
