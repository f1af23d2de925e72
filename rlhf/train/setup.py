"""What every trainer does first: claim a fresh run directory, seed, load the tokenizer, add LoRA,
mark its models for sequence packing and compiled training forwards."""

from __future__ import annotations

from pathlib import Path

import torch

from rlhf.config import ConfigError, LoraConfig, save_config
from rlhf.models.compiled import compile_for_training, compile_refusal
from rlhf.models.loading import load_tokenizer, prepare_tokenizer
from rlhf.models.lora import apply_lora
from rlhf.models.packing import enable_packing
from rlhf.rundir.directory import check_fresh_run_dir


def with_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """`model` with LoRA adapters when `lora.enabled` (PEFT), else unchanged."""
    if not lora.enabled:
        return model
    return apply_lora(
        model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules
    )


def with_packing(packing: bool, *models: torch.nn.Module | None) -> None:
    """`train.packing`: every forward of `models` packs its rows (rlhf/models/packing.py); an
    architecture whose attention cannot take packed rows is refused (exit 2) before any step."""
    if not packing:
        return
    for model in models:
        if model is None:
            continue
        try:
            enable_packing(model)
        except ValueError as why:
            raise ConfigError(
                f"train.packing is true, but {why}: its attention cannot keep packed sequences apart. "
                "Fix: --train.packing false (micro-batches by length or by --train.micro_batch_tokens "
                "save most of the padding too).",
                "train.packing",
            ) from None


def with_compile(compile: bool, backend: str, device: torch.device, *models: torch.nn.Module | None) -> None:
    """`train.compile`: the forwards with gradients on of `models`' decoders run compiled by `backend`
    (rlhf/models/compiled.py); a backend that cannot compile on `device` is refused (exit 2) before
    any step."""
    if not compile:
        return
    why = compile_refusal(backend, device)
    if why is not None:
        raise ConfigError(
            f"train.compile is true, but {why}. Fix: --train.compile false, or install what the "
            "backend needs (torch's CUDA wheels bring triton).",
            "train.compile_backend",
        )
    for model in models:
        if model is not None:
            compile_for_training(model, backend)


def start_run(config, tokenizer=None, *, writer: bool = True, resume: bool = False, resumable: bool = False):
    """Check that `config.out` holds no earlier run, write its config.yaml, seed torch, prepare the tokenizer.

    Returns `(run_dir, tokenizer)`; the tokenizer is loaded from `config.model` when not given. Only
    the `writer` (rank 0 under torchrun) checks and writes the run directory. `resume`: the run in
    `config.out` goes on (no check; its config.yaml rewritten with the changes a resume may make);
    `resumable`: the stage can resume, so the message about a used directory offers --resume.
    """
    out = Path(config.out)
    if writer:
        if not resume:
            check_fresh_run_dir(out, resumable=resumable)
        out.mkdir(parents=True, exist_ok=True)
        save_config(config, out / "config.yaml")
    torch.manual_seed(config.seed)
    if tokenizer is None:
        tokenizer = load_tokenizer(config.model, gguf_file=config.gguf_file)
    return out, prepare_tokenizer(tokenizer)
