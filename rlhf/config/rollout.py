"""How `rlhf train` samples its responses (the rollout group), and the PPO paper's sampling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.checks import refuse, warn
from rlhf.config.fields import Sampling
from rlhf.config.keys import When, setting

# The PPO paper's evaluation sampling (PPO paper §6.1), which `rollout.sampling: paper` selects.
PAPER_SAMPLING = {"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.1}
MIN_USEFUL_TEMPERATURE = 0.05  # below it the sampled tokens' probabilities are ~1: ~0 policy gradient


@dataclass
class RolloutCorrectionConfig:
    """Importance weights from the sampler's log-probs to the trainer's, on the advantages
    (rlhf/core/rollout_correction.py; docs/algorithms.md §44)."""

    enabled: bool = False  # weight each token by pi_trainer / pi_sampler (the sampler returns its log-probs)
    # per token, or the row's product on each of its tokens
    level: Literal["token", "sequence"] = setting("token", when=When("enabled", True))
    # min(w, cap) | w inside [1/cap, cap], else 0
    mode: Literal["truncate", "mask"] = setting("truncate", when=When("enabled", True))
    # the truncation / the mask's band (truncated IS of Yao et al. 2025: 2)
    cap: float = setting(2.0, "> 1", when=When("enabled", True))


@dataclass
class RolloutConfig:
    batch_size: int = setting(64, ">= 1", unit="prompts")  # prompts sampled per iteration
    # responses sampled per prompt (a group); the rollout holds batch_size * samples_per_prompt rows
    samples_per_prompt: int = setting(1, ">= 1")
    # response budget; responses without EOS are "truncated"
    max_new_tokens: int = setting(64, ">= 1", unit="tokens")
    # "custom": the three fields below | "paper": the PPO paper §6.1 sampling, temperature 0.8,
    # top-p 0.9, repetition penalty 1.1 (SamplingConfig.ppo_paper); naming one of them too is an error
    sampling: Sampling = "custom"
    # sampling temperature (log-probs use the same temperature)
    temperature: float = setting(1.0, "(0, 10]", why="above 10 every token is about equally likely")
    top_p: float = setting(1.0, "(0, 1]")  # nucleus sampling (PPO paper: 0.9)
    top_k: int = setting(0, ">= 0", unit="tokens")  # top-k sampling; 0: off
    # CTRL-style penalty (PPO paper: 1.1); 1.0: off
    repetition_penalty: float = setting(1.0, "(0, 10]", why="it divides a repeated token's logit")
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
    # score given to truncated responses when truncated == "penalize"
    truncation_penalty: float = setting(
        -1.0, "any", why="a score, usually negative", when=When("truncated", "penalize")
    )
    # asynchronous rollouts: up to this many batches sampled ahead while the policy updates, each by a
    # policy at most this many updates old, corrected by decoupled PPO (docs/algorithms.md §34;
    # needs dist.runtime ray with ray.rollout.num_actors >= 1). 0: the synchronous loop, exactly
    max_staleness: int = setting(0, ">= 0", unit="updates")
    # DAPO dynamic sampling (DAPO paper §3.2; docs/algorithms.md §36): groups whose scores are all equal
    # (no group-relative signal) are dropped and more prompts sampled until batch_size groups remain
    dynamic_sampling: bool = False
    # the cap on rollouts per iteration under dynamic_sampling, the first included (extra rounds: this - 1);
    # when it is reached the batch trains with the informative groups found (dynamic_sampling/fill < 1)
    max_sampling_rounds: int = setting(4, ">= 1", unit="rollouts", when=When("dynamic_sampling", True))
    correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # sampler -> trainer

    def validate(self, prefix: str) -> None:
        if self.temperature < MIN_USEFUL_TEMPERATURE:
            warn(
                "%stemperature %g is near 0: sampling is almost greedy and the log-probabilities of the "
                "sampled tokens are ~0, so the policy gradient is ~0 every iteration. Fix: "
                "--%stemperature 0.7 or more (1.0 samples the policy as trained).",
                prefix,
                self.temperature,
                prefix,
            )
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
