"""`rlhf train`: policy optimization (PPO, PPO-max, APA, AWR, GRPO, RLOO, REINFORCE++).

The algorithm's groups are in rl_algorithm.py, the rollout's in rollout.py; here are the models,
data, the run's plumbing (train, runtime, log, checkpoint) and the stage config, whose `validate`
holds the rules that tie several groups together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from rlhf.config import presets
from rlhf.config.agent import AgentConfig
from rlhf.config.checks import (
    at_least,
    fraction,
    positive,
    positive_or_off,
    refuse,
    token_budget,
    validate_groups,
    warn,
)
from rlhf.config.common import LoraConfig, OptimConfig, compile_backend_known, compile_needs_no_fsdp2
from rlhf.config.env import EnvConfig
from rlhf.config.fields import ChatTemplate, DataFormat, Dtype, SystemPrompt
from rlhf.config.ray import RayConfig, RLDistConfig
from rlhf.config.remote import MismatchConfig
from rlhf.config.rl_algorithm import (
    AdvantageConfig,
    CriticConfig,
    KLConfig,
    PolicyLossConfig,
    RewardProcessingConfig,
)
from rlhf.config.rollout import RolloutConfig
from rlhf.core.advantages import estimator_spec


@dataclass
class RLModelConfig:
    policy: str = ""  # the SFT model directory (also the frozen reference)
    gguf_file: str | None = None  # GGUF file name inside `policy`
    reward_model: str = ""  # reward-model directory (ScalarHeadModel)
    # "reward_model" (PPO paper §5.3.3) | "policy" (the SFT trunk with a fresh head)
    critic_init: Literal["reward_model", "policy"] = "reward_model"
    # "separate" critic network | "shared": a value head on the policy trunk
    critic_mode: Literal["separate", "shared"] = "separate"
    value_coef: float = 0.5  # weight of the value loss when critic_mode == "shared"
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA policy; the reference is the adapter disabled
    critic_lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA on the separate critic's trunk
    gradient_checkpointing: bool = False  # trained roles recompute each decoder layer in the backward

    def validate(self, prefix: str) -> None:
        at_least(self.value_coef, 0, f"{prefix}value_coef")
        validate_groups(self, prefix)


@dataclass
class RLDataConfig:
    prompts: str = ""  # prompts file (any format with a prompt); preference/SFT files work too
    format: DataFormat = "auto"  # "auto": detected from the first valid record
    max_prompt_tokens: int = 256  # prompt budget (oldest turns dropped first, then left-truncated)
    ptx: str | None = None  # SFT data for the PPO-ptx loss (InstructGPT); None: no ptx loss
    ptx_batch_size: int = 8  # SFT examples per ptx step
    skip_invalid: bool = False  # skip malformed lines (counted) instead of stopping
    chat_template: ChatTemplate = "auto"  # fields.ChatTemplate
    system_prompt: SystemPrompt = "template"  # the template's default system prompt (fields.SystemPrompt)

    def validate(self, prefix: str) -> None:
        at_least(self.max_prompt_tokens, 1, f"{prefix}max_prompt_tokens")
        at_least(self.ptx_batch_size, 1, f"{prefix}ptx_batch_size")


@dataclass
class RLTrainConfig:
    iterations: int = 100  # rollout + update cycles
    ppo_epochs: int = 1  # passes over each rollout batch (PPO paper 1, APA paper 2)
    minibatches: int = 1  # optimizer steps per epoch (the rollout batch is split into this many)
    micro_batch_size: int = 16  # rows per forward/backward (token-weighted gradient accumulation)
    # the update's micro-batches cut by tokens instead: each minibatch's rows sorted longest first,
    # as many per forward/backward as fit rows x longest row <= N (real prompt + response tokens;
    # a longer row alone); the same gradient and metrics to float rounding (docs/speed.md). The
    # rollout's scoring forwards keep micro_batch_size. None or 0: by rows
    micro_batch_tokens: int | None = None
    # sequence packing in every forward of the policy, reference, critic and reward model (a
    # forward's rows laid end to end, positions restarting, attention kept within each sequence);
    # the update's micro-batches cut by packed tokens. The same results (docs/speed.md)
    packing: bool = False
    # torch.compile the policy's and critic's forwards with gradients on, in the update (docs/speed.md
    # "Compiled training forwards"): fewer, fused kernels where launching ops bounds a step (small
    # models on a GPU); the first updates pay the compile; sampling and scoring run uncompiled. Not
    # with dist.strategy fsdp2
    compile: bool = False
    compile_backend: str = "inductor"  # torch.compile's backend ("aot_eager": a quick check, no speed-up)
    buffer_size: int = 1  # rollout batches kept and reused (experience buffer, PPO paper §5.3.2)
    device: str = "auto"  # "auto" (CUDA when available, else CPU) | "cpu" | "cuda" | "cuda:N"

    def validate(self, prefix: str) -> None:  # iterations: RLConfig.validate (0 with critic pre-training)
        at_least(self.ppo_epochs, 1, f"{prefix}ppo_epochs")
        at_least(self.minibatches, 1, f"{prefix}minibatches")
        at_least(self.micro_batch_size, 1, f"{prefix}micro_batch_size")
        token_budget(self.micro_batch_tokens, f"{prefix}micro_batch_tokens")
        at_least(self.buffer_size, 1, f"{prefix}buffer_size", " (rollout batches kept)")


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
    kl_rise: float | None = 3.0  # KL to the reference reaches this multiple of its early baseline
    kl_floor: float = 0.5  # the KL baseline counts as at least this (nats per response)
    ppl_drop: float | None = 0.25  # policy perplexity on its own responses falls by this fraction
    length_drift: float | None = 0.3  # mean response length moves (up or down) by this fraction
    diversity_drop: float | None = 0.4  # or distinct-2 of the responses falls by this fraction
    window: int = 5  # iterations in the rolling median of each signal
    baseline_steps: int = 5  # first iterations whose median is the baseline
    patience: int = 3  # consecutive iterations the whole signature must hold before a warning

    def validate(self, prefix: str) -> None:
        for key in ("window", "baseline_steps", "patience"):
            at_least(getattr(self, key), 1, f"{prefix}{key}")
        positive(self.kl_floor, f"{prefix}kl_floor", 0.5, " (nats per response)")
        for key, fix in (
            ("kl_rise", 3.0),
            ("ppl_drop", 0.25),
            ("length_drift", 0.3),
            ("diversity_drop", 0.4),
        ):
            positive_or_off(getattr(self, key), f"{prefix}{key}", fix)
        for key in ("ppl_drop", "diversity_drop"):  # a fraction of the baseline that falls away
            value = getattr(self, key)
            if value is not None:
                fraction(value, f"{prefix}{key}", 0.25 if key == "ppl_drop" else 0.4)


@dataclass
class LogConfig:
    every: int = 1  # write metrics every N iterations
    sinks: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # + "tensorboard", "wandb"
    stop_on_collapse: bool = False  # stop the run when the collapse detector fires
    collapse: CollapseConfig = field(default_factory=CollapseConfig)  # PPO paper §5.2 signature
    eval_every: int = 0  # evaluate on held-out prompts every N iterations; 0: off
    samples_to_log: int = 4  # responses kept per evaluation in samples.jsonl
    mismatch: MismatchConfig = field(default_factory=MismatchConfig)  # sampler vs trainer log-probs

    def validate(self, prefix: str) -> None:
        at_least(self.every, 1, f"{prefix}every")
        at_least(self.eval_every, 0, f"{prefix}eval_every", " (0: off)")
        at_least(self.samples_to_log, 0, f"{prefix}samples_to_log")
        validate_groups(self, prefix)


@dataclass
class CheckpointConfig:
    every: int = 0  # save a resumable checkpoint every N iterations (and at the end); 0: end only
    keep: int = 2  # checkpoints kept (older ones removed)

    def validate(self, prefix: str) -> None:
        at_least(self.every, 0, f"{prefix}every", " (0: at the end only)")
        at_least(self.keep, 1, f"{prefix}keep")


# Keys that configure the critic: with an estimator that needs no critic, one set to anything but its
# default is an error (the setting would silently do nothing).
CRITIC_KEYS = (
    "model.critic_init",
    "model.critic_mode",
    "model.value_coef",
    "model.critic_lora",
    "critic",
    "critic_optim",
)


@dataclass
class RLConfig:
    out: str = "runs/rl"  # run directory
    seed: int = 0  # seed of sampling, shuffling and head initialization
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
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: RLTrainConfig = field(default_factory=RLTrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    dist: RLDistConfig = field(default_factory=RLDistConfig)  # torchrun: data-parallel ranks; or Ray
    ray: RayConfig = field(default_factory=RayConfig)  # dist.runtime ray: the roles' actor groups
    policy_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))
    critic_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-6))
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    @property
    def uses_critic(self) -> bool:
        """The advantage estimator reads a critic's values (gae); the others train no critic."""
        return estimator_spec(self.advantage.estimator).needs_values

    def validate(self, prefix: str = "") -> None:
        """Each group's rules, then those between groups; warnings for legal values that are almost
        surely mistakes (the `rlhf.config` logger)."""
        validate_groups(self, prefix)
        train, critic, rollout = self.train, self.critic, self.rollout
        compile_needs_no_fsdp2(train.compile, self.dist.strategy, prefix)
        if train.compile:
            compile_backend_known(train.compile_backend, f"{prefix}train.compile_backend")
        if not (train.iterations >= 1 or (train.iterations == 0 and critic.pretrain_iterations > 0)):
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
        self._validate_critic_keys(prefix)
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
        self._validate_dapo(prefix)

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
        if not spec.needs_values and self.critic.pretrain_iterations != 0:
            refuse(
                f"{prefix}critic.pretrain_iterations is {self.critic.pretrain_iterations}, but "
                f"{prefix}advantage.estimator {a.estimator} uses no critic. "
                f"Fix: --{prefix}critic.pretrain_iterations 0, or --{prefix}advantage.estimator gae.",
                f"{prefix}critic.pretrain_iterations",
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

    def _validate_critic_keys(self, prefix: str) -> None:
        """A critic setting with an estimator that builds no critic: the setting would do nothing. The
        stage default (what a critic-free run does anyway) and the preset's own value (a critic
        preset whose estimator a flag replaced) are not settings of the user's."""
        if self.uses_critic:
            return
        default = dict(_leaves(dataclasses.asdict(RLConfig())))
        stated = dict(_leaves(presets.preset_dict(self.preset))) if self.preset in presets.PRESETS else {}
        for key, value in _leaves(dataclasses.asdict(self)):
            if not any(key == k or key.startswith(k + ".") for k in CRITIC_KEYS):
                continue
            if value != default[key] and (key not in stated or value != stated[key]):
                refuse(
                    f"{prefix}{key} is {value!r}, but {prefix}advantage.estimator {self.advantage.estimator!r} "
                    "uses no critic (none is built, trained or saved), so the setting would do nothing. "
                    f"Fix: remove {prefix}{key}, or use --{prefix}advantage.estimator gae for a PPO critic.",
                    f"{prefix}{key}",
                )


def _leaves(node: dict, prefix: str = ""):
    """(dotted key, value) of a nested dict's leaves, tuples as lists (as YAML reads them)."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", list(value) if isinstance(value, tuple) else value
