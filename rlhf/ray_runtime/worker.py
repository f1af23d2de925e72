"""The Ray actor of a role group: it builds the roles it serves (the others' models stay on the meta
device) and runs the local runtime over them, or, with several actors, the torchrun runtime's
data-parallel code over a torch.distributed group of their own (per-layer shards under
`dist.strategy fsdp2`; a rollout group keeps whole copies). Every call takes and returns plain data.
A call that needs a whole model gathers it on every actor (a collective) and rank 0 alone writes or
answers with it; checkpoints hold every actor's DCP shards under `groups/<group>/` and its process's
random state (`rng_state`)."""

from __future__ import annotations

import contextlib
import hashlib
import socket
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlhf.config import RLConfig
from rlhf.data.collate import PtxBatches
from rlhf.models.backbone import model_context
from rlhf.models.sampling import Rollout, SamplingConfig
from rlhf.models.sequences import Sequences
from rlhf.parallel.process_group import backend_for
from rlhf.ray_runtime.hosts import ROLLOUT
from rlhf.rl.roles.assemble import load_roles
from rlhf.rundir.checkpoint import rng_state, set_rng_state
from rlhf.rundir.export import write_models
from rlhf.rundir.sharded_checkpoint import group_shards, save_learner_shards, trained_learners
from rlhf.runtime import DistributedRuntime, runtime_for
from rlhf.runtime.protocol import Minibatch


