"""How this library calls a Hugging Face causal LM: its decoder, then its output head, separately.

Calling the two halves ourselves lets log-probs, values and sampling run the vocabulary-sized head
only on the columns they need. Position ids always come from the attention mask (internals.md,
"Tensor layout of a rollout"), so a sequence gets the same hidden states whatever padding
surrounds it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from rlhf.models.packing import PACKING_ATTRIBUTE, packed_hidden_states


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """`attention_mask.cumsum(-1) - 1` clamped at 0: position 0 at the first real token of each row."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def is_peft_model(model: nn.Module) -> bool:
    """True for a PEFT wrapper (`PeftModel`), whose LoRA layers are injected into the wrapped model."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around PEFT's wrapping of a model (`get_peft_model`, `PeftModel.from_pretrained`): PEFT reads
    `model.is_gradient_checkpointing` there, a property transformers deprecates (FutureWarning: use
    `is_activation_checkpointing`). The call is PEFT's, not the user's and not ours, so that one
    warning is hidden here and nowhere else."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The `*ForCausalLM` module: `model` itself, or the LoRA-injected model inside a PEFT wrapper."""
    return model.get_base_model() if is_peft_model(model) else model


def causal_lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(decoder, output head) of a causal LM; with PEFT, the LoRA-injected ones (so that
    `disable_adapter()` on the wrapper applies to them)."""
    lm = unwrap_causal_lm(model)
    get_decoder = getattr(lm, "get_decoder", None)
    decoder = get_decoder() if get_decoder is not None else getattr(lm, "base_model", None)
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if decoder is None or decoder is lm or head is None:
        raise TypeError(
            f"{type(lm).__name__} does not look like a Hugging Face causal LM (need get_decoder() and "
            "get_output_embeddings()). Fix: load it with AutoModelForCausalLM."
        )
    return decoder, head


COMPILE_ATTRIBUTE = "rlhf_compile"  # set on a decoder whose training forwards run compiled: the backend
_announced: set[str] = set()  # backends whose first compile was announced in this process


def _run(decoder: nn.Module, kwargs: dict[str, Any]) -> Any:
    return decoder(**kwargs)


@functools.cache
def _compiled(backend: str) -> Callable[[nn.Module, dict[str, Any]], Any]:
    """`_run` compiled with `backend` (one per backend for the process)."""
    return torch.compile(_run, backend=backend)


def run_decoder(decoder: nn.Module, **kwargs: Any) -> Any:
    """`decoder(**kwargs)`: compiled when the decoder is marked (`train.compile`,
    rlhf/models/compiled.py) and gradients are on, else as it is. One compiled function serves every
    marked decoder (the module its argument), so no compiled object holds a model alive."""
    backend = getattr(decoder, COMPILE_ATTRIBUTE, None)
    if backend is None or not torch.is_grad_enabled():
        return decoder(**kwargs)
    if backend not in _announced:  # a sign of life: the first steps stall while dynamo compiles
        _announced.add(backend)
        print(
            f"train.compile: compiling the training forward and backward ({backend}); the first steps "
            "take longer",
            file=sys.stderr,
            flush=True,
        )
    for value in kwargs.values():  # rows and lengths vary from pass to pass: one dynamic graph
        if isinstance(value, torch.Tensor):
            for dim in range(min(value.dim(), 2)):
                torch._dynamo.maybe_mark_dynamic(value, dim)
    return _compiled(backend)(decoder, kwargs)


def decoder_hidden_states(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Last hidden states [B, L, H] of the decoder, position ids from the mask, no KV cache. A model
    marked for sequence packing (`train.packing`, rlhf/models/packing.py) runs its rows packed and
    gets them back in this padded layout (0 at padding). A decoder marked by `train.compile` runs
    compiled when gradients are on (rlhf/models/compiled.py)."""
    decoder, _ = causal_lm_parts(model)
    if getattr(unwrap_causal_lm(model), PACKING_ATTRIBUTE, False):
        packed = packed_hidden_states(decoder, input_ids, attention_mask, run_decoder)
        if packed is not None:
            return packed
    out = run_decoder(
        decoder,
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
    )
    return out[0]


def output_head(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden [..., H] -> logits [..., V]: the output head plus the post-head transforms some
    architectures apply in their own forward (Cohere's `logit_scale`, Granite's `logits_scaling`,
    Gemma 2/3's `final_logit_softcapping`), so that logits equal `model(...).logits` there."""
    _, head = causal_lm_parts(model)
    config = unwrap_causal_lm(model).config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    scale = getattr(config, "logit_scale", None)
    scaling = getattr(config, "logits_scaling", None)
    cap = getattr(config, "final_logit_softcapping", None)
    factor = 1.0
    if isinstance(scale, (int, float)):
        factor *= scale
    if isinstance(scaling, (int, float)) and scaling != 0:
        factor /= scaling
    cap = float(cap) if isinstance(cap, (int, float)) and cap > 0 else None
    if factor == 1.0 and cap is None:
        return head

    def apply(hidden: torch.Tensor) -> torch.Tensor:
        logits = head(hidden)
        if factor != 1.0:
            logits = logits * factor
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return apply


def head_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """`output_head(model)(hidden)`."""
    return output_head(model)(hidden)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode (no dropout) and restore each one's own flag on exit."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in flags:
            module.training = training


# RoPE variants whose forward rewrites the rotary module's frequencies from the sequence length
# (transformers' `dynamic_rope_update`): two threads running one such model at once could race.
STATEFUL_ROPE_TYPES = ("dynamic", "longrope")


def forward_changes_state(model: nn.Module) -> bool:
    """True when running `model` changes its own state (dynamic or LongRoPE scaling): then no two
    threads may run it at once."""
    config = unwrap_causal_lm(model).config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("rope_parameters", "rope_scaling"):
        settings = getattr(config, name, None)
        if not isinstance(settings, dict):
            continue
        # one dict, or one per layer type (e.g. {"full_attention": {...}, "sliding_attention": {...}})
        groups = [settings] + [v for v in settings.values() if isinstance(v, dict)]
        for group in groups:
            kind = str(group.get("rope_type") or group.get("type") or "")
            if any(stateful in kind for stateful in STATEFUL_ROPE_TYPES):
                return True
    return False


def model_context(model: object) -> int | None:
    """The number of positions a model was built for (None when its config does not say)."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
