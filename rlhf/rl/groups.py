"""Groups of responses to one prompt (`rollout.samples_per_prompt`) and their monitors
(docs/algorithms.md#27-critic-free-advantage-estimators)."""

from __future__ import annotations

import torch


def sample_groups(prompts: list[list[int]], samples_per_prompt: int) -> tuple[list[list[int]], torch.Tensor]:
    """Each prompt repeated `samples_per_prompt` times, the copies next to each other, and the group
    id of every row (the prompt's position in `prompts`)."""
    repeated = [prompt for prompt in prompts for _ in range(samples_per_prompt)]
    group = torch.arange(len(prompts)).repeat_interleave(samples_per_prompt)
    return repeated, group


def group_metrics(scores: torch.Tensor, group: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
    """Over the groups of the kept rows: `group/reward_std`, the mean within-group std of the scores
    (unbiased; a group needs two kept rows), and `group/zero_std_fraction`, the share of groups whose
    kept rows all scored the same (or that kept fewer than two rows): they give a group-relative
    estimator no signal."""
    stds, flat = [], 0
    for g in torch.unique(group).tolist():
        members = scores[(group == g) & keep].double()
        if len(members) < 2 or float(members.max() - members.min()) == 0.0:
            flat += 1
        if len(members) >= 2:
            stds.append(float(members.std()))
    count = len(torch.unique(group))
    return {
        "group/reward_std": sum(stds) / len(stds) if stds else 0.0,
        "group/zero_std_fraction": flat / count if count else 0.0,
    }
