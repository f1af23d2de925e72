"""Prompt + response rows in the rollout layout (docs/internals.md, "Tensor layout of a rollout").

`input_ids [B, P + T]` is a left-padded prompt block of width P followed by a right-padded
response block of width T; `attention_mask` marks the real tokens. Every no-grad forward of a
rollout (scores, log-probs, values) reads this and nothing else, so a runtime may split the rows
between workers without knowing what the forward computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sequences:
    input_ids: torch.Tensor  # [B, P + T] long
    attention_mask: torch.Tensor  # [B, P + T] 0/1
    prompt_length: int  # P: columns of the prompt block

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_width(self) -> int:
        """T: columns of the response block."""
        return self.input_ids.shape[1] - self.prompt_length

    def rows(self, index: slice | torch.Tensor) -> Sequences:
        """The rows `index` (the layout's widths unchanged)."""
        return Sequences(self.input_ids[index], self.attention_mask[index], self.prompt_length)


def trimmed(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Rows in the rollout layout without their all-padding columns: the leading prompt columns
    that are padding in every row and the trailing response columns likewise. Positions come from
    the attention mask, so no real token's computation changes."""
    prompt_cols = attention_mask[:, :prompt_length]
    lead = int((prompt_cols.sum(0) == 0).long().cumprod(0).sum())
    used = attention_mask[:, prompt_length:].sum(0) > 0
    width = int(used.nonzero().max()) + 1 if bool(used.any()) else 1
    end = prompt_length + width
    return input_ids[:, lead:end], attention_mask[:, lead:end], prompt_length - lead
