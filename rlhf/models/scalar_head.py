"""A causal LM with a linear scalar head (hidden -> 1): the reward model and the critic.

The LM head is kept (the reward model's LM term, docs/algorithms.md#4-reward-model); hidden states
come from the decoder (with PEFT, the LoRA-injected one), positions from the attention mask.
- reward: the scalar at the last real token of prompt + response, found from the mask, so left and
  right padding give the same reward (docs/algorithms.md §25, point 7);
- critic: V(s_t) for response token t is read at column P - 1 + t (the state before token t).
On disk: an ordinary Hugging Face directory (or PEFT adapter directory) plus
`scalar_head.safetensors` and `scalar_head.json`. Nothing is pickled.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rlhf.models.backbone import (
    decoder_hidden_states,
    head_logits,
    is_peft_model,
    peft_wrapping,
    unwrap_causal_lm,
)
from rlhf.models.files import check_weights_whole
from rlhf.models.loading import ModelLoadingError, load_causal_lm
from rlhf.models.trust import check_model_directory

HEAD_WEIGHTS_NAME = "scalar_head.safetensors"
HEAD_CONFIG_NAME = "scalar_head.json"
HEAD_FORMAT_VERSION = 1


class ScalarHeadOutput(NamedTuple):
    values: torch.Tensor  # [B, L]
    lm_logits: torch.Tensor  # [B, L, V]


def hidden_size(model: nn.Module) -> int:
    """The hidden size of a causal LM (or of a PEFT wrapper around one)."""
    config = unwrap_causal_lm(model).config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(config.hidden_size)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index [B] of the last column where `attention_mask == 1`, whatever the padding side.

    Raises ValueError when a row has no real token (there is nothing to score).
    """
    mask = attention_mask.bool()
    if not bool(mask.any(dim=-1).all()):
        rows = (~mask.any(dim=-1)).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} of the attention mask have no real token: nothing to score.")
    columns = torch.arange(mask.shape[-1], device=mask.device)
    return torch.where(mask, columns, -1).amax(dim=-1)


