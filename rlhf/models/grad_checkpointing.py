"""Activation (gradient) checkpointing of a causal LM's decoder layers.

With it on, a training forward keeps only each decoder layer's input; the layer is run again in
the backward to rebuild what its gradient needs. Memory for activations drops from all layers'
intermediates to one layer's, for about one more forward of compute. Gradients are the same (to
float rounding: the recomputed forward is the same arithmetic).

It acts in training mode only (`model.train()`); sampling and other eval-mode forwards are
untouched, and the KV cache is never used under it here (every training forward has
`use_cache=False`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from rlhf.models.backbone import unwrap_causal_lm


def _causal_lm(model: nn.Module) -> nn.Module:
    """The Hugging Face `*ForCausalLM` inside `model`: itself, inside a PEFT wrapper, or the
    `causal_lm` of a scalar-head model (reward model, critic)."""
    return unwrap_causal_lm(getattr(model, "causal_lm", model))


def gradient_checkpointing(model: nn.Module) -> nn.Module:
    """Turn on checkpointing of every decoder layer of `model` (a causal LM, a PEFT-wrapped one or a
    scalar-head model), non-reentrant, in place; returns `model`.

    With frozen input embeddings (LoRA), the embedding output is made to require grad, so that
    every checkpointed layer has an input with a gradient path (needed by reentrant checkpointing,
    harmless with the non-reentrant kind used here).
    """
    lm = _causal_lm(model)
    if not getattr(lm, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"{type(lm).__name__} does not support gradient checkpointing. Fix: set "
            "gradient_checkpointing to false for this model."
        )
    kwargs = {"use_reentrant": False}
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    embeddings = lm.get_input_embeddings()
    already_hooked = getattr(lm, "_require_grads_hooks", None) or getattr(lm, "_require_grads_hook", None)
    if not already_hooked and not any(p.requires_grad for p in embeddings.parameters()):
        lm.enable_input_require_grads()
    return model


def is_gradient_checkpointing(model: nn.Module) -> bool:
    """True when checkpointing is on for `model`'s decoder layers."""
    lm = _causal_lm(model)
    return any(getattr(m, "gradient_checkpointing", False) for m in lm.modules())


@contextlib.contextmanager
def checkpointing_in_eval(model: nn.Module) -> Iterator[None]:
    """Checkpointed decoder layers of `model` recompute in the backward although the model is in eval
    mode (an RL role keeps dropout off, so that the first PPO ratio is exactly 1, yet wants the memory
    saving). Transformers checkpoints a layer only when the layer itself is in training mode: for the
    block, each checkpointed layer's own flag is set, never its children's (dropout stays off)."""
    layers = [
        m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True and not m.training
    ]
    if not layers or not torch.is_grad_enabled():
        yield
        return
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False
