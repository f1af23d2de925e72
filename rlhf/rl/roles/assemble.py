"""The roles of a run built from its config (`assemble_roles`, `load_roles`), held together in
`Roles`, with the optimizer-step counts that size their schedules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast, overload

import torch
from torch import nn

from rlhf.config import RLConfig, rollout_sampling
from rlhf.data.chat import stop_token_ids
from rlhf.models.device import resolve_device
from rlhf.models.grad_checkpointing import gradient_checkpointing
from rlhf.models.loading import load_causal_lm, load_tokenizer, prepare_tokenizer
from rlhf.models.precision import Precision
from rlhf.models.reference import ReferenceModel
from rlhf.models.sampling import SamplingConfig
from rlhf.models.scalar_head import ScalarHeadModel, init_critic
from rlhf.models.sequences import Sequences
from rlhf.parallel.parallel_plan import ParallelPlan, parallel_plan
from rlhf.parallel.peers import Peers
from rlhf.parallel.process_group import in_sharded_group
from rlhf.rl.experience import Scoring
from rlhf.rl.roles.critic import Critic, SharedCritic
from rlhf.rl.roles.forward import ValueForward
from rlhf.rl.roles.frozen import Reference, RewardModel
from rlhf.rl.roles.policy import JointValue, Policy
from rlhf.rundir import checkpoint as ckpt
from rlhf.rundir.export import export_models
from rlhf.rundir.sharded_checkpoint import (
    has_shards,
    load_group_shards,
    load_sharded_weights,
    trained_learners,
    write_shards_and_state,
)
from rlhf.rundir.weights import load_trained, save_trained
from rlhf.train.learner import Training
from rlhf.train.micro_batches import MicroBatching
from rlhf.train.setup import with_compile, with_lora, with_packing


@dataclass
class Roles:
    tokenizer: object
    policy: Policy
    reference: Reference
    critic: Critic | SharedCritic | None  # None: a critic-free estimator (grpo, rloo, ...)
    reward_model: RewardModel | None  # None: the reward comes from reward functions only
    # the roles this process serves (None: every one). A Ray actor hosts some (rlhf/ray_runtime/):
    # the others stay on the meta device, and its state, weights and exports are its hosted roles'
    hosted: frozenset[str] | None = None

    def hosts(self, name: str) -> bool:
        return self.hosted is None or name in self.hosted

    @property
    def on_meta(self) -> bool:
        """Built on the meta device (a sharded run's ranks but 0): no weights until sharded (the
        trained roles hosted here; those hosted elsewhere are on the meta device anyway)."""
        trained = self._trained(separate_only=False).values()
        return any(p.is_meta for role in trained for p in role.model.parameters())

    @property
    def separate_critic(self) -> Critic | None:
        """The critic when it is a network of its own (not a head on the policy, not absent)."""
        return self.critic if isinstance(self.critic, Critic) else None

    def learner(self, name: str) -> Policy | Critic | SharedCritic:
        """The role that trains under `name`: "policy", or "critic" (separate or on the policy's trunk)."""
        role = {"policy": self.policy, "critic": self.critic}.get(name)
        if role is None:
            raise ValueError(f"no trained role {name!r} in this run (its learners: {self.learner_names()})")
        return role

    def learner_names(self, train_policy: bool = True) -> list[str]:
        """The roles that take an optimizer step on each minibatch, what a runtime's `train` takes:
        the policy (a shared critic's value loss is part of its step) and a separate critic; in
        critic pre-training the critic only."""
        if not train_policy:
            return ["critic"]
        return ["policy"] + (["critic"] if self.separate_critic else [])

    @contextmanager
    def forward_of(
        self, name: str, temperature: float | None = None
    ) -> Iterator[Callable[[Sequences], torch.Tensor]]:
        """The rollout's no-grad forward of the role `name`, for the body: "policy" and "reference"
        give response log-probs [B, T] at `temperature` (None: the sampling temperature), "critic"
        values [B, T], "reward_model" scores [B]; each row's result depends on that row alone, so a
        runtime may split the rows (between threads or ranks). The reference's weights are set once
        for the body (a LoRA adapter switched off)."""
        if temperature is not None and name not in ("policy", "reference"):
            raise ValueError(f"a temperature is for log-probs (policy, reference), not the {name}'s forward")
        if name == "reference":
            with self.reference.session(temperature) as logprobs:
                yield logprobs
            return
        forwards: dict[str, Callable[[Sequences], torch.Tensor] | None] = {
            "policy": partial(self.policy.logprobs, temperature=temperature),
            "critic": self.critic.values if self.critic is not None else None,
            "reward_model": self.reward_model.score if self.reward_model is not None else None,
        }
        forward = forwards.get(name)
        if not forward:
            raise ValueError(f"no role {name!r} with a forward in this run")
        yield forward

    def learners(self, train_policy: bool = True) -> list[Policy | Critic | SharedCritic]:
        """The roles of `learner_names` (those hosted here)."""
        return [self.learner(name) for name in self.learner_names(train_policy) if self.hosts(name)]

    def learning_rates(self) -> dict[str, float]:
        rates = {"policy/lr": self.policy.learner.lr} if self.hosts("policy") else {}
        if self.separate_critic and self.hosts("critic"):
            rates["value/lr"] = self.separate_critic.learner.lr
        return rates

    @overload
    def _trained(self, separate_only: Literal[True]) -> Mapping[str, Policy | Critic]: ...

    @overload
    def _trained(self, separate_only: bool) -> Mapping[str, Policy | Critic | SharedCritic]: ...

    def _trained(self, separate_only: bool) -> Mapping[str, Policy | Critic | SharedCritic]:
        """{name: role} of the trained roles hosted here: the policy, and the critic (a separate one
        only with `separate_only`: a shared critic's state is the policy's)."""
        critic = self.separate_critic if separate_only else self.critic
        roles: dict[str, Policy | Critic | SharedCritic | None] = {"policy": self.policy, "critic": critic}
        return {name: role for name, role in roles.items() if role is not None and self.hosts(name)}

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule and sampler-side state of every trained role (weights: save_weights)."""
        return {name: role.state_dict() for name, role in self._trained(separate_only=True).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, role in self._trained(separate_only=True).items():
            role.load_state_dict(state[name])

    def save_weights(self, directory: Path) -> None:
        """The trained parameters of policy and critic (a LoRA policy: its adapters; rlhf/rundir/weights.py);
        a critic-free run has no critic."""
        for name, role in self._trained(separate_only=False).items():
            save_trained(role.model, directory, name)

    def load_weights(self, directory: Path) -> None:
        """A checkpoint's trained parameters: its per-role files, or an fsdp2 run's shards (at any
        number of ranks, or in one process), or a Ray run's sharded groups' shards; a sharded rank
        but 0 (on the meta device) loads none: its shards come from rank 0's (rlhf/parallel/fsdp.py)."""
        if self.on_meta:
            return
        if has_shards(directory):
            load_sharded_weights(self, directory)
            return
        loaded = load_group_shards(self, directory)  # a Ray run's sharded groups
        # the policy's group holds a shared critic's head too
        if "policy" in loaded and self.separate_critic is None:
            loaded.add("critic")
        for name, role in self._trained(separate_only=False).items():
            if name not in loaded:
                load_trained(role.model, directory, name)

    def save_checkpoint(
        self, directory: Path, state: dict[str, Any], steps_done: int, peers: Peers | None = None
    ) -> None:
        """The checkpoint `directory`, written whole or not at all: the trained parameters
        (`save_weights`), `state` (`trainer.*`) and DONE. `peers` (roles sharded over a process group):
        every rank calls it and writes its shards of the parameters and optimizer moments (DCP),
        rank 0 the rest (rlhf/rundir/sharded_checkpoint.py)."""
        if peers is not None:
            write_shards_and_state(trained_learners(self), peers, directory, state, steps_done)
            return
        with ckpt.atomic_directory(directory) as tmp:
            self.save_weights(tmp)
            ckpt.save_state(state, tmp, "trainer")
            ckpt.write_done(tmp, steps_done)  # sizes and checksums: verified on resume

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """A checkpoint's trained parameters (`load_weights`) and roles' state (its `roles`); the
        state it holds (`trainer.*`)."""
        self.load_weights(directory)  # an fsdp2 run's shards load at any number of ranks too
        state = ckpt.load_state(directory, "trainer")
        self.load_state_dict(state["roles"])
        return state

    def exported_models(self) -> dict[str, torch.nn.Module]:
        """{subdirectory: model} of an export: the trained policy in the directory itself, a separate
        critic in `critic/` (those hosted here)."""
        where = {"policy": "", "critic": "critic"}
        return {where[name]: role.model for name, role in self._trained(separate_only=True).items()}

    def export(
        self,
        directory: Path,
        whole: Callable[[nn.Module], AbstractContextManager[nn.Module | None]] | None = None,
        write: bool = True,
    ) -> None:
        """The trained policy as a float32 Hugging Face directory (LoRA merged) with the tokenizer; a
        separate critic in `critic/`. Sharded: `whole(model)` gathers one at a time, every rank
        calls this, the writer alone `write`s (rlhf/rundir/export.py)."""
        export_models(directory, self.tokenizer, self.exported_models(), whole=whole, write=write)

    def release_unhosted(self) -> None:
        """Move the models of the roles not hosted here to the meta device (what their assembly
        copied, e.g. the reference's copy in the policy's process, no longer takes memory)."""
        separate_critic, reward_model = self.separate_critic, self.reward_model
        parts: dict[str, nn.Module | None] = {
            "policy": self.policy.model,
            "reference": self.reference.own_module,
            "critic": separate_critic.model if separate_critic is not None else None,
            "reward_model": reward_model.model if reward_model is not None else None,
        }
        shared = {
            id(p) for name, m in parts.items() if m is not None and self.hosts(name) for p in m.parameters()
        }
        for name, module in parts.items():
            if module is not None and not self.hosts(name):
                if any(id(p) in shared for p in module.parameters()):
                    continue  # a hosted role computes through it (a LoRA reference is the policy)
                module.to("meta")

    def release_optimizer_state(self) -> None:
        """Free the trained roles' AdamW moments (a finished sharded run, its checkpoint written)."""
        # the policy and a separate critic hosted here (`learners()`: a shared critic's is the policy's)
        for role in self._trained(separate_only=True).values():
            role.learner.release_optimizer_state()


def optimizer_steps(config: RLConfig) -> tuple[int, int]:
    """(steps of the RL iterations, steps of critic pre-training at most): the schedules' lengths."""
    per_iteration = config.train.ppo_epochs * config.train.minibatches
    pretrain = config.critic.pretrain_iterations if config.uses_critic else 0  # no critic: a preset's, unused
    return max(1, config.train.iterations * per_iteration), pretrain * per_iteration


def assemble_roles(
    config: RLConfig,
    *,
    tokenizer: Any,
    policy: torch.nn.Module,
    reward_model: ScalarHeadModel | None,
    hosted: frozenset[str] | None = None,
) -> Roles:
    """Build the four roles around an SFT policy and a reward model (both already loaded; no reward
    model when `reward.functions` give the reward), on `train.device` in the `dtype` precision.
    Inside a process group the trained roles among `hosted` (None: all) are built with the
    data-parallel strategy they train under (rlhf/parallel/parallel_plan.py)."""
    c = config
    device, precision, place = _place_models(c, policy, reward_model)
    # train.packing: every forward packed; train.compile: the update's forwards compiled (the
    # reference and a critic are copies that keep both marks)
    with_packing(c.train.packing, policy, reward_model)
    with_compile(c.train.compile, c.train.compile_backend, device, policy, reward_model)
    tokenizer = prepare_tokenizer(tokenizer)
    torch.manual_seed(c.seed)
    critic_mode = c.model.critic_mode if c.uses_critic else None  # critic-free estimators build none
    policy, reference, critic_model, joint_value = _trained_models(
        c, critic_mode, policy, reward_model, precision, place
    )
    policy.eval()  # no dropout: the first PPO ratio is exactly 1
    rows = c.train.micro_batch_size
    rl_steps, pretrain_steps = optimizer_steps(c)
    plan = parallel_plan(c.dist, bf16_compute=precision.uses_autocast)

    def parallel(role: str) -> ParallelPlan | None:
        return plan if hosted is None or role in hosted else None

    sampling = rollout_sampling_config(c)
    # the update's micro-batches: rows by length, or by a token budget, or cut for packed forwards
    batching = MicroBatching(rows, c.runtime.sort_by_length, c.train.micro_batch_tokens, c.train.packing)
    policy_role = Policy(
        policy,
        tokenizer,
        loss=c.policy,
        sampling=sampling,
        training=Training(
            c.policy_optim,
            # a shared critic's pre-training steps the policy's optimizer (the value head only)
            rl_steps + (pretrain_steps if joint_value else 0),
            batching,
            parallel("policy"),
            device,
        ),
        joint_value=joint_value,
        precision=precision,
        sample_seed=c.seed + 1,
    )
    # a chat model's response also ends at its template's end-of-turn token (data.chat_template)
    policy_role.stop_ids = stop_token_ids(tokenizer, c.data.chat_template)
    critic_training = Training(c.critic_optim, rl_steps + pretrain_steps, batching, parallel("critic"))
    critic = _critic_role(c, policy_role, critic_model, joint_value, critic_training, precision)
    # the frozen roles' forwards cut as the update's micro-batches are
    scoring = Scoring(rows, precision, c.runtime.sort_by_length, c.train.micro_batch_tokens)
    return Roles(
        hosted=hosted,
        tokenizer=tokenizer,
        policy=policy_role,
        reference=Reference(
            reference,
            policy_module=policy_role.learner.module,
            temperature=sampling.temperature,
            scoring=scoring,
        ),
        critic=critic,
        reward_model=None if reward_model is None else RewardModel(reward_model, scoring=scoring),
    )


def _trained_models(
    c: RLConfig,
    critic_mode: str | None,
    policy: torch.nn.Module,
    reward_model: ScalarHeadModel | None,
    precision: Precision,
    place: torch.device,
) -> tuple[torch.nn.Module, ReferenceModel, ScalarHeadModel | None, JointValue | None]:
    """The policy (with LoRA adapters when asked), its reference, and what the values come from: a
    separate critic model (`model.critic_mode separate`, from `_critic_start`, optionally with its own
    adapters), a value head on the policy's trunk (`shared`: the JointValue), or neither
    (critic-free estimators); gradient checkpointing on the trained trunks."""
    critic_model = _critic_start(c, policy, reward_model) if critic_mode == "separate" else None
    if c.model.lora.enabled:
        policy = precision.prepare(with_lora(policy, c.model.lora), place)
        reference = ReferenceModel(policy, mode="adapter")  # no second copy of the weights
    else:
        reference = ReferenceModel(policy, mode="copy")
    joint_value = None
    if critic_mode == "shared":
        head_on_trunk = ScalarHeadModel.from_causal_lm(policy, head_init_std=0.0)
        joint_value = JointValue(
            ValueForward(head_on_trunk, precision), c.model.value_coef, c.critic.value_clip
        )
    elif critic_model is not None and c.model.critic_lora.enabled:  # adapters + the value head train
        # PEFT's wrapper, which passes a ScalarHeadModel's calls on
        critic_model = cast(
            ScalarHeadModel, precision.prepare(with_lora(critic_model, c.model.critic_lora), place)
        )
    elif critic_model is not None:
        critic_model.requires_grad_(True)
    if c.model.gradient_checkpointing:  # activations of one decoder layer kept, the rest recomputed
        gradient_checkpointing(policy)
        if critic_model is not None:
            gradient_checkpointing(critic_model)
    return policy, reference, critic_model, joint_value


def _critic_role(
    c: RLConfig,
    policy_role: Policy,
    critic_model: ScalarHeadModel | None,
    joint_value: JointValue | None,
    training: Training,
    precision: Precision,
) -> Critic | SharedCritic | None:
    """The critic role: the policy's value head (shared), a model of its own (separate), or none."""
    if joint_value is not None:
        return SharedCritic(policy_role)
    if critic_model is None:
        return None
    return Critic(critic_model.eval(), value_clip=c.critic.value_clip, training=training, precision=precision)


def _place_models(
    c: RLConfig, policy: torch.nn.Module, reward_model: ScalarHeadModel | None
) -> tuple[torch.device, Precision, torch.device]:
    """(train.device, the `dtype` precision, where the trained models are placed): the policy and
    the frozen reward model prepared in that precision. Sharded, the roles stay on the CPU (whole on
    rank 0 alone) until fully_shard moves each rank's shards to its device; a model built on the
    meta device stays there until it is filled."""
    device = resolve_device(c.train.device, key="train.device")
    precision = Precision.resolve(c.dtype, device, key="dtype")
    # a Ray group's rank 0 too: the whole model never lands on its GPU before sharding
    home = torch.device("cpu") if in_sharded_group(c.dist.strategy) else device
    place = torch.device("meta") if any(p.is_meta for p in policy.parameters()) else home
    precision.prepare(policy, place)
    if reward_model is not None:
        rm_meta = any(p.is_meta for p in reward_model.parameters())
        precision.prepare(
            reward_model.eval().requires_grad_(False), torch.device("meta") if rm_meta else home
        )
    return device, precision, place


def _critic_start(
    c: RLConfig, policy: torch.nn.Module, reward_model: ScalarHeadModel | None
) -> ScalarHeadModel:
    """A separate critic's starting weights: a copy of the reward model (PPO paper §5.3.3) or of the
    SFT trunk with a zero head (`model.critic_init`)."""
    if c.model.critic_init == "policy":
        return init_critic(policy)
    if reward_model is None:
        raise ValueError(
            "model.critic_init is reward_model but no reward model is given (the reward comes from "
            "reward.functions). Fix: --model.critic_init policy, or a critic-free estimator "
            "(--preset grpo or rloo)."
        )
    return init_critic(reward_model)


def rollout_sampling_config(c: RLConfig) -> SamplingConfig:
    """How the policy samples its rollouts: `rollout.*` and the runtime's weight packing."""
    fields: dict[str, Any] = rollout_sampling(c.rollout)
    return SamplingConfig(
        max_new_tokens=c.rollout.max_new_tokens,
        **fields,  # temperature, top_p, repetition_penalty (`rollout.sampling`)
        top_k=c.rollout.top_k,
        do_sample=True,
        stop_at_eos=c.rollout.stop_at_eos,
        drop_finished_rows=c.rollout.drop_finished_rows,
        engine=c.rollout.engine,
        pack_weights=c.runtime.pack_weights,
    )


def load_roles(config: RLConfig, on_meta: bool = False, hosted: frozenset[str] | None = None) -> Roles:
    """Load policy, reward model and tokenizer from the paths in `config.model`. `on_meta`: the
    models' structure only, on the meta device (a sharded run's ranks but 0: rlhf/parallel/fsdp.py
    fills their shards from rank 0); a GGUF policy or a LoRA reward model is read whole anyway.
    `hosted`: the roles this process serves (a Ray actor's); the weights no hosted role starts from
    are not read, and the roles not hosted are left on the meta device (`Roles.release_unhosted`)."""
    if not config.model.policy:
        raise ValueError("model.policy is empty. Fix: --policy DIR (the SFT run directory).")
    if not (
        config.model.reward_model
        or config.reward.functions
        or config.reward.remote.url
        or config.reward.llm_judge.url
        or config.env.name
        or config.agent.name
    ):
        raise ValueError(
            "model.reward_model is empty and no reward function, server, judge or environment is named. Fix: "
            "--reward-model DIR (the reward-model run directory), --reward-url URL, --judge-url URL and/or --reward-fn "
            "module:function, or --env module:Class, or --agent module:function."
        )
    policy_meta, rm_meta = on_meta, on_meta
    if hosted is not None:
        policy_meta = on_meta or not needs_weights(config, hosted, "policy")
        rm_meta = on_meta or not needs_weights(config, hosted, "reward_model")
    tokenizer = load_tokenizer(config.model.policy, gguf_file=config.model.gguf_file)
    policy = load_causal_lm(config.model.policy, gguf_file=config.model.gguf_file, on_meta=policy_meta)
    rm = config.model.reward_model
    lora_rm = bool(rm) and (Path(rm) / "adapter_config.json").is_file()
    reward_model = ScalarHeadModel.from_pretrained(rm, on_meta=rm_meta and not lora_rm) if rm else None
    hosted = None if hosted is None else frozenset(hosted)
    roles = assemble_roles(
        config, tokenizer=tokenizer, policy=policy, reward_model=reward_model, hosted=hosted
    )
    if hosted is not None:
        roles.release_unhosted()
    return roles


def needs_weights(config: RLConfig, hosted: frozenset[str], source: str) -> bool:
    """Whether a process hosting `hosted` roles starts any of them from the `source` model's weights
    ("policy": the SFT model, "reward_model"): the reference copies the policy, a separate critic
    copies the model `model.critic_init` names."""
    users = {source, "reference"} if source == "policy" else {source}
    separate_critic = config.uses_critic and config.model.critic_mode == "separate"
    if separate_critic and config.model.critic_init == source:
        users.add("critic")
    m = config.model
    if source == "policy" and separate_critic and m.lora.enabled and m.critic_lora.enabled:
        users.add("critic")  # the policy's adapters draw their initial weights before the critic's do
    return bool(users & set(hosted))