class ScalarHeadModel(nn.Module):
    """`causal_lm` (kept whole, LM head included) plus `head`: nn.Linear(hidden, 1)."""

    float32_modules = ("head",)  # the scalar head keeps float32 weights under every precision policy

    def __init__(self, causal_lm: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        if head.in_features != hidden_size(causal_lm) or head.out_features != 1:
            raise ValueError(
                f"head must be Linear({hidden_size(causal_lm)}, 1), got Linear({head.in_features}, "
                f"{head.out_features})."
            )
        self.causal_lm = causal_lm
        self.head = head

    @property
    def config(self):
        return self.causal_lm.config

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_causal_lm(
        cls,
        model_or_dir: nn.Module | str | os.PathLike,
        head_init_std: float | None = None,
        dtype: torch.dtype = torch.float32,
        gguf_file: str | None = None,
        device: torch.device | str | None = None,
    ) -> ScalarHeadModel:
        """A fresh head on a causal LM (an nn.Module, used as is, or a directory / GGUF file loaded in
        `dtype` on `device`). The head is float32, on the causal LM's device.

        The head's weight is drawn from N(0, head_init_std^2), default 1 / sqrt(hidden + 1); 0 gives
        a zero head (V = 0 everywhere at the start). The bias starts at 0.
        """
        if isinstance(model_or_dir, ScalarHeadModel):
            raise TypeError("from_causal_lm takes a causal LM; to copy a scalar-head model use init_critic.")
        model = model_or_dir
        if isinstance(model_or_dir, (str, os.PathLike)):
            model = load_causal_lm(model_or_dir, gguf_file=gguf_file, dtype=dtype, device=device)
        size = hidden_size(model)
        std = 1.0 / math.sqrt(size + 1) if head_init_std is None else float(head_init_std)
        if std < 0:
            raise ValueError(f"head_init_std must be >= 0, got {head_init_std}.")
        param = next(model.parameters())
        head = nn.Linear(size, 1, bias=True, device=param.device, dtype=torch.float32)
        with torch.no_grad():
            if std > 0:
                head.weight.normal_(0.0, std)
            else:
                head.weight.zero_()
            head.bias.zero_()
        return cls(model, head)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike,
        dtype: torch.dtype = torch.float32,
        base_model: nn.Module | None = None,
        device: torch.device | str | None = None,
        on_meta: bool = False,
    ) -> ScalarHeadModel:
        """Load a directory written by `save_pretrained` (eval mode), the causal LM in `dtype` and
        the head in float32, on `device` (None: where the causal LM is, the CPU when loaded here).

        For a LoRA backbone the directory holds a PEFT adapter: its base model is `base_model` if
        given, else loaded from the adapter config's `base_model_name_or_path`; the adapter stays
        trainable. `on_meta` (not for a LoRA backbone): the structure alone, on the meta device
        (rlhf.models.loading.load_causal_lm; the head follows the causal LM's device).
        """
        path = Path(directory)
        weights, meta = path / HEAD_WEIGHTS_NAME, path / HEAD_CONFIG_NAME
        if not weights.is_file():
            raise ModelLoadingError(
                f"{str(path)!r} has no {HEAD_WEIGHTS_NAME}: it is not a scalar-head (reward model or "
                "critic) directory. Fix: pass the --out directory of `rlhf rm` (as --reward-model or "
                "--judge); in Python, ScalarHeadModel.from_causal_lm(path) puts a fresh head on a causal LM."
            )
        check_weights_whole(path)  # the head's file (and the adapter's) whole, named if not
        info = json.loads(meta.read_text()) if meta.is_file() else {}
        if (path / "adapter_config.json").is_file():
            from peft import PeftConfig, PeftModel

            if base_model is None:
                base_path = PeftConfig.from_pretrained(str(path)).base_model_name_or_path
                if not base_path:
                    raise ModelLoadingError(
                        f"{str(path)!r} holds a LoRA adapter whose base model is not recorded. Fix: pass "
                        "base_model=<the causal LM the adapter was trained on>."
                    )
                base_model = load_causal_lm(base_path, dtype=dtype)
            check_model_directory(path)  # the adapter's own weights: safetensors unless --allow-pickle
            with peft_wrapping():
                model = PeftModel.from_pretrained(base_model, str(path), is_trainable=True)
        else:
            model = load_causal_lm(path, dtype=dtype, on_meta=on_meta)
        state = load_file(str(weights))
        size = hidden_size(model)
        if state["weight"].shape != (1, size):
            raise ModelLoadingError(
                f"{str(weights)!r} holds a head of shape {tuple(state['weight'].shape)}, the model's hidden "
                f"size is {size}. Fix: save the head and the model together with save_pretrained."
            )
        has_bias = "bias" in state and info.get("bias", True)
        head = nn.Linear(size, 1, bias=has_bias, device=next(model.parameters()).device)
        if not on_meta:  # on the meta device: filled from rank 0 when sharded
            head.load_state_dict({k: v for k, v in state.items() if k in ("weight", "bias")})
        loaded = cls(model, head).eval()
        return loaded.to(device) if device is not None else loaded

    def save_pretrained(self, directory: str | os.PathLike, **kwargs) -> None:
        """Write the causal LM with its own `save_pretrained` (safetensors) plus the head files."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.causal_lm.save_pretrained(str(path), **kwargs)
        tensors = {"weight": self.head.weight.detach().contiguous().cpu()}
        if self.head.bias is not None:
            tensors["bias"] = self.head.bias.detach().contiguous().cpu()
        save_file(tensors, str(path / HEAD_WEIGHTS_NAME), metadata={"format": "pt"})
        info = {
            "format_version": HEAD_FORMAT_VERSION,
            "hidden_size": self.head.in_features,
            "bias": self.head.bias is not None,
            "backbone": "peft_adapter" if is_peft_model(self.causal_lm) else "causal_lm",
        }
        (path / HEAD_CONFIG_NAME).write_text(json.dumps(info, indent=2) + "\n")

    # -- computation ----------------------------------------------------------------------------

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Decoder hidden states [B, L, H], position ids from the attention mask."""
        return decoder_hidden_states(self.causal_lm, input_ids, attention_mask)

    def values_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head on hidden states [..., H] -> [...], computed in float32 even under bfloat16 autocast
        (a value or reward needs more than bfloat16's ~3 significant digits)."""
        with torch.autocast(hidden.device.type, enabled=False):
            return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_lm_logits: bool = False
    ) -> torch.Tensor | ScalarHeadOutput:
        """Values [B, L] at every position (finite everywhere, meaningful on real tokens); with
        `return_lm_logits`, a `ScalarHeadOutput(values, lm_logits [B, L, V])` from the same forward."""
        hidden = self.hidden_states(input_ids, attention_mask)
        values = self.values_from_hidden(hidden)
        if not return_lm_logits:
            return values
        return ScalarHeadOutput(values, head_logits(self.causal_lm, hidden))

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The scalar [B] at the last real token of each row (read from the attention mask)."""
        values = self(input_ids, attention_mask)
        index = last_token_index(attention_mask)
        return values.gather(1, index.unsqueeze(1)).squeeze(1)

    def lm_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The causal LM's logits [B, L, V] (position ids from the mask), for the reward model's LM loss."""
        return head_logits(self.causal_lm, self.hidden_states(input_ids, attention_mask))


def response_values(
    critic: ScalarHeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
) -> torch.Tensor:
    """V(s_t) [B, T] for response token t, read at column P - 1 + t; 0 at padded response positions."""
    if not 1 <= prompt_length <= input_ids.shape[1]:
        raise ValueError(f"prompt_length must be in [1, {input_ids.shape[1]}], got {prompt_length}.")
    if prompt_length == input_ids.shape[1]:  # no response column
        return critic.head.weight.new_zeros(input_ids.shape[0], 0)
    # the state after the last token is never valued: the decoder stops one column short (exact)
    hidden = critic.hidden_states(input_ids[:, :-1], attention_mask[:, :-1])
    values = critic.values_from_hidden(hidden[:, prompt_length - 1 :])
    valid = attention_mask[:, prompt_length:].bool()
    return torch.where(valid, values, torch.zeros_like(values))


def init_critic(
    source: ScalarHeadModel | nn.Module | str | os.PathLike,
    head_init_std: float | None = 0.0,
    dtype: torch.dtype = torch.float32,
) -> ScalarHeadModel:
    """The critic, as a model independent of `source`:

    - from a reward model (a `ScalarHeadModel`, or a directory holding `scalar_head.safetensors`):
      a copy of it, head included (PPO paper §5.4: initialize the critic from the reward model);
    - from a causal LM (the SFT model, or its directory): that LM with a fresh head
      (`head_init_std`, default 0: V = 0 everywhere at the start).
    """
    if isinstance(source, ScalarHeadModel):
        return copy.deepcopy(source)
    if isinstance(source, nn.Module):
        return ScalarHeadModel.from_causal_lm(copy.deepcopy(source), head_init_std=head_init_std)
    if (Path(source) / HEAD_WEIGHTS_NAME).is_file():
        return ScalarHeadModel.from_pretrained(source, dtype=dtype)
    return ScalarHeadModel.from_causal_lm(source, head_init_std=head_init_std, dtype=dtype)
