"""The two frozen roles: the reference (log-probs that anchor the KL penalty) and the reward model
(a scalar per response). Each computes through one module, the unit a sharded run gathers
(rlhf/parallel/fsdp.py): the reference's `forward`, the reward model's `score`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rlhf.models.reference import ReferenceModel
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.sequences import Sequences
from rlhf.rl.experience import Scoring, map_row_chunks, scored_in_chunks, scoring_budget
from rlhf.rl.roles.forward import PolicyForward, autocast


class Reference:
    """The SFT policy, frozen: a copy, or the LoRA policy with its adapter switched off. Its
    log-probs come from `forward`: a PolicyForward of its own around a copy, or the policy's module
    (`policy_module`) in the adapter's case."""

    def __init__(
        self,
        reference: ReferenceModel,
        *,
        policy_module: nn.Module | None = None,
        temperature: float,
        scoring: Scoring,
    ) -> None:
        self.reference = reference
        self.scoring = scoring  # how its forwards cut the rows, and their precision
        self.temperature = temperature
        if reference.mode == "adapter" and policy_module is None:
            raise ValueError(
                "a LoRA policy's reference computes through the policy's module: pass policy_module"
            )
        self.forward: nn.Module
        if reference.mode == "copy":
            self.forward = PolicyForward(reference.model, scoring.precision)
        else:
            assert policy_module is not None  # "adapter", checked above
            self.forward = policy_module

    @property
    def own_module(self) -> nn.Module | None:
        """The module holding weights of the reference's own (a copy's), None when it borrows the policy's."""
        return self.forward if self.reference.mode == "copy" else None

    @property
    def model(self) -> torch.nn.Module:
        return self.reference.model

    @contextmanager
    def session(self, temperature: float | None = None) -> Iterator[Callable[[Sequences], torch.Tensor]]:
        """Yields `logprobs(sequences) -> [B, T]` at `temperature` (None: the sampling temperature).
        The reference's weights are set once for the block (a LoRA adapter switched off), so a
        runtime may call `logprobs` from several threads at once inside it."""
        temperature = self.temperature if temperature is None else temperature
        with self.reference.in_force():

            def chunked(sequences: Sequences) -> torch.Tensor:
                with torch.no_grad():  # per call: grad mode (and the forward's autocast) is per thread
                    return scored_in_chunks(
                        lambda s: self.forward(s, temperature)[0], sequences, self.scoring, self.forward
                    )

            yield chunked


class RewardModel:
    """A scalar-head model read at the last real token of each row."""

    def __init__(self, model: ScalarHeadModel, *, scoring: Scoring) -> None:
        self.model = model.eval().requires_grad_(False)
        self.scoring = scoring  # how its forwards cut the rows, and their precision

    @torch.no_grad()
    def score(self, sequences: Sequences) -> torch.Tensor:
        """Scores [B] (float32), rows cut into forwards as `scoring` says, each chunk trimmed of its
        all-padding columns (the score is read at each row's last real token)."""
        scoring = self.scoring
        with autocast(scoring.precision):
            return map_row_chunks(
                lambda ids, mask, _: self.model.score(ids, mask).float(),
                sequences.input_ids,
                sequences.attention_mask,
                sequences.prompt_length,
                scoring.micro_batch_size,
                scoring.by_length,
                tokens=scoring_budget(scoring.micro_batch_tokens, self.model),
            )
