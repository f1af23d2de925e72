"""Sequence packing (`train.packing`, docs/speed.md "Sequence packing"): the sequences of one forward
laid end to end in fewer rows, positions restarting at 0 per sequence, attention never crossing a
boundary; the outputs put back in the padded layout.

`decoder_hidden_states` (rlhf/models/backbone.py) calls `packed_decoder_call` for a model marked by
`enable_packing`: pack [B, L] -> decoder on [N, W] (N <= B, first-fit of rows sorted longest first:
`first_fit`) -> unpack to [B, L, H] (0 at padding). Positions are the padded path's, and the decoder
gets no 2D mask, so transformers builds a block-diagonal causal mask (flash-attention: varlen bounds).
A decoder that builds its mask otherwise is refused before training (`packing_refusal`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

PACKING_ATTRIBUTE = "rlhf_packing"  # set on a causal LM whose forwards pack (`enable_packing`)


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Positions of `lengths` (rows longest first, ties in order) placed each in the first bin with
    room for it under `capacity` tokens (a row longer than it alone); empty rows are left out."""
    bins: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] <= 0:
            continue
        for b, used in enumerate(fill):
            if used + lengths[i] <= capacity:
                bins[b].append(i)
                fill[b] += lengths[i]
                break
        else:
            bins.append([i])
            fill.append(lengths[i])
    return bins


@dataclass
class Packing:
    """A padded [B, L] batch packed into [N, W]: `input_ids`, `position_ids` (restarting per
    sequence; a packed row's unused tail is a sequence of its own, whose outputs are dropped), and
    for each real token its flat index in the padded batch (`source`) and in the packed one
    (`target`)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    source: torch.Tensor
    target: torch.Tensor
    shape: tuple[int, int]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[N, W, ...] -> [B, L, ...], zeros at padding (differentiable)."""
        rest = packed.shape[2:]
        flat = packed.reshape(-1, *rest).index_select(0, self.target)
        out = flat.new_zeros(self.shape[0] * self.shape[1], *rest)
        return out.index_copy(0, self.source, flat).view(*self.shape, *rest)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, one_row: bool = False) -> Packing | None:
    """`input_ids` [B, L] packed by `first_fit` into rows as wide as the longest sequence (`one_row`:
    every sequence in one row); None when no row has a real token."""
    mask = attention_mask.bool()
    lengths = mask.sum(1).tolist()
    total = sum(lengths)
    if total == 0:
        return None
    bins = first_fit(lengths, total if one_row else max(lengths))
    width = max(sum(lengths[i] for i in b) for b in bins)
    start = [0] * len(lengths)  # each row's first flat index in the packed batch
    fill = torch.zeros(len(bins), dtype=torch.long)
    for b, rows in enumerate(bins):
        offset = b * width
        for i in rows:
            start[i] = offset
            offset += lengths[i]
        fill[b] = offset - b * width
    device = input_ids.device
    rank = mask.long().cumsum(1) - 1  # each real token's position: the padded path's position id
    rows_of, cols_of = mask.nonzero(as_tuple=True)
    source = rows_of * mask.shape[1] + cols_of
    k = rank[rows_of, cols_of]
    target = torch.tensor(start, dtype=torch.long, device=device)[rows_of] + k
    ids = input_ids.new_zeros(len(bins) * width)
    ids[target] = input_ids.reshape(-1)[source]
    # the unused tail of a packed row counts 0, 1, ... (a sequence of its own: nothing real attends it)
    column = torch.arange(width, device=device).expand(len(bins), width)
    positions = (column - fill.to(device).unsqueeze(1)).clamp(min=0).reshape(-1).clone()
    positions[target] = k
    return Packing(
        ids.view(len(bins), width),
        positions.view(len(bins), width),
        source,
        target,
        (int(mask.shape[0]), int(mask.shape[1])),
    )


def packed_hidden_states(
    decoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    run: Callable[..., Any] = lambda decoder, **kwargs: decoder(**kwargs),
) -> torch.Tensor | None:
    """The decoder's last hidden states [B, L, H] of a padded batch, computed packed (see above);
    None when no row has a real token (the caller runs the padded call, whose outputs are all masked)
    or when packing would leave as many rows as there are (no two sequences share a row: the padded
    call is then the same work, without a materialized document mask). `run(decoder, **kwargs)` calls
    the decoder (backbone.run_decoder: compiled under `train.compile`)."""
    packing = pack(input_ids, attention_mask, one_row=_flash(decoder))
    if packing is None or packing.input_ids.shape[0] >= input_ids.shape[0]:
        return None
    out = run(decoder, input_ids=packing.input_ids, position_ids=packing.position_ids, use_cache=False)
    return packing.unpack(out[0])


def _flash(decoder: nn.Module) -> bool:
    implementation = getattr(getattr(decoder, "config", None), "_attn_implementation", None) or ""
    return "flash" in str(implementation)


# -- which models may pack ------------------------------------------------------------------------


def causal_lms(model: nn.Module) -> list[nn.Module]:
    """The Hugging Face causal LMs inside `model` (itself, a PEFT wrapper's, a scalar-head model's)."""
    from transformers import PreTrainedModel

    return [m for m in model.modules() if isinstance(m, PreTrainedModel) and hasattr(m, "get_decoder")]


def architecture_refusal(config: object) -> str | None:
    """`packing_refusal` from a model's config alone (its causal-LM class, before any weight is
    read): why that architecture cannot pack, or None (it can, or the class is not known here)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    mapping: Any = MODEL_FOR_CAUSAL_LM_MAPPING  # config class -> causal-LM class (lazily imported)
    try:
        cls = mapping[type(config)]
    except KeyError:
        return None
    base = sys.modules.get(cls.__module__)
    if "position_ids" not in inspect.signature(cls.forward).parameters:
        return f"{cls.__name__}'s decoder takes no position_ids"
    if getattr(base, "create_causal_mask", None) is None:
        return f"{cls.__name__} builds its own attention mask (not transformers' create_causal_mask)"
    return None


def packing_refusal(model: nn.Module) -> str | None:
    """Why `model`'s attention cannot take packed rows (None: it can): its decoder must take
    `position_ids` and build its mask with transformers' `create_causal_mask`, which turns
    restarting positions into a document mask."""
    for lm in causal_lms(model):
        decoder = cast(Callable[[], nn.Module], lm.get_decoder)()
        name = type(lm).__name__
        if "position_ids" not in inspect.signature(decoder.forward).parameters:
            return f"{name}'s decoder takes no position_ids"
        module = sys.modules.get(type(decoder).__module__)
        if getattr(module, "create_causal_mask", None) is None:
            return f"{name} builds its own attention mask (not transformers' create_causal_mask)"
        implementation = str(getattr(lm.config, "_attn_implementation", "") or "")
        if implementation not in ("", "sdpa", "eager", "flex_attention") and "flash" not in implementation:
            return f"{name} runs attention implementation {implementation!r}"
    return None


def enable_packing(model: nn.Module) -> None:
    """Mark every causal LM in `model` so that its forwards pack (a copy made later keeps the mark:
    the reference and a critic copied from the policy or the reward model). Raises ValueError when
    its architecture cannot pack (`packing_refusal`)."""
    why = packing_refusal(model)
    if why is not None:
        raise ValueError(why)
    for lm in causal_lms(model):
        setattr(lm, PACKING_ATTRIBUTE, True)
