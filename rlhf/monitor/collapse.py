"""Pattern-collapse detector (PPO paper §5.2, "pattern collapse"; docs/algorithms.md#22-collapse-monitors).

Reward and loss curves look healthy while the policy collapses into a few patterns that cheat the
reward model; what reveals it is that, together, the KL to the reference climbs, the policy's
perplexity on its own responses drops, and the response length drifts or the diversity (distinct-2)
collapses. Each moves in healthy training too, so `CollapseDetector` warns only when the KL and
perplexity conditions hold with a pattern condition for `patience` updates in a row, each signal a
rolling median against a baseline median (the rules: the class's docstring).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_STATE_VERSION = 1


@dataclass(frozen=True)
class _Signal:
    name: str  # "kl" | "ppl" | "length" | "diversity"
    key: str  # metric key read from the update's dict
    threshold: float


def _finite_float(value: Any) -> float | None:
    if value is None or isinstance(value, (bool, str)):
        return None
    if hasattr(value, "detach"):  # a tensor, without importing torch
        value = value.detach().cpu().item()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


class CollapseDetector:
    """Watches KL, policy perplexity, response length and distinct-2 per iteration.

    baseline: the median of each signal over the first `baseline_steps` updates; current: the median
    over the last `window` updates (with window 5, three collapsed values are needed). Conditions:
      KL rises:          current_kl  >= kl_rise * max(baseline_kl, kl_floor)   (KL starts near 0)
      perplexity drops:  current_ppl <= (1 - ppl_drop) * baseline_ppl
      length drifts:     |current_len - baseline_len| >= length_drift * max(baseline_len, 1 token)
      diversity drops:   current_distinct2 <= (1 - diversity_drop) * baseline_distinct2
    KL and perplexity (if enabled) and one enabled pattern condition for `patience` consecutive
    updates -> one warning; quiet while the signature persists, re-armed after `patience` updates
    without it. A threshold of None disables its signal. Updates missing a signal or carrying
    NaN/inf are skipped; updates at a step <= the last seen one (replays after a resume) ignored.

    Args:
        window: updates in the rolling median that gives the current value of each signal.
        baseline_steps: first updates whose median is the baseline.
        kl_rise: the KL must reach this multiple of its baseline (None: not required).
        kl_floor: the KL baseline is at least this (nats, the same unit as the logged KL).
        ppl_drop: the perplexity must fall by this fraction of its baseline (None: not required).
        length_drift: the length must move (up or down) by this fraction of its baseline (None: not required).
        diversity_drop: distinct-2 must fall by this fraction of its baseline (None: off); with both
            length_drift and diversity_drop set, either one completes the signature.
        patience: consecutive updates the whole signature must hold before a warning.
        kl_key, ppl_key, length_key: the metric names read from each update's dict.
    """

    def __init__(
        self,
        window: int = 5,
        baseline_steps: int = 5,
        kl_rise: float | None = 3.0,
        kl_floor: float = 0.01,
        ppl_drop: float | None = 0.25,
        length_drift: float | None = 0.3,
        patience: int = 3,
        kl_key: str = "kl",
        ppl_key: str = "policy_ppl",
        length_key: str = "response_length",
        diversity_drop: float | None = None,
        diversity_key: str = "distinct2",
    ) -> None:
        for name, value in (("window", window), ("baseline_steps", baseline_steps), ("patience", patience)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CollapseDetector: {name} must be an int >= 1, got {value!r}")
        if kl_rise is not None and not kl_rise > 1.0:
            raise ValueError(f"CollapseDetector: kl_rise is a ratio and must be > 1, got {kl_rise!r}")
        if not kl_floor > 0.0:
            raise ValueError(f"CollapseDetector: kl_floor must be > 0, got {kl_floor!r}")
        if ppl_drop is not None and not 0.0 < ppl_drop < 1.0:
            raise ValueError(f"CollapseDetector: ppl_drop is a fraction in (0, 1), got {ppl_drop!r}")
        if length_drift is not None and not length_drift > 0.0:
            raise ValueError(f"CollapseDetector: length_drift must be > 0, got {length_drift!r}")
        if diversity_drop is not None and not 0.0 < diversity_drop < 1.0:
            raise ValueError(
                f"CollapseDetector: diversity_drop is a fraction in (0, 1), got {diversity_drop!r}"
            )
        candidates = (
            ("kl", kl_key, kl_rise),
            ("ppl", ppl_key, ppl_drop),
            ("length", length_key, length_drift),
            ("diversity", diversity_key, diversity_drop),
        )
        self.signals = [_Signal(name, key, float(t)) for name, key, t in candidates if t is not None]
        if not self.signals:
            raise ValueError("CollapseDetector: every signal is disabled; keep at least one threshold")
        self.window, self.baseline_steps, self.patience, self.kl_floor = (
            window,
            baseline_steps,
            patience,
            kl_floor,
        )
        self._reset_state()

    def _reset_state(self) -> None:
        self._baseline_values: dict[str, list[float]] = {s.name: [] for s in self.signals}
        self._baseline_first_step: int | None = None
        self._baseline_last_step: int | None = None
        self._recent: dict[str, deque[float]] = {s.name: deque(maxlen=self.window) for s in self.signals}
        self._streak = 0  # consecutive updates with the whole signature
        self._streak_start: int | None = None
        self._clear_streak = 0  # consecutive updates without it, while active
        self.active = False  # the signature currently holds (a warning was given for this episode)
        self.fired = False
        self.first_fired_step: int | None = None
        self.fired_steps: list[int] = []
        self.last_step: int | None = None
        self.last_evidence: dict[str, dict[str, float]] = {}

    # -- evaluation -----------------------------------------------------------------------------

    @property
    def baseline_ready(self) -> bool:
        return len(self._baseline_values[self.signals[0].name]) >= self.baseline_steps

    def baseline(self) -> dict[str, float] | None:
        """The baseline median of each enabled signal, or None while it is being collected."""
        if not self.baseline_ready:
            return None
        return {name: statistics.median(values) for name, values in self._baseline_values.items()}

    def _holds(self, signal: _Signal, base: float, current: float) -> tuple[bool, float]:
        """Whether one condition holds, and its effect size (ratio for KL, relative change otherwise)."""
        if signal.name == "kl":
            ratio = current / max(base, self.kl_floor)
            return ratio >= signal.threshold, ratio
        if signal.name in ("ppl", "diversity"):
            change = (current - base) / base if base > 0 else 0.0
            return change <= -signal.threshold, change
        change = (current - base) / max(abs(base), 1.0)
        return abs(change) >= signal.threshold, change

    def update(self, step: int, metrics: Mapping[str, Any]) -> list[str]:
        """Feed one iteration's metrics; return warnings (at most one), empty when all is well."""
        if self.last_step is not None and step <= self.last_step:
            return []
        self.last_step = int(step)
        values = {s.name: _finite_float(metrics.get(s.key)) for s in self.signals}
        if any(v is None for v in values.values()):
            return []
        for name, value in values.items():
            self._recent[name].append(value)
        if not self.baseline_ready:
            for name, value in values.items():
                self._baseline_values[name].append(value)
            self._baseline_first_step = (
                self._baseline_first_step if self._baseline_first_step is not None else int(step)
            )
            self._baseline_last_step = int(step)
            return []

        base = self.baseline()
        assert base is not None
        evidence, holding = {}, {}
        for signal in self.signals:
            current = statistics.median(self._recent[signal.name])
            holding[signal.name], effect = self._holds(signal, base[signal.name], current)
            evidence[signal.name] = {"baseline": base[signal.name], "current": current, "effect": effect}
        self.last_evidence = evidence
        pattern = [holding[n] for n in ("length", "diversity") if n in holding]
        all_hold = all(holding.get(n, True) for n in ("kl", "ppl")) and (any(pattern) if pattern else True)

        if not all_hold:
            self._streak, self._streak_start = 0, None
            if self.active:
                self._clear_streak += 1
                if self._clear_streak >= self.patience:
                    self.active, self._clear_streak = False, 0
            return []
        self._clear_streak = 0
        self._streak += 1
        if self._streak_start is None:
            self._streak_start = int(step)
        if self._streak < self.patience or self.active:
            return []
        self.active = self.fired = True
        if self.first_fired_step is None:
            self.first_fired_step = int(step)
        self.fired_steps.append(int(step))
        return [self._message(int(step), evidence)]

    def _message(self, step: int, evidence: dict[str, dict[str, float]]) -> str:
        parts = []
        for signal in self.signals:
            e = evidence[signal.name]
            if signal.name == "kl":
                parts.append(
                    f"KL to reference {e['baseline']:.4g} -> {e['current']:.4g} "
                    f"(x{e['effect']:.1f}, threshold x{signal.threshold:g})"
                )
            elif signal.name == "ppl":
                parts.append(
                    f"policy perplexity {e['baseline']:.4g} -> {e['current']:.4g} "
                    f"({100 * e['effect']:+.0f}%, threshold -{100 * signal.threshold:.0f}%)"
                )
            elif signal.name == "diversity":
                parts.append(
                    f"distinct-2 {e['baseline']:.4g} -> {e['current']:.4g} "
                    f"({100 * e['effect']:+.0f}%, threshold -{100 * signal.threshold:.0f}%)"
                )
            else:
                parts.append(
                    f"response length {e['baseline']:.4g} -> {e['current']:.4g} "
                    f"({100 * e['effect']:+.0f}%, threshold ±{100 * signal.threshold:.0f}%)"
                )
        return (
            f"pattern collapse suspected at step {step} (PPO paper §5.2): "
            + "; ".join(parts)
            + f" — held for {self._streak} updates since step {self._streak_start}"
            + f" (baseline: median of steps {self._baseline_first_step}-{self._baseline_last_step}, "
            + f"current: median of the last {self.window}). The reward curve does not show this: "
            + "read the samples; a KL penalty (PPO-max) keeps the policy near the reference."
        )

    # -- resume ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The detector's state as plain JSON types (for checkpoints)."""
        return {
            "version": _STATE_VERSION,
            "signals": [s.name for s in self.signals],
            "baseline_values": {k: list(v) for k, v in self._baseline_values.items()},
            "baseline_first_step": self._baseline_first_step,
            "baseline_last_step": self._baseline_last_step,
            "recent": {k: list(v) for k, v in self._recent.items()},
            "streak": self._streak,
            "streak_start": self._streak_start,
            "clear_streak": self._clear_streak,
            "active": self.active,
            "fired": self.fired,
            "first_fired_step": self.first_fired_step,
            "fired_steps": list(self.fired_steps),
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict()`; the enabled signals must match this detector's."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"CollapseDetector.load_state_dict: unknown state version {state.get('version')!r}"
            )
        names = [s.name for s in self.signals]
        if list(state["signals"]) != names:
            raise ValueError(
                f"CollapseDetector.load_state_dict: the checkpoint watches {state['signals']}, this detector {names}; "
                "resume with the same collapse thresholds enabled"
            )
        self._reset_state()
        self._baseline_values = {k: [float(x) for x in state["baseline_values"][k]] for k in names}
        self._baseline_first_step = state["baseline_first_step"]
        self._baseline_last_step = state["baseline_last_step"]
        self._recent = {k: deque((float(x) for x in state["recent"][k]), maxlen=self.window) for k in names}
        self._streak, self._streak_start = int(state["streak"]), state["streak_start"]
        self._clear_streak = int(state["clear_streak"])
        self.active, self.fired = bool(state["active"]), bool(state["fired"])
        self.first_fired_step = state["first_fired_step"]
        self.fired_steps = [int(s) for s in state["fired_steps"]]
        self.last_step = state["last_step"]
