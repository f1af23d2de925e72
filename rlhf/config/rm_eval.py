"""`rlhf rm-eval`: a reward model judged on a file of preference pairs.

The pairs are read as `rlhf rm` reads them (`data`: a RewardDataConfig); the budgets not given here
are the reward model's own (its config.yaml, a layer under these settings: rlhf/stages/rm_eval.py).
Every field is also a named flag of the command (`--batch-size` is `--batch_size`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhf.config.checks import refuse, require, required, validate_groups
from rlhf.config.fields import Dtype
from rlhf.config.rm import RewardDataConfig

MAX_BINS = 1000  # calibration and histogram bins: more than any figure shows


@dataclass
class RMEvalConfig:
    reward_model: str = ""  # reward-model directory, the --out of `rlhf rm` (--reward-model)
    data: RewardDataConfig = field(default_factory=RewardDataConfig)  # the pairs (--data: data.path)
    out: str = ""  # where rm_eval.json is written; "": in the reward-model directory (--out)
    n: int | None = None  # score only the first N valid pairs (N >= 1, as `rlhf eval --n`); None: all (--n)
    batch_size: int = 8  # pairs per forward (--batch-size)
    worst: int = 10  # worst pairs (most negative margin) kept (--worst)
    calibration_bins: int = 10  # bins of sigmoid(|margin|) (--calibration-bins)
    histogram_bins: int = 10  # margin histogram bins, even: 0 is the middle edge (--histogram-bins)
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N" (--device)
    dtype: Dtype = "auto"  # precision of the reward model (fields.Dtype; --dtype)

    def validate(self, prefix: str = "") -> None:
        required(self.reward_model, f"{prefix}reward_model", "--reward-model DIR")
        required(self.data.path, f"{prefix}data.path", "--data PAIRS_FILE")
        validate_groups(self, prefix)
        for key, low in (("batch_size", 1), ("worst", 0), ("calibration_bins", 1), ("histogram_bins", 2)):
            value = getattr(self, key)
            flag = "--" + key.replace("_", "-")
            require(value >= low, f"{prefix}{key}", value, f"must be >= {low}", f"{flag} {max(low, 1) * 10}")
        require(
            self.n is None or self.n >= 1,
            f"{prefix}n",
            self.n,
            "must be >= 1 (the first N pairs, as `rlhf eval --n`; leave it out to score every pair)",
            "--n 100, or no --n for every pair",
        )
        for key in ("calibration_bins", "histogram_bins"):  # a bin count no figure needs: hours of binning
            value = getattr(self, key)
            flag = "--" + key.replace("_", "-")
            require(value <= MAX_BINS, f"{prefix}{key}", value, f"must be <= {MAX_BINS}", f"{flag} 10")
        if self.histogram_bins % 2:
            refuse(
                f"{prefix}histogram_bins must be even (0 is the middle edge), got {self.histogram_bins}. "
                f"Fix: --histogram-bins {self.histogram_bins + 1}.",
                f"{prefix}histogram_bins",
            )
