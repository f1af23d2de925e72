"""`rlhf rm-eval`: a reward model judged on a file of preference pairs.

The pairs are read as `rlhf rm` reads them (`data`: a RewardDataConfig); the budgets not given here
are the reward model's own (its config.yaml, a layer under these settings: rlhf/stages/rm_eval.py).
Every field is also a named flag of the command (`--batch-size` is `--batch_size`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhf.config.checks import refuse, required, validate_groups
from rlhf.config.fields import Dtype
from rlhf.config.keys import Range, check_ranges, setting
from rlhf.config.rm import RewardDataConfig

MAX_BINS = 1000  # calibration and histogram bins: more than any figure shows


@dataclass
class RMEvalConfig:
    reward_model: str = ""  # reward-model directory, the --out of `rlhf rm` (--reward-model)
    data: RewardDataConfig = field(default_factory=RewardDataConfig)  # the pairs (--data: data.path)
    out: str = ""  # where rm_eval.json is written; "": in the reward-model directory (--out)
    # score only the first N valid pairs (N >= 1, as `rlhf eval --n`); None: all (--n)
    n: int | None = setting(
        None, Range(">= 1", "the first N pairs, as `rlhf eval --n`; leave it out to score every pair")
    )
    batch_size: int = setting(8, ">= 1", unit="pairs")  # pairs per forward (--batch-size)
    worst: int = setting(10, ">= 0", unit="pairs")  # worst pairs (most negative margin) kept (--worst)
    # bins of sigmoid(|margin|) (--calibration-bins); more than MAX_BINS: hours of binning no figure shows
    calibration_bins: int = setting(10, f"[1, {MAX_BINS}]")
    # margin histogram bins, even: 0 is the middle edge (--histogram-bins)
    histogram_bins: int = setting(10, f"[2, {MAX_BINS}]")
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N" (--device)
    dtype: Dtype = "auto"  # precision of the reward model (fields.Dtype; --dtype)

    def validate(self, prefix: str = "") -> None:
        check_ranges(self, prefix)
        required(self.reward_model, f"{prefix}reward_model", "--reward-model DIR")
        required(self.data.path, f"{prefix}data.path", "--data PAIRS_FILE")
        validate_groups(self, prefix)
        if self.histogram_bins % 2:
            refuse(
                f"{prefix}histogram_bins must be even (0 is the middle edge), got {self.histogram_bins}. "
                f"Fix: --histogram-bins {self.histogram_bins + 1}.",
                f"{prefix}histogram_bins",
            )
