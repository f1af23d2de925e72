"""What `rlhf sft` and `rlhf rm` share: the data file and its budgets, the step and evaluation
cadence, and the stage's top-level settings. `sft.py` and `rm.py` specialize them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.checks import validate_groups
from rlhf.config.common import (
    DistConfig,
    LoraConfig,
    OptimConfig,
    compile_backend_known,
    compile_needs_no_fsdp2,
)
from rlhf.config.fields import ChatTemplate, DataFormat, Dtype, SystemPrompt
from rlhf.config.keys import When, check_ranges, setting


@dataclass
class SupervisedDataConfig:
    path: str = ""  # the data file (.jsonl/.json/.parquet)
    format: DataFormat = "auto"  # "auto": detected from the first valid record
    test_fraction: float = setting(0.05, "[0, 1)")  # held out for the evaluation
    # longer prompts drop their oldest turns, then left-truncate
    max_prompt_tokens: int = setting(256, ">= 1", unit="tokens")
    # longer responses right-truncate (EOS kept)
    max_response_tokens: int = setting(256, ">= 1", unit="tokens")
    skip_invalid: bool = False  # skip malformed lines (counted) instead of stopping
    chat_template: ChatTemplate = "auto"  # fields.ChatTemplate
    system_prompt: SystemPrompt = "template"  # the template's default system prompt (fields.SystemPrompt)


@dataclass
class SupervisedTrainConfig:
    epochs: float = setting(1.0, "> 0")  # passes over the training data (fractional allowed)
    # stop after this many optimizer steps (overrides epochs)
    max_steps: int | None = setting(None, ">= 1", unit="optimizer steps")
    batch_size: int = setting(16, ">= 1", unit="examples")  # examples per optimizer step
    # examples per forward/backward (gradient accumulation)
    micro_batch_size: int = setting(8, ">= 1", unit="examples")
    # micro-batches cut by tokens instead: each step's rows sorted longest first, as many per
    # forward/backward as fit rows x longest row <= N (a longer row alone; rm/dpo: a pair's both
    # rows); the same gradient and metrics to float rounding (docs/speed.md). None or 0: by rows
    micro_batch_tokens: int | None = setting(None, ">= 0", unit="tokens")
    # sequence packing: a forward's rows laid end to end in fewer rows, positions restarting and
    # attention kept within each sequence; micro-batches cut by packed tokens (micro_batch_tokens,
    # else micro_batch_size x the longest row). The same losses and metrics (docs/speed.md)
    packing: bool = False
    # torch.compile the trained model's forwards with gradients on (docs/speed.md "Compiled training
    # forwards"): fewer, fused kernels where launching ops bounds a step (small models on a GPU); the
    # first steps pay the compile; evaluation runs uncompiled. Not with dist.strategy fsdp2
    compile: bool = False
    # torch.compile's backend ("aot_eager": a quick check, no speed-up)
    compile_backend: str = setting("inductor", when=When("compile", True))
    # less padding (docs/padding.md): "within_step" sorts each step's rows by length before cutting
    # micro-batches (the same step gradient, to float rounding) | "across_steps" also makes steps of
    # similar-length rows (HF group_by_length: another random order) | "none"
    group_by_length: Literal["none", "within_step", "across_steps"] = "within_step"
    # evaluate every N steps (and at the end); 0: at the end only
    eval_every: int = setting(100, ">= 0", unit="optimizer steps")
    log_every: int = setting(10, ">= 1", unit="optimizer steps")  # write metrics every N steps
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N"


@dataclass
class SupervisedConfig:
    """The settings of `rlhf sft` and `rlhf rm` outside their data and train groups."""

    model: str = ""  # the model to train: a save_pretrained directory, a hub id (online) or a GGUF directory
    gguf_file: str | None = None  # GGUF file name inside `model` (loads through transformers)
    out: str = "runs/supervised"  # run directory
    # seed of data order and initialization
    seed: int = setting(0, "any", why="every integer seeds the generators")
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
        check_ranges(self, prefix)
        validate_groups(self, prefix)
        compile_needs_no_fsdp2(self.train.compile, self.dist.strategy, prefix)
        if self.train.compile:
            compile_backend_known(self.train.compile_backend, f"{prefix}train.compile_backend")
