"""What the RL loop (rlhf/rl/trainer.py) asks of a runtime: the seam every runtime implements
(LocalRuntime, DistributedRuntime here; rlhf.ray_runtime.RayRuntime over Ray actors). Roles are
called by name with plain data (token ids, Sequences, Experience minibatches, state dicts): no
callable, closure or generator crosses, so a runtime may serve a role from another process."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch

from rlhf.models.sampling import SamplingConfig
from rlhf.models.sequences import Sequences


@runtime_checkable
class Runtime(Protocol):
    writer: bool  # this process writes the run directory (rank 0 under torchrun; the Ray driver)
    sharded_checkpoints: bool  # fsdp2 under torchrun: every rank writes its checkpoint shards (DCP)

    # -- the loop's calls, by role name -----------------------------------------------------------
    def generate(self, prompts: list[list[int]], return_logprobs: bool) -> Any:
        """The policy's rollout (a models.sampling.Rollout), drawn from the policy's own generator."""

    def forward(self, role: str, sequences: Sequences, temperature: float | None = None) -> torch.Tensor:
        """A rollout's no-grad forward: "policy"/"reference" log-probs [B, T] at `temperature` (None:
        the sampling temperature), "critic" values [B, T], "reward_model" scores [B]."""

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Any:
        """An evaluator's sampling (a Rollout): the policy's responses to `prompts` under `sampling`,
        drawn from a generator seeded `seed`; the rollouts' own random state is untouched."""

    def train(self, roles: Sequence[str], minibatches: Sequence) -> list[dict[str, float]]:
        """The optimizer steps of the named learners ("policy", "critic") on every minibatch."""

    # -- facts ------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any: ...

    @property
    def device(self) -> torch.device: ...

    def has_role(self, name: str) -> bool: ...

    def learner_names(self, train_policy: bool = True) -> list[str]: ...

    def learning_rates(self) -> dict[str, float]: ...

    # -- state, weights, export -------------------------------------------------------------------
    def use_ptx(self, batches: Any, coef: float, seed: int) -> None: ...

    def role_state(self) -> dict: ...

    def load_role_state(self, state: dict) -> None: ...

    def save_weights(self, directory: Any) -> None: ...

    def load_weights(self, directory: Any) -> None: ...

    def export(self, directory: Any) -> None: ...

    def release_optimizer_state(self) -> None: ...

    def whole_models(self) -> AbstractContextManager: ...
