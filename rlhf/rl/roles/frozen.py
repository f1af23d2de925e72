"""The two frozen roles: the reference (log-probs that anchor the KL penalty) and the reward model
(a scalar per response)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from rlhf.models.precision import Precision
from rlhf.models.reference import ReferenceModel
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.sequences import Sequences
from rlhf.rl.experience import in_row_chunks, map_row_chunks
from rlhf.rl.roles.forward import autocast


class Reference:
    """The SFT policy, frozen: a copy, or the LoRA policy with its adapter switched off."""

    def __init__(
        self,
        reference: ReferenceModel,
        *,
        temperature: float,
        micro_batch_size: int,
        precision: Precision | None = None,
        sort_by_length: bool = True,
    ) -> None:
        self.reference = reference
        self.sort_by_length = sort_by_length  # runtime.sort_by_length
        self.precision = precision
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size

    @property
    def model(self) -> torch.nn.Module:
        return self.reference.model

    @contextmanager
    def session(self) -> Iterator[Callable[[Sequences], torch.Tensor]]:
        """Yields `logprobs(sequences) -> [B, T]` at the sampling temperature. The reference's
        weights are set once for the block (a LoRA adapter switched off), so a runtime may call
        `logprobs` from several threads at once inside it."""
        with self.reference.session() as logprobs:

            def chunked(sequences: Sequences) -> torch.Tensor:
                with autocast(self.precision):  # per call: autocast is per thread
                    return in_row_chunks(
                        lambda s: logprobs(s.input_ids, s.attention_mask, s.prompt_length, self.temperature),
                        sequences,
                        self.micro_batch_size,
                        self.sort_by_length,
                    )

            yield chunked


class RewardModel:
    """A scalar-head model read at the last real token of each row."""

    def __init__(
        self,
        model: ScalarHeadModel,
        *,
        micro_batch_size: int,
        precision: Precision | None = None,
        sort_by_length: bool = True,
    ) -> None:
        self.model = model.eval().requires_grad_(False)
        self.micro_batch_size = micro_batch_size
        self.precision = precision
        self.sort_by_length = sort_by_length  # runtime.sort_by_length

    @torch.no_grad()
    def score(self, sequences: Sequences) -> torch.Tensor:
        """Scores [B] (float32), `micro_batch_size` rows per forward, each chunk trimmed of its
        all-padding columns (the score is read at each row's last real token)."""
        with autocast(self.precision):
            return map_row_chunks(
                lambda ids, mask, _: self.model.score(ids, mask).float(),
                sequences.input_ids,
                sequences.attention_mask,
                sequences.prompt_length,
                self.micro_batch_size,
                self.sort_by_length,
            )
