"""The samplers behind the agent server: the library's `generate` over a model (the requests'
temperature and top_p honoured), or a trainer runtime's `generate` (the rollout's own sampling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from rlhf.agents.batcher import Backend, Sampling
from rlhf.data.collate import left_pad
from rlhf.models.sampling import Rollout, SamplingConfig, generate


def model_backend(
    model: nn.Module,
    pad_token_id: int,
    eos_token_id: int | Sequence[int],
    *,
    base: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
) -> Backend:
    """`generate` over `model` (rlhf/models/sampling.py), the contexts left-padded into one batch:
    temperature 0 is greedy (log-probs at temperature 1), else the request's temperature and top_p."""
    base = base or SamplingConfig()

    def sample(contexts: list[list[int]], sampling: Sampling, max_new_tokens: int) -> Rollout:
        ids, mask = left_pad(contexts, pad_token_id)
        greedy = sampling.temperature == 0
        config = replace(
            base,
            max_new_tokens=max_new_tokens,
            temperature=1.0 if greedy else sampling.temperature,
            top_p=sampling.top_p,
            do_sample=not greedy,
        )
        return generate(model, ids, mask, config, eos_token_id, pad_token_id, generator, return_logprobs=True)

    return sample


def runtime_backend(runtime: Any) -> Backend:
    """A trainer runtime's `generate` (`rlhf.runtime.protocol.Runtime`): the rollout's sampling
    (`rollout.temperature`, ..., `rollout.max_new_tokens`) for every request, the behaviour policy
    the trainer's log-probs assume; a request's own max_tokens cuts its turn after sampling."""

    def sample(contexts: list[list[int]], sampling: Sampling, max_new_tokens: int) -> Rollout:
        rollout: Rollout = runtime.generate(contexts, True)
        return rollout

    return sample
