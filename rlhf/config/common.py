"""The groups several stages share: the optimizer, LoRA adapters and data parallelism."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhf.config.checks import at_least, fraction, positive, positive_or_off, require


@dataclass
class LoraConfig:
    enabled: bool = False  # train LoRA adapters instead of all weights (PEFT)
    r: int = 8  # adapter rank
    alpha: int = 16  # adapter scaling numerator
    dropout: float = 0.0  # adapter dropout (keep 0 for an exact first PPO ratio)
    target_modules: list[str] | None = (
        None  # None: PEFT's default for the architecture (Llama: q_proj, v_proj)
    )

    def validate(self, prefix: str) -> None:
        if not self.enabled:  # the adapter settings of a run without LoRA are never read
            return
        at_least(self.r, 1, f"{prefix}r")
        positive(self.alpha, f"{prefix}alpha", 16)
        fraction(self.dropout, f"{prefix}dropout", 0.0)


@dataclass
class OptimConfig:
    lr: float = 1e-5  # peak learning rate (AdamW)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas (PPO paper, OpenRLHF)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    warmup_steps: int = 0  # linear warmup steps from 0 to lr
    # warmup over this fraction of the optimizer steps (PPO paper §5.1: 0.1); the longer of the two wins
    warmup_fraction: float = 0.0
    schedule: Literal["constant", "cosine", "linear"] = "constant"  # decay after the warmup
    min_lr_ratio: float = 0.0  # floor of the cosine/linear decay, as a fraction of lr
    # global gradient-norm clipping (PPO paper §5.4 and appendix C.2); None: off
    max_grad_norm: float | None = 1.0

    def validate(self, prefix: str) -> None:
        positive(self.lr, f"{prefix}lr", "1e-5", " (0 trains nothing)")
        require(
            all(0 <= b < 1 for b in self.betas),
            f"{prefix}betas",
            list(self.betas),
            "must be two numbers in [0, 1)",
            f"--{prefix}betas [0.9,0.95]",
        )
        at_least(self.weight_decay, 0, f"{prefix}weight_decay")
        at_least(self.warmup_steps, 0, f"{prefix}warmup_steps")
        fraction(self.warmup_fraction, f"{prefix}warmup_fraction", 0.1)
        fraction(self.min_lr_ratio, f"{prefix}min_lr_ratio", 0.0, closed=True)
        positive_or_off(self.max_grad_norm, f"{prefix}max_grad_norm", 1.0, "to turn clipping off")


def compile_backend_known(backend: str, key: str) -> None:
    """`train.compile_backend` names a backend torch.compile has (its debug ones included)."""
    import torch._dynamo  # here only: the config layer otherwise runs without torch

    shown = [*torch._dynamo.list_backends(), "aot_eager (a check)"]  # the debug ones run too, unlisted
    require(
        backend in torch._dynamo.list_backends(exclude_tags=()),
        key,
        backend,
        f"must be a torch.compile backend ({', '.join(shown)})",
        f"--{key} inductor",
    )


def compile_needs_no_fsdp2(compile: bool, strategy: str, prefix: str) -> None:
    """`train.compile` compiles a whole decoder (rlhf/models/compiled.py); fsdp2's hooks gather and
    free each layer's parameters inside it, which that compile is not built for."""
    require(
        not compile or strategy != "fsdp2",
        f"{prefix}train.compile",
        compile,
        f"does not run under {prefix}dist.strategy fsdp2 (its per-layer hooks gather and free the "
        "parameters inside the compiled decoder)",
        f"--{prefix}train.compile false, or --{prefix}dist.strategy ddp",
    )


@dataclass
class DistConfig:
    """Data parallelism over the processes torchrun starts (docs/distributed.md). Batch sizes stay
    global: the same config gives the same numbers on 1 or N processes."""

    # none: one process | ddp: every rank holds the whole model and its share of each batch's rows;
    # the gradients are summed over the ranks before each optimizer step | fsdp2: as ddp, the trained
    # models' parameters and optimizer state sharded over the ranks between uses (docs/distributed.md)
    strategy: Literal["none", "ddp", "fsdp2"] = "none"
    timeout: float = 600.0  # seconds a collective waits for the other ranks before the job ends
    # fsdp2 (rlhf train, sft, rm, dpo): every role's shards, gradients and AdamW state kept in CPU
    # memory, each layer copied to the GPU for its use (torch's CPUOffloadPolicy): for a GPU that cannot
    # hold its shards, at the cost of a host-device copy per use and AdamW on the CPU
    offload: bool = False
    # fsdp2 in rlhf train, the rollout's policy: "whole": gathered once per rollout and sampled with
    # whole (fastest; the whole policy in the compute dtype on every rank while sampling) | "per_layer":
    # every decoding step gathers one layer at a time (a policy too big to hold whole, e.g. 70B on
    # 80 GB GPUs; one all-gather per layer per token, every rank stepping until all ranks' rows ended)
    rollout_gather: Literal["whole", "per_layer"] = "whole"
    # fsdp2 in rlhf train: the gradients reduce-scattered after every micro-batch's backward
    # (micro_batch), or accumulated whole on each rank and reduced in a step's last one (step);
    # ddp always reduces once per step (DDP's no_sync before)
    grad_sync: Literal["micro_batch", "step"] = "micro_batch"

    def validate(self, prefix: str) -> None:
        positive(self.timeout, f"{prefix}timeout", 600, " seconds")
        require(
            not self.offload or self.strategy == "fsdp2",
            f"{prefix}offload",
            self.offload,
            f"needs {prefix}strategy fsdp2 (it moves sharded state to the CPU; the strategy is "
            f"{self.strategy!r})",
            f"--{prefix}strategy fsdp2, or --{prefix}offload false",
        )
        require(
            self.rollout_gather == "whole" or self.strategy == "fsdp2",
            f"{prefix}rollout_gather",
            self.rollout_gather,
            f"needs {prefix}strategy fsdp2 (only sharded policies are gathered; the strategy is "
            f"{self.strategy!r})",
            f"--{prefix}strategy fsdp2, or --{prefix}rollout_gather whole",
        )
