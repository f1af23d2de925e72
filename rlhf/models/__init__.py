"""Hugging Face glue: loading, tokenizers, scalar-head models, reference, LoRA, log-probs, sampling.

Names are imported lazily (`from rlhf.models import generate` works) so that importing one
submodule, e.g. `rlhf.models.tiny`, does not pay for PEFT and the others.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "causal_lm_parts": "backbone",
    "eval_mode": "backbone",
    "position_ids": "backbone",
    "ModelLoadingError": "loading",
    "load_causal_lm": "loading",
    "load_tokenizer": "loading",
    "padding_side": "loading",
    "prepare_tokenizer": "loading",
    "response_logprobs": "logprobs",
    "apply_lora": "lora",
    "ReferenceModel": "reference",
    "Rollout": "sampling",
    "SamplingConfig": "sampling",
    "generate": "sampling",
    "ScalarHeadModel": "scalar_head",
    "init_critic": "scalar_head",
    "last_token_index": "scalar_head",
    "response_values": "scalar_head",
    "apply_truncation_policy": "truncation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlhf.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rlhf.models.{_EXPORTS[name]}"), name)
