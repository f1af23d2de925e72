"""The local runtime: every role in this process, on the CPU or one GPU.

It schedules the roles' work without changing what is computed (each switch is tested to give
the same result to float rounding, and a run stays reproducible):
- `map_rows`: a no-grad forward of a rollout; on a multi-core CPU the two halves of the rows run
  side by side, one share of the cores each (`runtime.split_forwards`);
- `train`: the learners' optimizer steps over the minibatches; on a multi-core CPU a separate
  critic's steps run on a helper thread beside the policy's (`runtime.overlap_critic`), and the
  costlier side takes every core once the other is done;
- at start, glibc keeps freed memory for reuse (`runtime.keep_freed_memory`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rlhf.config import RuntimeConfig
from rlhf.data.collate import PtxBatches
from rlhf.models.backbone import causal_lm_parts, forward_changes_state, model_context
from rlhf.models.sampling import Rollout, SamplingConfig
from rlhf.models.sequences import Sequences
from rlhf.parallel.peers import Peers
from rlhf.parallel.threads import by_row_halves, run_side_by_side, side_by_side_threads
from rlhf.runtime.allocator import keep_freed_memory
from rlhf.runtime.flops import (
    MIN_SPLIT_FORWARD_FLOPS,
    forward_flops,
    handover_step,
    training_flops_per_token,
)
from rlhf.runtime.protocol import Minibatch, Ready, RolloutHandle


class RoleSet(Protocol):
    """What a runtime in this process asks of its roles (rlhf.rl.roles.assemble.Roles, a higher
    layer: not named here). A role is itself loosely typed (Any): the roles' package is not yet
    strict (pyproject.toml [tool.mypy])."""

    tokenizer: Any
    policy: Any
    reference: Any
    critic: Any
    reward_model: Any

    def hosts(self, name: str) -> bool: ...

    def learner(self, name: str) -> Any: ...

    def learners(self, train_policy: bool = True) -> list[Any]: ...

    def learner_names(self, train_policy: bool = True) -> list[str]: ...

    def learning_rates(self) -> dict[str, float]: ...

    def forward_of(
        self, name: str, temperature: float | None = None
    ) -> AbstractContextManager[Callable[[Sequences], torch.Tensor]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save_weights(self, directory: Path) -> None: ...

    def load_weights(self, directory: Path) -> None: ...

    def save_checkpoint(
        self, directory: Path, state: dict[str, Any], steps_done: int, peers: Peers | None = None
    ) -> None: ...

    def load_checkpoint(self, directory: Path) -> dict[str, Any]: ...

    def export(self, directory: Path, whole: Any = None, write: bool = True) -> None: ...

    def release_optimizer_state(self) -> None: ...


def on_cpu(*models: nn.Module) -> bool:
    """Every parameter of `models` on the CPU (threads side by side only help there)."""
    return all(q.device.type == "cpu" for m in models for q in m.parameters())


class LocalRuntime:
    """Places nothing (the roles arrive on their device) and schedules the roles' work in this process."""

    def __init__(self, roles: RoleSet, config: RuntimeConfig) -> None:
        self.roles = roles
        self.config = config
        self.policy_version = 0  # the policy's updates (`train` with "policy")
        if config.keep_freed_memory:
            keep_freed_memory()

    # -- the roles' facts, state, weights and export: the loop reaches a role only through these --
    @property
    def writer(self) -> bool:
        """This process writes the run directory (under torchrun: rank 0 alone)."""
        return True

    @property
    def tokenizer(self) -> Any:
        return self.roles.tokenizer

    @property
    def device(self) -> torch.device:
        """Where the loop's tensors (the experience buffer) live: the policy's device."""
        device: torch.device = self.roles.policy.device
        return device

    def has_role(self, name: str) -> bool:
        """Whether the run has the role `name` ("critic": none when critic-free; "reward_model": none
        when reward functions alone give the reward)."""
        return getattr(self.roles, name) is not None

    def learner_names(self, train_policy: bool = True) -> list[str]:
        return self.roles.learner_names(train_policy)

    def learning_rates(self) -> dict[str, float]:
        return self.roles.learning_rates()

    @property
    def policy_context(self) -> int | None:
        return model_context(self.roles.policy.model)

    def use_ptx(self, batches: PtxBatches, coef: float, seed: int) -> None:
        """PPO-ptx: the policy draws SFT batches from `batches`, weight `coef`, generator `seed`."""
        self.roles.policy.use_ptx(batches, coef, seed)

    # -- checkpoints and export ----------------------------------------------------------------
    def save_checkpoint(self, directory: Path, state: dict[str, Any], steps_done: int) -> None:
        """The writer writes it all (every process holds the same weights and state): the trained
        roles' parameters, `state` with the roles' own (`roles`) and DONE (Roles.save_checkpoint)."""
        if self.writer:
            self.roles.save_checkpoint(directory, {**state, "roles": self.role_state()}, steps_done)

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        return self.roles.load_checkpoint(directory)

    def export(self, directory: Path) -> None:
        """The trained models as Hugging Face directories with the tokenizer (every rank calls it)."""
        self.roles.export(directory, whole=self.whole_model, write=self.writer)

    def close(self) -> None:
        """Nothing to free: the roles are in this process, the caller's."""

    # -- what a Ray role group's actor asks of the runtime it runs (rlhf/ray_runtime/worker.py) ----
    def role_state(self) -> dict[str, Any]:
        """The trained roles' optimizer, schedule and random state (weights: `save_weights`)."""
        return self.roles.state_dict()

    def load_role_state(self, state: dict[str, Any]) -> None:
        self.roles.load_state_dict(state)

    def save_weights(self, directory: Path) -> None:
        """The trained roles' parameters into a checkpoint's `directory` (the writer alone calls it)."""
        self.roles.save_weights(directory)

    def load_weights(self, directory: Path) -> None:
        self.roles.load_weights(directory)

    def release_optimizer_state(self) -> None:
        self.roles.release_optimizer_state()

    def whole_model(
        self, model: nn.Module, every_rank: bool = False
    ) -> AbstractContextManager[nn.Module | None]:
        """A context that gives `model` (any role's, or a part of one) with its whole parameters:
        here `model` itself; under fsdp2 a plain copy gathered by every rank, rank 0's (None on the
        others) or with `every_rank` each rank's (rlhf/parallel/fsdp.py `whole_copy`)."""
        return contextlib.nullcontext(model)

    # -- sampling ------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], return_logprobs: bool) -> Rollout:
        """The policy's rollout of the whole batch of `prompts` (its own random state draws)."""
        rollout: Rollout = self.roles.policy.generate(prompts, return_logprobs)
        return rollout

    def submit_generate(self, prompts: list[list[int]], return_logprobs: bool) -> RolloutHandle:
        """Sampled now, by the current policy: what a rollout group sampling while the loop goes on
        gives (the loop's next calls are the update, after which the rollout's policy is stale)."""
        return Ready(self.generate(prompts, return_logprobs))

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        """An evaluator's sampling: the policy's responses to `prompts` under `sampling`, drawn from
        a generator seeded `seed` (the rollouts' own random state untouched)."""
        policy = self.roles.policy
        generator = torch.Generator(policy.device).manual_seed(seed)
        rollout: Rollout = policy.generate(prompts, False, sampling=sampling, generator=generator)
        return rollout

    # -- no-grad forwards ----------------------------------------------------------------------
    def forward(self, role: str, sequences: Sequences, temperature: float | None = None) -> torch.Tensor:
        """The no-grad forward of the role named `role` ("policy", "reference", "critic",
        "reward_model": Roles.forward_of) on a rollout's `sequences`, its rows scheduled by `map_rows`;
        log-probs at `temperature` (None: the sampling temperature)."""
        with self.roles.forward_of(role, temperature) as forward:
            return self.map_rows(forward, sequences)

    def map_rows(self, forward: Callable[[Sequences], torch.Tensor], sequences: Sequences) -> torch.Tensor:
        """`forward(sequences)`, each row's result independent of the others, joined along dim 0."""
        split = self.split_forward_threads(sequences.input_ids.numel())
        return by_row_halves(lambda rows: forward(sequences.rows(rows)), sequences.batch_size, split)

    def split_forward_threads(self, tokens: int) -> int | None:
        """Intra-op threads per half of the rows in a rollout's no-grad forwards, else None:
        `runtime.split_forwards` off, a model off the CPU or changing its own state as it runs
        (dynamic RoPE), a single core, or a forward too small to gain (under
        MIN_SPLIT_FORWARD_FLOPS per half)."""
        r = self.roles
        scalar = [
            m for m in (r.critic and r.critic.model, r.reward_model and r.reward_model.model) if m is not None
        ]
        if not self.config.split_forwards or not on_cpu(r.policy.model, *scalar):
            return None
        if any(forward_changes_state(m) for m in (r.policy.model, *(m.causal_lm for m in scalar))):
            return None  # dynamic RoPE: one thread per model at a time
        if forward_flops([causal_lm_parts(r.policy.model)[0]], tokens / 2) < MIN_SPLIT_FORWARD_FLOPS:
            return None
        return side_by_side_threads()

    # -- optimizer steps -----------------------------------------------------------------------
    def train(self, roles: Sequence[str], minibatches: Sequence[Minibatch]) -> list[dict[str, float]]:
        """Each named learner's `train_step` on every minibatch ("policy", "critic": Roles.learner),
        in order; the stats of every step."""
        if "policy" in roles:
            self.policy_version += 1
        return self.steps(roles, minibatches)

    def steps(self, roles: Sequence[str], minibatches: Sequence[Minibatch]) -> list[dict[str, float]]:
        learners = [self.roles.learner(name) for name in roles]
        steps = [[partial(learner.train_step, m) for m in minibatches] for learner in learners]
        results: list[dict[str, float]] = []
        threads = self.overlap_threads(learners)
        if threads is None:
            for side in steps:
                for step in side:
                    results.append(step())
            return results
        # the costlier side runs here and takes every core once the other is done
        flops = [self.step_flops(learner, minibatches) for learner in learners]
        here, beside = (0, 1) if flops[0] >= flops[1] else (1, 0)
        handover = handover_step(len(steps[here]), flops[here], len(steps[beside]), flops[beside])
        collected: list[list[dict[str, float]]] = [[], []]

        def recorded(side: int, step: Callable[[], dict[str, float]]) -> Callable[[], None]:
            return lambda: collected[side].append(step())

        run_side_by_side(
            [recorded(here, s) for s in steps[here]],
            [recorded(beside, s) for s in steps[beside]],
            threads,
            handover,
        )
        return collected[0] + collected[1]

    def overlap_threads(self, learners: Sequence[Any]) -> int | None:
        """Intra-op threads per side when two learners' steps run side by side, else None:
        one learner, `runtime.overlap_critic` off, a model off the CPU, or a single core."""
        if len(learners) != 2 or not self.config.overlap_critic:
            return None
        if any(role.learner.peers is not None for role in learners):
            return None  # built data-parallel (in a process group): two threads' all-reduces would mix
        if not on_cpu(*(role.learner.module for role in learners)):
            return None
        return side_by_side_threads()

    def step_flops(self, learner: Any, minibatches: Sequence[Minibatch]) -> float:
        """Estimated FLOPs of one optimizer step of `learner` (the mean over `minibatches`): a policy's
        output head sees only the response columns; a critic's scalar head (hidden -> 1, negligible)
        is counted on every column."""
        model = learner.model
        scalar_head = getattr(model, "head", None)
        decoder, lm_head = causal_lm_parts(model.causal_lm if scalar_head is not None else model)
        total = 0.0
        for m in minibatches:
            rows, width = m.input_ids.shape
            tokens = rows * (width - 1)  # the last column is never computed
            if scalar_head is not None:
                per_token = training_flops_per_token([decoder, scalar_head])
            else:
                share = m.response_mask.shape[1] / max(1, width - 1)
                per_token = training_flops_per_token([decoder, lm_head], scale=[1.0, share])
            total += per_token * tokens
        return total / max(1, len(minibatches))
