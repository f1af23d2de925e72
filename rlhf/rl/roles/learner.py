"""What every trained role owns beside its learner (rlhf/train/learner.py): micro-batches of
experience and the stats of an optimizer step.

A role's `train_step(minibatch, total_tokens)` takes one optimizer step on a minibatch. The loss
is a token mean over the minibatch, accumulated over micro-batches of `micro_batch_size` rows:
each micro-batch's token-mean loss is weighted by its share of `total_tokens`
(`rlhf.core.micro_batch_weight`; docs/algorithms.md#18-token-mean-accumulation-over-micro-batches). `total_tokens`
comes from the caller, so that the mean stays exact when a runtime splits the rows of a
minibatch between processes (each holds a part; the count is the whole minibatch's).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from rlhf.config import OptimConfig
from rlhf.core import explained_variance, micro_batch_weight
from rlhf.rl.experience import Experience
from rlhf.runtime.fsdp import Lockstep
from rlhf.runtime.parallel_plan import ParallelPlan
from rlhf.train.learner import Learner


class StepStats:
    """The stats of one optimizer step: token-weighted means of per-micro-batch stats; keys ending
    in `_max`/`_min` combine by max/min; explained variance over the whole minibatch's tokens
    (a ratio of variances, not a token mean: averaging it over micro-batches would be wrong)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.values: list[torch.Tensor] = []  # critic values and returns on valid tokens, for the
        self.returns: list[torch.Tensor] = []  # minibatch's explained variance

    def add(self, stats: dict, weight: float, prefix: str) -> None:
        if weight <= 0:  # a micro-batch without a valid token (a sharded rank's filler) adds nothing
            return
        for key, value in stats.items():
            name = f"{prefix}/{key}"
            if key.endswith(("_max", "_min")):
                pick = max if key.endswith("_max") else min
                self.extremes[name] = pick(self.extremes.get(name, float(value)), float(value))
                continue
            self.sums[name] = self.sums.get(name, 0.0) + float(value) * weight
            self.weights[name] = self.weights.get(name, 0.0) + weight

    def add_values(self, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> None:
        valid = mask.bool()
        self.values.append(values.detach()[valid].float())
        self.returns.append(returns[valid].float())

    def result(self, peers=None) -> dict[str, float]:
        """The step's stats; with `peers` (data-parallel ranks, rlhf/runtime/peers.py) over the
        micro-batches of every rank."""
        if peers is not None:
            return merged_step_stats(peers.gather((self.sums, self.weights, self.extremes, self.moments())))
        out = {k: self.sums[k] / max(self.weights[k], 1e-12) for k in self.sums}
        out.update(self.extremes)
        if self.values:
            v, g = torch.cat(self.values), torch.cat(self.returns)
            out["value/explained_variance"] = float(explained_variance(v, g, torch.ones_like(v)))
        return out

    def moments(self) -> list[float]:
        """[n, sum G, sum G^2, sum R, sum R^2] (float64) of returns G and residuals R = G - V: what the
        explained variance of several ranks' tokens needs."""
        if not self.values:
            return [0.0] * 5
        g = torch.cat(self.returns).double()
        r = g - torch.cat(self.values).double()
        return [
            float(len(g)),
            float(g.sum()),
            float(g.square().sum()),
            float(r.sum()),
            float(r.square().sum()),
        ]


def merged_step_stats(parts: list[tuple[dict, dict, dict, list[float]]]) -> dict[str, float]:
    """StepStats.result over the (sums, weights, extremes, moments) of every rank's micro-batches."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    extremes: dict[str, float] = {}
    for part_sums, part_weights, part_extremes, _ in parts:
        for k, v in part_sums.items():
            sums[k] = sums.get(k, 0.0) + v
            weights[k] = weights.get(k, 0.0) + part_weights[k]
        for k, v in part_extremes.items():
            extremes[k] = (max if k.endswith("_max") else min)(extremes.get(k, v), v)
    out = {k: sums[k] / max(weights[k], 1e-12) for k in sums}
    out.update(extremes)
    n, g, g2, r, r2 = (sum(m[i] for *_, m in parts) for i in range(5))
    if n > 0:
        var_g = (g2 - g * g / n) / (n - 1) if n > 1 else 0.0
        var_r = (r2 - r * r / n) / (n - 1) if n > 1 else 0.0
        out["value/explained_variance"] = 1 - var_r / var_g if var_g > 0 else 0.0
    return out


def mean_over_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """The stats of an update from those of its optimizer steps: the mean over the steps that have a
    key (each step is one minibatch's token mean), `_max`/`_min` keys by max/min."""
    merged: dict[str, list[float]] = {}
    for stats in steps:
        for key, value in stats.items():
            merged.setdefault(key, []).append(value)
    out = {}
    for key, values in merged.items():
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = sum(values) / len(values)
    return out


class RoleLearner(Learner):
    """A role that trains (policy, critic): a `Learner` (rlhf/train/learner.py) whose optimizer steps
    take minibatches of experience in micro-batches of `micro_batch_size` rows (`sort_by_length`:
    rows of similar length together, the same token-mean gradient)."""

    prefix = ""  # metric namespace: "policy" or "value"

    def __init__(
        self,
        module: nn.Module,
        optim: OptimConfig,
        total_steps: int,
        micro_batch_size: int,
        sort_by_length: bool = True,
        parallel: ParallelPlan | None = None,
        uses_every_parameter: bool = False,
    ) -> None:
        # `parallel`: the data-parallel strategy it trains under (rlhf/runtime/parallel_plan.py)
        options = parallel.learner_options() if parallel is not None else {}
        super().__init__(module, optim, total_steps, uses_every_parameter=uses_every_parameter, **options)
        self.micro_batch_size = micro_batch_size
        self.sort_by_length = sort_by_length  # runtime.sort_by_length

    def loss_denominator(self, minibatch: Experience) -> float:
        """What the summed token losses of `minibatch` are divided by (the `total_tokens` of
        train_step): its valid tokens, for a token mean. A runtime that splits the rows between
        processes sums this over them."""
        return minibatch.num_tokens

    def micro_batches(
        self, minibatch: Experience, total_tokens: float, lockstep: Lockstep | None = None
    ) -> Iterator[tuple[Experience, float]]:
        """(micro-batch, weight): weight = the micro-batch's share of `total_tokens` (token mean);
        micro-batches without a valid token are skipped, or with `lockstep` run at weight 0, and
        fillers follow up to `lockstep.micro_batches`."""
        count = 0
        for micro in minibatch.micro_batches(self.micro_batch_size, self.sort_by_length):
            weight = micro_batch_weight(micro.response_mask, max(total_tokens, 1.0))
            if weight > 0 or lockstep is not None:
                count += 1
                yield micro, weight
        if lockstep is not None:
            for _ in range(lockstep.micro_batches - count):
                yield lockstep.filler, 0.0

    def drop_weightless_gradients(self, total_tokens: float, lockstep: Lockstep | None) -> None:
        """In lockstep, a minibatch without a valid token on any rank still ran its backwards, at weight
        0; one process would have run none, and AdamW skips a parameter without a gradient (no
        moment decay, no weight decay): drop the zeros so that the step is the same."""
        if lockstep is not None and total_tokens <= 0:
            self.optimizer.zero_grad(set_to_none=True)
