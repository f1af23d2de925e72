"""How `rlhf train` samples its responses (the rollout group), and the PPO paper's sampling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.checks import at_least, positive, refuse, require, validate_groups, warn
from rlhf.config.fields import Sampling

# The PPO paper's evaluation sampling (PPO paper §6.1), which `rollout.sampling: paper` selects.
PAPER_SAMPLING = {"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.1}
MIN_USEFUL_TEMPERATURE = 0.05  # below it the sampled tokens' probabilities are ~1: ~0 policy gradient


@dataclass
class RolloutCorrectionConfig:
    """Importance weights from the sampler's log-probs to the trainer's, on the advantages
    (rlhf/core/rollout_correction.py; docs/algorithms.md §44)."""

    enabled: bool = False  # weight each token by pi_trainer / pi_sampler (the sampler returns its log-probs)
    level: Literal["token", "sequence"] = "token"  # per token, or the row's product on each of its tokens
    mode: Literal["truncate", "mask"] = "truncate"  # min(w, cap) | w inside [1/cap, cap], else 0
    cap: float = 2.0  # the truncation / the mask's band (truncated IS of Yao et al. 2025: 2)

    def validate(self, prefix: str) -> None:
        require(self.cap > 1, f"{prefix}cap", self.cap, "must be > 1", f"--{prefix}cap 2.0")


@dataclass
class RolloutConfig:
    batch_size: int = 64  # prompts sampled per iteration
    # responses sampled per prompt (a group); the rollout holds batch_size * samples_per_prompt rows
    samples_per_prompt: int = 1
    max_new_tokens: int = 64  # response budget; responses without EOS are "truncated"
    # "custom": the three fields below | "paper": the PPO paper §6.1 sampling, temperature 0.8,
    # top-p 0.9, repetition penalty 1.1 (SamplingConfig.ppo_paper); naming one of them too is an error
    sampling: Sampling = "custom"
    temperature: float = 1.0  # sampling temperature (log-probs use the same temperature)
    top_p: float = 1.0  # nucleus sampling (PPO paper: 0.9)
    top_k: int = 0  # top-k sampling; 0: off
    repetition_penalty: float = 1.0  # CTRL-style penalty (PPO paper: 1.1); 1.0: off
    stop_at_eos: bool = True  # end each response at its EOS (False: always max_new_tokens, for benchmarks)
    # rows that ended leave the sampler's batch (cheaper steps as a mixed-length batch drains; same tokens)
    drop_finished_rows: bool = True
    # how the sampler runs a decode step (rlhf/models/decoding.py; same tokens whichever): "eager" (a KV
    # cache grown per step), "static" (preallocated, fixed shapes), "cuda_graph" (static, each step
    # replayed from a CUDA graph), "compiled" (static, the decode step compiled by torch.compile and on
    # CUDA replayed from a CUDA graph; tokens equal to float rounding), "auto" (per device, the fastest
    # measured, docs/speed.md: on CUDA compiled from a rollout's third iteration for responses of 33+
    # tokens, else cuda_graph, static for a sliding window shorter than the call; eager on a CPU and
    # for a model without static-cache support, such as Mamba)
    engine: Literal["auto", "eager", "static", "cuda_graph", "compiled"] = "auto"
    # old log-probs from the sampler's own logits (as TRL does) instead of one more policy forward:
    # saves a forward per iteration; the first PPO ratio is then 1 only to float rounding (~1e-6 fp32)
    logprobs_from_sampler: bool = False
    # responses that hit max_new_tokens: kept as they are, given truncation_penalty as score, or dropped
    truncated: Literal["keep", "penalize", "drop"] = "keep"
    truncation_penalty: float = -1.0  # score given to truncated responses when truncated == "penalize"
    # asynchronous rollouts: up to this many batches sampled ahead while the policy updates, each by a
    # policy at most this many updates old, corrected by decoupled PPO (docs/algorithms.md §34;
    # needs dist.runtime ray with ray.rollout.num_actors >= 1). 0: the synchronous loop, exactly
    max_staleness: int = 0
    # DAPO dynamic sampling (DAPO paper §3.2; docs/algorithms.md §36): groups whose scores are all equal
    # (no group-relative signal) are dropped and more prompts sampled until batch_size groups remain
    dynamic_sampling: bool = False
    # the cap on rollouts per iteration under dynamic_sampling, the first included (extra rounds: this - 1);
    # when it is reached the batch trains with the informative groups found (dynamic_sampling/fill < 1)
    max_sampling_rounds: int = 4
    correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # sampler -> trainer

    def validate(self, prefix: str) -> None:
        validate_groups(self, prefix)
        at_least(self.max_sampling_rounds, 1, f"{prefix}max_sampling_rounds", " (rollouts per iteration)")
        at_least(self.max_staleness, 0, f"{prefix}max_staleness", " (0: synchronous)")
        at_least(self.batch_size, 1, f"{prefix}batch_size", " (prompts sampled per iteration)")
        at_least(self.samples_per_prompt, 1, f"{prefix}samples_per_prompt")
        at_least(self.max_new_tokens, 1, f"{prefix}max_new_tokens")
        positive(self.temperature, f"{prefix}temperature", 1.0)
        if self.temperature < MIN_USEFUL_TEMPERATURE:
            warn(
                "%stemperature %g is near 0: sampling is almost greedy and the log-probabilities of the "
                "sampled tokens are ~0, so the policy gradient is ~0 every iteration. Fix: "
                "--%stemperature 0.7 or more (1.0 samples the policy as trained).",
                prefix,
                self.temperature,
                prefix,
            )
        require(
            0 < self.top_p <= 1, f"{prefix}top_p", self.top_p, "must be in (0, 1]", f"--{prefix}top_p 1.0"
        )
        at_least(self.top_k, 0, f"{prefix}top_k", " (0: off)")
        positive(self.repetition_penalty, f"{prefix}repetition_penalty", 1.0, " (1.0: off)")
        if self.sampling == "paper":  # the three fields are the paper's; one set otherwise is a conflict
            for key, value in PAPER_SAMPLING.items():
                mine = getattr(self, key)
                if mine not in (1.0, value):
                    refuse(
                        f"{prefix}sampling paper samples with {key} {value}, but {prefix}{key} is set to "
                        f"{mine!r}. Fix: drop --{prefix}{key}, or set --{prefix}sampling custom.",
                        f"{prefix}{key}",
                    )
        if not self.stop_at_eos and self.truncated == "drop":
            refuse(
                f"{prefix}stop_at_eos false makes every response run to {prefix}max_new_tokens, so every "
                f"response is truncated, and {prefix}truncated drop drops them all: nothing is left to train "
                f"on. Fix: --{prefix}stop_at_eos true, or --{prefix}truncated keep (or penalize).",
                f"{prefix}truncated",
            )


def rollout_sampling(rollout: RolloutConfig) -> dict[str, float]:
    """The temperature, top-p and repetition penalty rollouts use: PAPER_SAMPLING with
    `rollout.sampling: paper`, else the three fields."""
    if rollout.sampling == "paper":
        return dict(PAPER_SAMPLING)
    return {key: getattr(rollout, key) for key in PAPER_SAMPLING}
