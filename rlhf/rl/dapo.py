"""DAPO's rollout-side switches (Yu et al. 2025, "DAPO", arXiv 2503.14476): dynamic sampling, which
refills the batch with groups that carry a signal (DAPO paper §3.2; docs/algorithms.md §36), and
the soft overlong punishment added to the scores (DAPO paper §3.4; docs/algorithms.md §37).

The per-row math is in rlhf/core/dapo.py (`informative_groups`, `overlong_penalty`); here are the
loop's pieces that sample again and join rollouts: `DynamicSampling`, a rollout source over
another (rlhf/rl/rollout_source.py), and the scores' shaping the Scorer applies (rlhf/rl/scorer.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.functional import pad

from rlhf.core import informative_groups, overlong_penalty
from rlhf.models.rollout_rows import concat_rollouts, select_rollout
from rlhf.models.sampling import Rollout

if TYPE_CHECKING:
    from rlhf.rl.rollout_source import RolloutSource


@dataclass
class Scored:
    """One sampled and scored rollout: the group id of each row, the rollout, its raw scores, its
    scores after the truncation policy (and overlong shaping), the rows kept, how many updates old
    its sampler's policy was, each episode turn's reward at its last token (multi-turn; else None),
    and the metrics of its sampling and scoring (reward parts, env/*, time/*)."""

    group: torch.Tensor  # [B] long
    rollout: Rollout
    raw_scores: torch.Tensor  # [B]
    scores: torch.Tensor  # [B]
    keep: torch.Tensor  # [B] bool
    behind: int = 0
    turn_rewards: torch.Tensor | None = None  # [B, T]
    metrics: dict[str, float] = field(default_factory=dict)


def overlong_buffer_tokens(share: float, max_length: int) -> int:
    """L_cache in tokens: `share` of the budget, rounded, at least 1 (reward.overlong_buffer)."""
    return min(max_length, max(1, round(share * max_length)))


def shaped_scores(
    scores: torch.Tensor, lengths: torch.Tensor, max_length: int, buffer: int, factor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores + factor * overlong_penalty(lengths), the penalties [B]): DAPO's soft overlong
    punishment (DAPO paper §3.4, eq. 13) with L_max = `max_length` (rollout.max_new_tokens, so a
    truncated response gets -factor) and L_cache = `buffer` tokens; `lengths` count the response's
    tokens, its EOS included."""
    penalty = factor * overlong_penalty(lengths, max_length, buffer).to(scores.device, scores.dtype)
    return scores + penalty, penalty


def select_groups(scored: Scored, ids: torch.Tensor) -> Scored:
    """The rows of `scored` whose group id is in `ids`, in their order."""
    rows = torch.isin(scored.group, ids.to(scored.group.device)).nonzero().squeeze(1)
    return Scored(
        scored.group[rows],
        select_rollout(scored.rollout, rows),
        scored.raw_scores[rows],
        scored.scores[rows],
        scored.keep[rows],
        scored.behind,
        None if scored.turn_rewards is None else scored.turn_rewards[rows],
        scored.metrics,
    )


def fill_with_informative(
    first: Scored, draw: Callable[[], Scored], groups: int, max_rounds: int, pad_token_id: int = 0
) -> tuple[Scored, dict[str, float]]:
    """DAPO dynamic sampling (DAPO paper §3.2, Algorithm 1 lines 5-8): keep the groups of `first`
    whose kept rows' scores are not all equal (``informative_groups``), and `draw` further rollouts
    until `groups` informative groups are kept or `max_rounds` rollouts (the first included) are
    drawn; the batch is then the first `groups` of them, in the order drawn. Group ids are renumbered
    0..k-1 so that groups of different rounds never share one. When no round gave an informative
    group the last rollout is trained on as it is (its advantages are 0 where a group estimator
    reads them; the metrics say so).

    Metrics: ``dynamic_sampling/rounds`` (rollouts drawn), ``.../informative_fraction`` (informative
    groups over groups drawn), ``.../fill`` (groups trained on over `groups`; below 1 when the cap
    ended the search), ``time/dynamic_sampling`` (the extra rounds' sampling and scoring)."""
    started = time.perf_counter()
    kept: list[Scored] = []
    count, drawn, informative_count, rounds, scored = 0, 0, 0, 0, first
    while True:
        rounds += 1
        ids = torch.unique(scored.group)
        drawn += len(ids)
        good = torch.unique(scored.group[informative_groups(scored.scores, scored.group, keep=scored.keep)])
        informative_count += len(good)
        if len(good) and count < groups:
            good = good[: groups - count]  # in id order: the prompts' order in the batch
            count += len(good)
            kept.append(select_groups(scored, good))
        if count >= groups or rounds >= max_rounds:
            break
        scored = draw()
    metrics = {
        "dynamic_sampling/rounds": float(rounds),
        "dynamic_sampling/informative_fraction": informative_count / max(drawn, 1),
        "dynamic_sampling/fill": count / groups,
        "time/dynamic_sampling": time.perf_counter() - started,
    }
    if not kept:
        return scored, metrics
    group = torch.cat(
        [torch.unique(s.group, return_inverse=True)[1] + offset for s, offset in zip(kept, _offsets(kept))]
    )
    joined = Scored(
        group,
        concat_rollouts([s.rollout for s in kept], pad_token_id),
        torch.cat([s.raw_scores for s in kept]),
        torch.cat([s.scores for s in kept]),
        torch.cat([s.keep for s in kept]),
        max(s.behind for s in kept),
        _joined_turn_rewards(kept),
        scored.metrics,  # the last round's: its reward parts and env/* monitors
    )
    return joined, metrics


def _joined_turn_rewards(parts: list[Scored]) -> torch.Tensor | None:
    """The turn rewards of the parts, each right-padded with 0 to the widest response block."""
    if any(s.turn_rewards is None for s in parts):
        return None
    width = max(s.rollout.response_mask.shape[1] for s in parts)
    return torch.cat(
        [
            pad(s.turn_rewards, (0, width - s.turn_rewards.shape[1]))
            for s in parts
            if s.turn_rewards is not None
        ]
    )


def _offsets(parts: list[Scored]) -> list[int]:
    offsets, total = [], 0
    for s in parts:
        offsets.append(total)
        total += len(torch.unique(s.group))
    return offsets


class DynamicSampling:
    """DAPO dynamic sampling as a rollout source (DAPO paper §3.2; docs/algorithms.md §36): `source`
    is drawn again within the iteration until `rollout.batch_size` groups whose scores differ are
    kept (`fill_with_informative`), or `rollout.max_sampling_rounds` rollouts are drawn."""

    def __init__(self, source: RolloutSource, groups: int, max_rounds: int, pad_token_id: int) -> None:
        self.source, self.groups, self.max_rounds, self.pad_token_id = (
            source,
            groups,
            max_rounds,
            pad_token_id,
        )

    def next_batch(self, iteration: int) -> Scored:
        first = self.source.next_batch(iteration)
        scored, sampling = fill_with_informative(
            first, lambda: self.source.next_batch(iteration), self.groups, self.max_rounds, self.pad_token_id
        )
        # time/score: the first round's scoring and every extra round's sampling and scoring
        timing = {"time/generate": first.metrics["time/generate"],
                  "time/score": first.metrics["time/score"] + sampling["time/dynamic_sampling"]}  # fmt: skip
        return replace(scored, metrics={**scored.metrics, **sampling, **timing})

    def sample_ahead(self, iteration: int) -> None:
        self.source.sample_ahead(iteration)

    def state(self) -> dict[str, Any]:
        return self.source.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.source.load_state(state)
