"""`rlhf train`: policy optimization (PPO, PPO-max, APA, AWR, GRPO, RLOO, REINFORCE++).

The algorithm's groups are in rl_algorithm.py, the rollout's in rollout.py; here are the models,
data, the run's plumbing (train, runtime, log, checkpoint) and the stage config, whose `validate`
holds the rules that tie several groups together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config.agent import AgentConfig
from rlhf.config.checks import refuse, validate_groups, warn
from rlhf.config.common import LoraConfig, OptimConfig, compile_backend_known, compile_needs_no_fsdp2
from rlhf.config.env import EnvConfig
from rlhf.config.fields import ChatTemplate, DataFormat, Dtype, SystemPrompt
from rlhf.config.keys import When, check_ranges, setting
from rlhf.config.ray import RayConfig, RLDistConfig
from rlhf.config.remote import MismatchConfig
from rlhf.config.reward_sources import check_reward_weights
from rlhf.config.rl_algorithm import (
    AdvantageConfig,
    CriticConfig,
    KLConfig,
    PolicyLossConfig,
    RewardProcessingConfig,
)
from rlhf.config.rollout import RolloutConfig
from rlhf.core.advantages import ESTIMATORS, estimator_spec


def _needs_critic(estimator: str) -> bool:
    return estimator in ESTIMATORS and estimator_spec(estimator).needs_values


# the critic's settings: an estimator that needs no critic builds, trains and saves none
WITH_CRITIC = When(
    "advantage.estimator",
    _needs_critic,
    root=True,
    says="{key} uses a critic (gae)",
    fix="--{key} gae for a PPO critic",
    example="gae",
)


@dataclass
class RLModelConfig:
    policy: str = ""  # the SFT model directory (also the frozen reference)
    gguf_file: str | None = None  # GGUF file name inside `policy`
    reward_model: str = ""  # reward-model directory (ScalarHeadModel)
    # "reward_model" (PPO paper §5.3.3) | "policy" (the SFT trunk with a fresh head)
    critic_init: Literal["reward_model", "policy"] = setting("reward_model", when=WITH_CRITIC)
    # "separate" critic network | "shared": a value head on the policy trunk
    critic_mode: Literal["separate", "shared"] = setting("separate", when=WITH_CRITIC)
    # weight of the value loss when critic_mode == "shared"
    value_coef: float = setting(0.5, ">= 0", when=(WITH_CRITIC, When("critic_mode", "shared")))
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA policy; the reference is the adapter disabled
    # LoRA on the separate critic's trunk
    critic_lora: LoraConfig = setting(factory=LoraConfig, when=WITH_CRITIC)
    gradient_checkpointing: bool = False  # trained roles recompute each decoder layer in the backward


@dataclass
class RLDataConfig:
    prompts: str = ""  # prompts file (any format with a prompt); preference/SFT files work too
    format: DataFormat = "auto"  # "auto": detected from the first valid record
    # prompt budget (oldest turns dropped first, then left-truncated)
    max_prompt_tokens: int = setting(256, ">= 1", unit="tokens")
    ptx: str | None = None  # SFT data for the PPO-ptx loss (InstructGPT); None: no ptx loss
    # SFT examples per ptx step
    ptx_batch_size: int = setting(8, ">= 1", unit="examples", when=When("ptx", "set"))
    skip_invalid: bool = False  # skip malformed lines (counted) instead of stopping
    chat_template: ChatTemplate = "auto"  # fields.ChatTemplate
    system_prompt: SystemPrompt = "template"  # the template's default system prompt (fields.SystemPrompt)


@dataclass
class RLTrainConfig:
    # rollout + update cycles (0 only with critic.pretrain_iterations > 0: a critic-only run)
    iterations: int = setting(100, ">= 0")
    ppo_epochs: int = setting(1, ">= 1")  # passes over each rollout batch (PPO paper 1, APA paper 2)
    # optimizer steps per epoch (the rollout batch is split into this many)
    minibatches: int = setting(1, ">= 1")
    # rows per forward/backward (token-weighted gradient accumulation)
    micro_batch_size: int = setting(16, ">= 1", unit="rows")
    # the update's micro-batches cut by tokens instead: each minibatch's rows sorted longest first,
    # as many per forward/backward as fit rows x longest row <= N (real prompt + response tokens;
    # a longer row alone); the same gradient and metrics to float rounding (docs/speed.md). The
    # rollout's scoring forwards keep micro_batch_size. None or 0: by rows
    micro_batch_tokens: int | None = setting(None, ">= 0", unit="tokens")
    # sequence packing in every forward of the policy, reference, critic and reward model (a
    # forward's rows laid end to end, positions restarting, attention kept within each sequence);
    # the update's micro-batches cut by packed tokens. The same results (docs/speed.md)
    packing: bool = False
    # torch.compile the policy's and critic's forwards with gradients on, in the update (docs/speed.md
    # "Compiled training forwards"): fewer, fused kernels where launching ops bounds a step (small
    # models on a GPU); the first updates pay the compile; sampling and scoring run uncompiled. Not
    # with dist.strategy fsdp2
    compile: bool = False
    # torch.compile's backend ("aot_eager": a quick check, no speed-up)
    compile_backend: str = setting("inductor", when=When("compile", True))
    # rollout batches kept and reused (experience buffer, PPO paper §5.3.2)
    buffer_size: int = setting(1, ">= 1", unit="rollout batches")
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N"


@dataclass
class RuntimeConfig:
    """How the roles' work is scheduled on the machine: none of these changes the algorithm (same
    result to float rounding, each tested so), only its speed and memory (rlhf/runtime/)."""

    # CPU, separate critic: the critic's optimizer steps run on a second thread beside the policy's
    # (they share no parameter); the intra-op threads are split between the two sides
    overlap_critic: bool = True
    # score/reference/value forwards on a multi-core CPU: the two halves of the rows side by side,
    # one core each (cores kept on whole products; same result to float rounding, reproducible)
    split_forwards: bool = True
    # glibc: keep freed memory for reuse instead of returning it to the OS after every step (no page
    # faults on the next step's activations; the resident set stays near its peak). allocator.py
    keep_freed_memory: bool = True
    # CPU sampling through oneDNN-prepacked copies of the linear weights, made per rollout (faster decode
    # steps, same tokens up to float rounding; the copies take the linear weights' size while sampling)
    pack_weights: bool = True
    # rows of similar length share a micro-batch in the rollout's forwards and the update (sorted
    # by length inside the rollout batch / minibatch, results put back in order): less padding,
    # the same results to float rounding (rlhf.data.length_grouping, docs/padding.md)
    sort_by_length: bool = True


@dataclass
class CollapseConfig:
    # KL to the reference reaches this multiple of its early baseline
    kl_rise: float | None = setting(3.0, "> 0")
    # the KL baseline counts as at least this (nats per response)
    kl_floor: float = setting(0.5, "> 0", unit="nats per response")
    # policy perplexity on its own responses falls by this fraction
    ppl_drop: float | None = setting(0.25, "(0, 1)")
    # mean response length moves (up or down) by this fraction
    length_drift: float | None = setting(0.3, "> 0")
    # or distinct-2 of the responses falls by this fraction
    diversity_drop: float | None = setting(0.4, "(0, 1)")
    window: int = setting(5, ">= 1", unit="iterations")  # iterations in the rolling median of each signal
    # first iterations whose median is the baseline
    baseline_steps: int = setting(5, ">= 1", unit="iterations")
    # consecutive iterations the whole signature must hold before a warning
    patience: int = setting(3, ">= 1", unit="iterations")


@dataclass
class LogConfig:
    every: int = setting(1, ">= 1", unit="iterations")  # write metrics every N iterations
    sinks: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # + "tensorboard", "wandb"
    stop_on_collapse: bool = False  # stop the run when the collapse detector fires
    collapse: CollapseConfig = field(default_factory=CollapseConfig)  # PPO paper §5.2 signature
    # evaluate on held-out prompts every N iterations; 0: off
    eval_every: int = setting(0, ">= 0", unit="iterations")
    # responses of each logged iteration's rollout kept in samples.jsonl (rlhf/rl/sample_log.py); 0: none
    samples_to_log: int = setting(4, ">= 0", unit="responses")
    mismatch: MismatchConfig = field(default_factory=MismatchConfig)  # sampler vs trainer log-probs


@dataclass
class CheckpointConfig:
    # save a resumable checkpoint every N iterations (and at the end); 0: end only
    every: int = setting(0, ">= 0", unit="iterations")
    keep: int = setting(2, ">= 1", unit="checkpoints")  # checkpoints kept (older ones removed)


@dataclass
class RLConfig:
    out: str = "runs/rl"  # run directory
    # seed of sampling, shuffling and head initialization
    seed: int = setting(0, "any", why="every integer seeds the generators")
    preset: str | None = None  # the preset this config started from (informational)
    dtype: Dtype = "auto"  # precision of every role (fields.Dtype; rlhf/models/precision.py)
    model: RLModelConfig = field(default_factory=RLModelConfig)
    data: RLDataConfig = field(default_factory=RLDataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)  # multi-turn episodes (`--env module:Class`)
    agent: AgentConfig = field(default_factory=AgentConfig)  # the user's agent (`--agent module:function`)
    reward: RewardProcessingConfig = field(default_factory=RewardProcessingConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    policy: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    critic: CriticConfig = setting(factory=CriticConfig, when=WITH_CRITIC)
    train: RLTrainConfig = field(default_factory=RLTrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    dist: RLDistConfig = field(default_factory=RLDistConfig)  # torchrun: data-parallel ranks; or Ray
    # dist.runtime ray: the roles' actor groups
    ray: RayConfig = setting(factory=RayConfig, when=When("dist.runtime", "ray", root=True))
    policy_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))
    critic_optim: OptimConfig = setting(factory=lambda: OptimConfig(lr=2e-6), when=WITH_CRITIC)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    @property
    def uses_critic(self) -> bool:
        """The advantage estimator reads a critic's values (gae); the others train no critic."""
        return estimator_spec(self.advantage.estimator).needs_values

    def validate(self, prefix: str = "") -> None:
        """Each group's rules, then those between groups; warnings for legal values that are almost
        surely mistakes (the `rlhf.config` logger)."""
        check_ranges(self, prefix)
        validate_groups(self, prefix)
        train, critic, rollout = self.train, self.critic, self.rollout
        compile_needs_no_fsdp2(train.compile, self.dist.strategy, prefix)
        if train.compile:
            compile_backend_known(train.compile_backend, f"{prefix}train.compile_backend")
        pretrains = critic.pretrain_iterations > 0 and self.uses_critic
        if not (train.iterations >= 1 or (train.iterations == 0 and pretrains)):
            refuse(
                f"{prefix}train.iterations must be >= 1, got {train.iterations!r} (0 only with "
                f"{prefix}critic.pretrain_iterations > 0, for a critic-only run). "
                f"Fix: --{prefix}train.iterations 1 or more.",
                f"{prefix}train.iterations",
            )
        if train.minibatches > rollout.batch_size:
            refuse(
                f"{prefix}train.minibatches must not exceed {prefix}rollout.batch_size ({rollout.batch_size}), "
                f"got {train.minibatches}. Fix: --{prefix}train.minibatches {rollout.batch_size} or fewer.",
                f"{prefix}train.minibatches",
            )
        responses = rollout.batch_size * rollout.samples_per_prompt
        if self.kl.adaptive and self.kl.horizon < responses:
            refuse(
                f"{prefix}kl.horizon must be >= the responses per rollout ({responses}: {prefix}rollout.batch_size "
                f"x {prefix}rollout.samples_per_prompt) with {prefix}kl.adaptive, or the coefficient can turn "
                f"negative; got {self.kl.horizon}. Fix: --{prefix}kl.horizon 10000.",
                f"{prefix}kl.horizon",
            )
        self._validate_estimator(prefix)
        self._validate_online_dpo(prefix)
        self._validate_staleness(prefix)
        if self.env.name and self.agent.name:
            refuse(
                f"{prefix}env.name {self.env.name!r} and {prefix}agent.name {self.agent.name!r} are both set; an "
                "episode runs one of them. Fix: pass one of --env and --agent.",
                f"{prefix}agent.name",
            )
        if self.model.reward_model and self.reward.remote.url:
            refuse(
                f"{prefix}model.reward_model ({self.model.reward_model}) and {prefix}reward.remote.url "
                f"({self.reward.remote.url}) are both set; the server's score stands for the reward model's. "
                "Fix: pass one of --reward-model and --reward-url.",
                f"{prefix}reward.remote.url",
            )
        check_reward_weights(self, prefix)
        self._validate_dapo(prefix)
        self._validate_correction(prefix)

    def _validate_correction(self, prefix: str) -> None:
        """Rollout correction weighs the trainer's old log-probs against the sampler's (§44)."""
        rollout, key = self.rollout, f"{prefix}rollout.correction.enabled"
        if not rollout.correction.enabled:
            return
        if rollout.logprobs_from_sampler and rollout.max_staleness == 0:
            refuse(
                f"{key} weighs the trainer's old log-probs against the sampler's, but "
                f"{prefix}rollout.logprobs_from_sampler uses the sampler's as the old ones (the weight would "
                f"be 1). Fix: --{prefix}rollout.logprobs_from_sampler false, or --{key} false.",
                key,
            )

    def _validate_dapo(self, prefix: str) -> None:
        """Dynamic sampling compares the responses to one prompt, in the synchronous loop."""
        rollout = self.rollout
        if not rollout.dynamic_sampling:
            return
        key = f"{prefix}rollout.dynamic_sampling"
        if rollout.samples_per_prompt < 2:
            refuse(
                f"{key} keeps the groups whose responses scored differently, but {prefix}rollout.samples_per_prompt "
                f"is {rollout.samples_per_prompt}: every group has one response and none would be kept. "
                f"Fix: --{prefix}rollout.samples_per_prompt 8 (or more than 1), or --{key} false.",
                key,
            )
        if rollout.max_staleness > 0:
            refuse(
                f"{key} samples again within an iteration, which {prefix}rollout.max_staleness "
                f"{rollout.max_staleness} (rollouts sampled ahead by the rollout actors) does not do. "
                f"Fix: --{prefix}rollout.max_staleness 0, or --{key} false.",
                key,
            )

    def _validate_staleness(self, prefix: str) -> None:
        """Asynchronous rollouts need a rollout group of their own and PPO's clipped objective."""
        if self.rollout.max_staleness == 0:
            return
        key = f"{prefix}rollout.max_staleness"
        for flag, name in (("env", self.env.name), ("agent", self.agent.name)):
            if name:
                refuse(
                    f"{key} {self.rollout.max_staleness} samples rollouts ahead on the rollout actors, which sample "
                    f"single-turn responses; {prefix}{flag}.name {name!r} runs multi-turn episodes in this "
                    f"process. Fix: --{key} 0 with --{flag}, or drop --{flag}.",
                    key,
                )
        if self.dist.runtime != "ray" or self.ray.rollout.num_actors < 1:
            refuse(
                f"{key} {self.rollout.max_staleness} samples the next rollout while the policy updates, on "
                f"actors of their own: it needs {prefix}dist.runtime ray and {prefix}ray.rollout.num_actors >= 1 "
                f"(got {self.dist.runtime!r} and {self.ray.rollout.num_actors}). Fix: --{prefix}dist.runtime ray "
                f"--{prefix}ray.rollout.num_actors 1, or --{key} 0.",
                key,
            )
        if self.policy.loss != "ppo":
            refuse(
                f"{key} corrects stale rollouts with decoupled PPO, which needs {prefix}policy.loss ppo, got "
                f"{self.policy.loss!r}. Fix: --{prefix}policy.loss ppo, or --{key} 0.",
                key,
            )

    def _validate_online_dpo(self, prefix: str) -> None:
        """Online DPO trains on pairs ranked by their scores alone (docs/algorithms.md §45)."""
        loss, a, n = self.policy.loss, self.advantage.estimator, self.rollout.samples_per_prompt
        if loss == "online_dpo" and a != "pairwise":
            refuse(
                f"{prefix}policy.loss online_dpo ranks the two responses of each prompt by their advantage "
                f"sign, which {prefix}advantage.estimator pairwise gives; got {a!r}. "
                f"Fix: --{prefix}advantage.estimator pairwise (or --preset online_dpo).",
                f"{prefix}advantage.estimator",
            )
        if a == "pairwise" and n != 2:
            refuse(
                f"{prefix}advantage.estimator pairwise compares the two responses of a prompt, but "
                f"{prefix}rollout.samples_per_prompt is {n}. Fix: --{prefix}rollout.samples_per_prompt 2.",
                f"{prefix}rollout.samples_per_prompt",
            )
        if loss == "online_dpo" and self.kl.beta != 0:
            refuse(
                f"{prefix}policy.loss online_dpo keeps the policy near the reference through its own loss "
                f"({prefix}policy.dpo.beta) and ranks each pair by the score alone, but {prefix}kl.beta is "
                f"{self.kl.beta} (a KL penalty in the reward). Fix: --{prefix}kl.beta 0.",
                f"{prefix}kl.beta",
            )

    def _validate_estimator(self, prefix: str) -> None:
        """The advantage estimator, its groups and its loss settings (docs/algorithms.md §27-§30)."""
        a, n = self.advantage, self.rollout.samples_per_prompt
        spec = estimator_spec(a.estimator)
        if spec.needs_group and n < 2:
            refuse(
                f"{prefix}advantage.estimator {a.estimator} compares the responses to one prompt, but "
                f"{prefix}rollout.samples_per_prompt is {n}: every group would have one member and no signal. "
                f"Fix: --{prefix}rollout.samples_per_prompt 4 (or more).",
                f"{prefix}rollout.samples_per_prompt",
            )
        aggregation = self.policy.loss_aggregation
        if aggregation != "token_mean" and self.uses_critic and self.model.critic_mode == "shared":
            refuse(
                f"{prefix}policy.loss_aggregation {aggregation} with {prefix}model.critic_mode shared would "
                "also rescale the value loss, which shares the policy's step. "
                f"Fix: --{prefix}model.critic_mode separate, or a critic-free estimator.",
                f"{prefix}policy.loss_aggregation",
            )
        if a.estimator == "dr_grpo" and aggregation != "fixed_length":
            warn(
                "%sadvantage.estimator dr_grpo with %spolicy.loss_aggregation %s: Dr. GRPO also divides the "
                "loss by a constant, not by the number of tokens. Fix: --%spolicy.loss_aggregation fixed_length.",
                prefix,
                prefix,
                aggregation,
                prefix,
            )


def _leaves(node: dict, prefix: str = ""):
    """(dotted key, value) of a nested dict's leaves, tuples as lists (as YAML reads them)."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", list(value) if isinstance(value, tuple) else value


# Keys that configure the critic (declared with WITH_CRITIC): set with an estimator that needs no
# critic, each is refused (the setting would do nothing).
CRITIC_KEYS = (
    "model.critic_init",
    "model.critic_mode",
    "model.value_coef",
    "model.critic_lora",
    "critic",
    "critic_optim",
)
