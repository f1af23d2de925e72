"""A step's statistics: token-weighted means of its micro-batches' figures, over the ranks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlhf.core import explained_variance
from rlhf.parallel.peers import Peers


class StepStats:
    """The stats of one optimizer step: token-weighted means of per-micro-batch stats; keys ending
    in `_max`/`_min` combine by max/min; explained variance over the whole minibatch's tokens
    (a ratio of variances, not a token mean: averaging it over micro-batches would be wrong).

    The sums and extremes stay float64 tensors on the stats' device until `result` reads them all
    in one transfer: on a GPU each read is a host-device sync that stalls the launches of the next
    micro-batch (12 a policy step before). float64 keeps the figures those of Python floats."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}  # float64 scalars, on the stats' device
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, torch.Tensor] = {}
        self.values: list[torch.Tensor] = []  # critic values and returns on valid tokens, for the
        self.returns: list[torch.Tensor] = []  # minibatch's explained variance

    def add(self, stats: Mapping[str, Any], weight: float, prefix: str) -> None:
        if weight <= 0:  # a micro-batch without a valid token (a sharded rank's filler) adds nothing
            return
        for key, value in stats.items():
            name = f"{prefix}/{key}"
            value = torch.as_tensor(value).detach().double().reshape(())  # a scalar, as float() took
            if key.endswith(("_max", "_min")):
                old = self.extremes.get(name)
                pick = torch.maximum if key.endswith("_max") else torch.minimum
                self.extremes[name] = value if old is None else pick(old, value)
                continue
            self.sums[name] = self.sums.get(name, 0.0) + value * weight
            self.weights[name] = self.weights.get(name, 0.0) + weight

    def _read(self) -> tuple[dict[str, float], dict[str, float]]:
        """The sums and extremes as Python floats, read from the device in one transfer."""
        names = [*self.sums, *self.extremes]
        held = [*self.sums.values(), *self.extremes.values()]
        read = torch.stack([v.to(held[0].device) for v in held]).tolist() if held else []
        floats = dict(zip(names, read))
        return {k: floats[k] for k in self.sums}, {k: floats[k] for k in self.extremes}

    def add_values(self, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> None:
        valid = mask.bool()
        self.values.append(values.detach()[valid].float())
        self.returns.append(returns[valid].float())

    def result(self, peers: Peers | None = None) -> dict[str, float]:
        """The step's stats; with `peers` (data-parallel ranks, rlhf/parallel/peers.py) over the
        micro-batches of every rank."""
        sums, extremes = self._read()
        if peers is not None:
            return merged_step_stats(peers.gather((sums, self.weights, extremes, self.moments())))
        out = {k: sums[k] / max(self.weights[k], 1e-12) for k in sums}
        out.update(extremes)
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


def merged_step_stats(
    parts: list[tuple[dict[str, float], dict[str, float], dict[str, float], list[float]]],
) -> dict[str, float]:
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
