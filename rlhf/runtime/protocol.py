"""What the RL loop (rlhf/rl/trainer.py), its stage (rlhf/stages/train.py) and its evaluators ask of a
runtime: the seam every runtime implements (LocalRuntime, DistributedRuntime here;
rlhf.ray_runtime.RayRuntime over Ray actors), and all they may ask: the trainer holds a `Runtime`,
never the roles. Roles are called by name with plain data (token ids, Sequences, minibatches, the
PPO-ptx rows, state dicts, paths): no callable, closure or generator crosses, so a runtime may serve
a role from another process.

The type checker holds every runtime to it (`make lint` runs mypy; tests/runtime/runtime_conformance.py
assigns each runtime to a `Runtime`), so a member the loop uses and a runtime lacks, or one whose
signature differs, fails the check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rlhf.data.collate import PtxBatches
from rlhf.models.sampling import Rollout, SamplingConfig
from rlhf.models.sequences import Sequences


class Minibatch(Protocol):
    """What a runtime reads of a minibatch it trains on (rlhf.rl.experience.Experience): its rows
    and their tokens; the learners read the rest."""

    input_ids: torch.Tensor
    response_mask: torch.Tensor

    @property
    def batch_size(self) -> int: ...

    def select(self, index: torch.Tensor) -> Minibatch: ...

    def filler(self) -> Minibatch: ...


class RolloutHandle(Protocol):
    """A rollout submitted for sampling (`Runtime.submit_generate`); `result()` waits for it."""

    def result(self) -> Rollout: ...


@dataclass
class Ready:
    """A rollout already sampled: a runtime that samples in this process at submission, or one
    restored from a checkpoint."""

    rollout: Rollout

    def result(self) -> Rollout:
        return self.rollout


class Runtime(Protocol):
    # -- facts ------------------------------------------------------------------------------------
    @property
    def writer(self) -> bool:
        """This process writes the run directory (rank 0 under torchrun; the Ray driver)."""

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer, in this process (prompts, texts for reward functions)."""

    @property
    def device(self) -> torch.device:
        """Where the loop's tensors (the experience buffer) live."""

    @property
    def policy_context(self) -> int | None:
        """The policy's positions (the prompts' length check); None when its config does not say."""

    def has_role(self, name: str) -> bool:
        """Whether the run has the role `name` ("critic": none when critic-free; "reward_model": none
        when reward functions alone give the reward)."""

    def learner_names(self, train_policy: bool = True) -> list[str]:
        """The roles `train` steps on each minibatch: "policy" and a separate "critic"; in critic
        pre-training (`train_policy` False) the critic alone."""

    def learning_rates(self) -> dict[str, float]:
        """The learners' current learning rates, as metrics ("policy/lr", "value/lr")."""

    # -- sampling ---------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], return_logprobs: bool) -> Rollout:
        """The policy's rollout of `prompts`, drawn from the policy's own generator."""

    def submit_generate(self, prompts: list[list[int]], return_logprobs: bool) -> RolloutHandle:
        """The rollout of `prompts` started now by the current policy (`policy_version`), the loop
        going on meanwhile (asynchronous rollouts, `rollout.max_staleness`)."""

    @property
    def policy_version(self) -> int:
        """The policy's updates so far that the rollouts sample with: a submitted rollout is sampled
        by the version current at its submission."""

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        """An evaluator's sampling: the policy's responses to `prompts` under `sampling`, drawn from
        a generator seeded `seed`; the rollouts' own random state is untouched."""

    # -- the roles' work, by name -----------------------------------------------------------------
    def forward(self, role: str, sequences: Sequences, temperature: float | None = None) -> torch.Tensor:
        """A rollout's no-grad forward: "policy"/"reference" log-probs [B, T] at `temperature` (None:
        the sampling temperature), "critic" values [B, T], "reward_model" scores [B]."""

    def train(self, roles: Sequence[str], minibatches: Sequence[Minibatch]) -> list[dict[str, float]]:
        """The optimizer steps of the named learners ("policy", "critic") on every minibatch; the
        stats of every step."""

    def use_ptx(self, batches: PtxBatches, coef: float, seed: int) -> None:
        """PPO-ptx on: `coef` x the SFT loss on batches the policy draws from `batches` with a
        generator seeded `seed`."""

    # -- checkpoints, export, the end -------------------------------------------------------------
    def save_checkpoint(self, directory: Path, state: dict[str, Any], steps_done: int) -> None:
        """The checkpoint `directory`, written whole or not at all (every process calls it): the
        trained roles' weights and state, the loop's `state` and DONE (rlhf/rundir/checkpoint.py)."""

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """A verified checkpoint's weights and roles' state loaded; the loop's state it holds."""

    def export(self, directory: Path) -> None:
        """The trained models as Hugging Face directories with the tokenizer (every process calls
        it; the run is over and its last checkpoint written: a sharded runtime frees the optimizer
        moments first)."""

    def close(self) -> None:
        """Free what the runtime started (Ray's actors and placement groups); the run is over."""
