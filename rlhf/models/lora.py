"""LoRA adapters (via PEFT) for the policy, the critic and the reward model.

`apply_lora` injects the adapter layers into the model in place (PEFT's behaviour) and freezes
the base weights; only the adapters (and, for a `ScalarHeadModel`, the scalar head) train.
"""

from __future__ import annotations

from collections.abc import Sequence

from peft import LoraConfig, TaskType, get_peft_model
from torch import nn

from rlhf.models.backbone import is_peft_model, peft_wrapping
from rlhf.models.scalar_head import ScalarHeadModel


def lora_config(
    r: int = 8, alpha: int = 16, dropout: float = 0.0, target_modules: Sequence[str] | str | None = None
) -> LoraConfig:
    """A causal-LM LoRA config; `target_modules=None` takes PEFT's default for the architecture."""
    if r < 1:
        raise ValueError(f"LoRA rank r must be >= 1, got {r}.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must be in [0, 1), got {dropout}.")
    targets = list(target_modules) if isinstance(target_modules, (list, tuple)) else target_modules
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets
    )


def _wrap(model: nn.Module, config: LoraConfig) -> nn.Module:
    if is_peft_model(model):
        raise ValueError("the model already has a PEFT adapter; apply_lora was called twice.")
    try:
        with peft_wrapping():
            return get_peft_model(model, config)
    except ValueError as err:
        raise ValueError(
            f"{err}\nFix: pass target_modules=[...] naming the linear layers to adapt in "
            f"{type(model).__name__} (e.g. ['q_proj', 'v_proj'])."
        ) from err


def apply_lora(
    model: nn.Module,
    r: int = 8,
    alpha: int = 16,
    dropout: float = 0.0,
    target_modules: Sequence[str] | str | None = None,
) -> nn.Module:
    """Add LoRA adapters. A causal LM becomes a `PeftModel`; a `ScalarHeadModel` is returned with its
    `causal_lm` wrapped and its scalar head left trainable."""
    config = lora_config(r, alpha, dropout, target_modules)
    if isinstance(model, ScalarHeadModel):
        model.causal_lm = _wrap(model.causal_lm, config)
        model.head.requires_grad_(True)
        return model
    return _wrap(model, config)
