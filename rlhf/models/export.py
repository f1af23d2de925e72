"""What a trained model is saved as: a plain Hugging Face model in float32, LoRA adapters merged.

One function for every stage (SFT, reward model, RL policy and critic), so that an exported
directory loads with `from_pretrained` alone whatever the training precision or adapters were.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlhf.models.backbone import is_peft_model
from rlhf.models.precision import cast_parameters
from rlhf.models.scalar_head import ScalarHeadModel


def export_copy(model: nn.Module) -> nn.Module:
    """`model` ready for `save_pretrained`: float32 weights and LoRA adapters merged (a PEFT causal
    LM, or a `ScalarHeadModel` on one). A copy when either changes anything, so the model being
    trained stays as it is (a run may go on); otherwise `model` itself."""
    lora = is_peft_model(model.causal_lm if isinstance(model, ScalarHeadModel) else model)
    low_precision = any(p.dtype != torch.float32 for p in model.parameters() if p.is_floating_point())
    if not lora and not low_precision:
        return model
    out = cast_parameters(copy.deepcopy(model), torch.float32)
    if isinstance(out, ScalarHeadModel) and lora:
        out.causal_lm = out.causal_lm.merge_and_unload()
    elif lora:
        out = out.merge_and_unload()
    return out