class RoleWorker:
    """One actor of the group `group`, serving `roles` (rlhf/ray_runtime/hosts.py)."""

    def address(self) -> tuple[str, int]:
        """This actor's node address and a free port on it: where its group's process group meets."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        node: str = ray.util.get_node_ip_address()
        return node, port

    def setup(
        self,
        config: RLConfig,
        group: str,
        roles: list[str],
        rank: int,
        world: int,
        meet: tuple[str, int],
        threads: int,
    ) -> str:
        """Build the roles (the group's members join their process group first); its node's name."""
        import ray

        torch.set_num_threads(max(1, threads))
        self.group, self.rank = group, rank
        if group == ROLLOUT and config.dist.strategy == "fsdp2":  # samples with whole copies
            config = replace(config, dist=replace(config.dist, strategy="ddp"))
        self.sharded = config.dist.strategy == "fsdp2" and world > 1
        if world > 1:
            dist.init_process_group(
                backend_for(config.train.device),
                init_method=f"tcp://{meet[0]}:{meet[1]}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=config.dist.timeout),
            )
        # sharded: rank 0 alone reads the weights, the others' shards come from its (as torchrun's)
        self.roles = load_roles(config, on_meta=self.sharded and rank > 0, hosted=frozenset(roles))
        self.runtime = runtime_for(self.roles, config)
        node: str = ray.util.get_node_ip_address()
        return node

    # -- the loop's calls --------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], return_logprobs: bool) -> Rollout:
        return self.runtime.generate(prompts, return_logprobs)

    def forward(self, role: str, sequences: Sequences, temperature: float | None = None) -> torch.Tensor:
        return self.runtime.forward(role, sequences, temperature)

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        return self.runtime.sample(prompts, sampling, seed)

    def train(self, roles: list[str], minibatches: list[Minibatch]) -> list[dict[str, float]]:
        return self.runtime.train(roles, minibatches)

    # -- facts, state, weights ---------------------------------------------------------------
    def facts(self) -> dict[str, Any]:
        """What the driver asks once: the learners' names, the policy's positions (when served here)."""
        r = self.roles
        return {
            "learner_names": {True: r.learner_names(True), False: r.learner_names(False)},
            "context": model_context(r.policy.model) if r.hosts("policy") else None,
        }

    def learning_rates(self) -> dict[str, float]:
        return self.runtime.learning_rates()

    def use_ptx(self, batches: PtxBatches, coef: float, seed: int) -> None:
        self.runtime.use_ptx(batches, coef, seed)

    def role_state(self) -> dict[str, Any]:
        return self.runtime.role_state()

    def load_role_state(self, state: dict[str, Any]) -> None:
        self.runtime.load_role_state(state)

    def save_weights(self, directory: str) -> None:
        """The group's trained parameters into a checkpoint under way: sharded, every actor's shards
        and AdamW moments (DCP, `group_shards`); else rank 0's whole files (every member holds them)."""
        if isinstance(self.runtime, DistributedRuntime) and self.sharded:
            self.runtime.shard_roles()  # a no-op after the first use
            save_learner_shards(self.learners(), group_shards(Path(directory), self.group))
        elif self.rank == 0:
            self.runtime.save_weights(Path(directory))

    def load_weights(self, directory: str) -> None:
        """A checkpoint's trained parameters, read whole before the roles are sharded (by rank 0 alone
        in a sharded group): the group's shards (written by any number of actors) or the per-role
        files (rlhf/rl/roles/assemble.py)."""
        self.runtime.load_weights(Path(directory))

    def learners(self) -> dict[str, Any]:
        """{name: learner} of the trained roles this group hosts (a shared critic: the policy's)."""
        return {n: r for n, r in trained_learners(self.roles).items() if self.roles.hosts(n)}

    def whole(
        self, model: torch.nn.Module, every_rank: bool = False
    ) -> AbstractContextManager[torch.nn.Module | None]:
        """`model` whole for the body: gathered on every actor of a sharded group (all must call), a
        plain copy on rank 0 (None on the others; with `every_rank`, on each); unsharded, `model`
        itself."""
        return self.runtime.whole_model(model, every_rank) if self.sharded else contextlib.nullcontext(model)

    def export_into(self, tmp: str) -> None:
        """This group's trained models into an export under way (the driver commits it); sharded,
        every actor gathers each model in turn and rank 0 writes it."""
        write_models(Path(tmp) if self.rank == 0 else None, self.roles.exported_models(), whole=self.whole)

    # -- a rollout group's copy of the policy --------------------------------------------------
    def policy_weights(self) -> dict[str, torch.Tensor] | None:
        """The policy's trained parameters (a LoRA policy: its adapters), by name; sharded, gathered
        by every actor and answered by rank 0 (None elsewhere)."""
        model = self.roles.policy.model
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        with self.whole(model) as whole:
            weights = (
                None
                if whole is None
                else {n: p.detach() for n, p in whole.named_parameters() if n in trained}
            )
        return weights if self.rank == 0 or not self.sharded else None

    def load_policy_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy the policy group's trained parameters into this copy of the policy."""
        mine = dict(self.roles.policy.model.named_parameters())
        missing = sorted(set(weights) - set(mine))
        if missing:
            raise RuntimeError(f"the rollout's policy has no parameter {missing[0]} the trainer sent")
        with torch.no_grad():
            for name, value in weights.items():
                mine[name].copy_(value)

    def weights_digest(self) -> str:
        """sha256 of every policy parameter's bytes, in name order (tests: a sync is exact)."""
        digest = hashlib.sha256()
        model = self.roles.policy.model
        with self.whole(model, every_rank=True) as whole:  # sharded: each actor gets the same digest
            assert whole is not None  # every_rank: a copy on each actor
            for name, param in sorted(whole.named_parameters()):
                digest.update(name.encode())
                digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def parameter_bytes(self) -> tuple[int, int]:
        """(bytes of the trained roles' parameters this actor holds, bytes of the whole ones): a
        sharded actor holds its rows only (tests)."""
        params = [p for learner in self.learners().values() for p in learner.module.parameters()]
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        return (
            sum(t.numel() * t.element_size() for t in local),
            sum(p.numel() * p.element_size() for p in params),
        )

    # -- this process's global random state (a role drawing from it, e.g. dropout) ----------------
    def rng_state(self) -> dict[str, Any]:
        """Python's, NumPy's and torch's global generators in this actor (a checkpoint's)."""
        return rng_state()

    def load_rng_state(self, states: list[dict[str, Any]]) -> None:
        """This actor's state among its group's (by rank); an actor the checkpoint's run did not
        have (more actors on resume) keeps its own."""
        if self.rank < len(states):
            set_rng_state(states[self.rank])

    def sampler_state(self) -> torch.Tensor:
        return self.roles.policy.generator.get_state()

    def load_sampler_state(self, state: torch.Tensor) -> None:
        self.roles.policy.generator.set_state(state)
