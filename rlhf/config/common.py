"""The groups several stages share: the optimizer, LoRA adapters and data parallelism."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhf.config.checks import require
from rlhf.config.keys import When, setting

LORA_ON = When("enabled", True)  # the adapter settings of a run without LoRA are never read


@dataclass
class LoraConfig:
    enabled: bool = False  # train LoRA adapters instead of all weights (PEFT)
    r: int = setting(8, ">= 1", when=LORA_ON)  # adapter rank
    alpha: int = setting(16, "> 0", when=LORA_ON)  # adapter scaling numerator
    # adapter dropout (keep 0 for an exact first PPO ratio)
    dropout: float = setting(0.0, "[0, 1)", when=LORA_ON)
    # None: PEFT's default for the architecture (Llama: q_proj, v_proj)
    target_modules: list[str] | None = setting(None, when=LORA_ON)


@dataclass
class OptimConfig:
    # peak learning rate (AdamW); 1 or more moves every weight by its own size in a step
    lr: float = setting(1e-5, "(0, 1)")
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas (PPO paper, OpenRLHF)
    weight_decay: float = setting(0.0, "[0, 1]")  # AdamW decoupled weight decay
    warmup_steps: int = setting(0, ">= 0", unit="optimizer steps")  # linear warmup steps from 0 to lr
    # warmup over this fraction of the optimizer steps (PPO paper §5.1: 0.1); the longer of the two wins
    warmup_fraction: float = setting(0.0, "[0, 1)")
    schedule: Literal["constant", "cosine", "linear"] = "constant"  # decay after the warmup
    # floor of the cosine/linear decay, as a fraction of lr
    min_lr_ratio: float = setting(0.0, "[0, 1]", when=When("schedule", ("cosine", "linear")))
    # global gradient-norm clipping (PPO paper §5.4 and appendix C.2); None: off
    max_grad_norm: float | None = setting(1.0, "> 0")

    def validate(self, prefix: str) -> None:
        require(
            all(0 <= b < 1 for b in self.betas),
            f"{prefix}betas",
            list(self.betas),
            "must be two numbers in [0, 1)",
            f"--{prefix}betas [0.9,0.95]",
        )


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


FSDP2 = When("strategy", "fsdp2")  # settings of the sharded strategy


@dataclass
class DistConfig:
    """Data parallelism over the processes torchrun starts (docs/distributed.md). Batch sizes stay
    global: the same config gives the same numbers on 1 or N processes."""

    # none: one process | ddp: every rank holds the whole model and its share of each batch's rows;
    # the gradients are summed over the ranks before each optimizer step | fsdp2: as ddp, the trained
    # models' parameters and optimizer state sharded over the ranks between uses (docs/distributed.md)
    strategy: Literal["none", "ddp", "fsdp2"] = "none"
    # seconds a collective waits for the other ranks before the job ends
    timeout: float = setting(600.0, "> 0", unit="seconds")
    # fsdp2 (rlhf train, sft, rm, dpo): every role's shards, gradients and AdamW state kept in CPU
    # memory, each layer copied to the GPU for its use (torch's CPUOffloadPolicy): for a GPU that cannot
    # hold its shards, at the cost of a host-device copy per use and AdamW on the CPU
    offload: bool = setting(False, when=FSDP2)
    # fsdp2 in rlhf train, the rollout's policy: "whole": gathered once per rollout and sampled with
    # whole (fastest; the whole policy in the compute dtype on every rank while sampling) | "per_layer":
    # every decoding step gathers one layer at a time (a policy too big to hold whole, e.g. 70B on
    # 80 GB GPUs; one all-gather per layer per token, every rank stepping until all ranks' rows ended)
    rollout_gather: Literal["whole", "per_layer"] = setting("whole", when=FSDP2)
    # fsdp2 in rlhf train: the gradients reduce-scattered after every micro-batch's backward
    # (micro_batch), or accumulated whole on each rank and reduced in a step's last one (step);
    # ddp always reduces once per step (DDP's no_sync before)
    grad_sync: Literal["micro_batch", "step"] = setting("micro_batch", when=FSDP2)
