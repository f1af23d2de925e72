"""The distributed runtime: data parallelism over the ranks of a torchrun launch (docs/distributed.md).

Global batch, local rows: every rank holds every role and runs the same loop on the same numbers.
`generate` samples each rank's share of the rows with the whole batch's uniforms
(rlhf/parallel/rollout_share.py); `map_rows` runs a no-grad forward on each rank's share and gathers
the results; `train` passes every minibatch to each learner, whose engine (`Learner.step`) takes the
rank's rows with fillers in lockstep. Under `fsdp2` every role is sharded per layer at its first use
(rlhf/parallel/fsdp.py), no-grad forwards padded to the largest share; the rollout unshards the policy
once or gathers a layer at a time (`dist.rollout_gather per_layer`). No critic thread beside the
policy's (both would all-reduce on one group). Rank 0 alone writes the run directory (`writer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlhf.config import ConfigError, RLConfig, RuntimeConfig
from rlhf.models.sampling import Rollout, SamplingConfig
from rlhf.models.sequences import Sequences
from rlhf.parallel import fsdp
from rlhf.parallel.peers import Peers
from rlhf.parallel.rollout_share import join_rollouts, row_share
from rlhf.runtime.local import LocalRuntime, RoleSet
from rlhf.runtime.protocol import Minibatch


class DistributedRuntime(LocalRuntime):
    """The local runtime's scheduling on this rank's share of the rows, joined over the ranks."""

    def __init__(
        self,
        roles: RoleSet,
        config: RuntimeConfig,
        group: dist.ProcessGroup | None = None,
        strategy: str = "ddp",
        offload: bool = False,
        rollout_gather: str = "whole",
    ) -> None:
        super().__init__(roles, config)
        self.peers = Peers(group)
        self.learners = roles.learners()  # the policy, and a critic of its own (none: critic-free)
        self.sharded = strategy == "fsdp2"
        self.offload = offload  # dist.offload: the shards and AdamW state in CPU memory
        self.rollout_gather = rollout_gather  # dist.rollout_gather: the sampled policy whole or per layer
        # the learners were built with their strategy (ddp: replicated; fsdp2: sharded at the first
        # use, `shard_roles`; rlhf/parallel/parallel_plan.py): built outside this group, they would not
        # sum their gradients over its ranks
        for role in self.learners:
            if role.learner.peers is None:
                raise RuntimeError(
                    "the roles were built outside the process group: build them after joining it "
                    "(rlhf.rl.roles.assemble.assemble_roles gives each learner its data-parallel strategy)"
                )
        # fsdp2: every role is sharded at its first use, after a resumed run loaded its state (on
        # rank 0 alone when the other ranks built their models on the meta device)
        self.shard_pending = self.sharded

    def shard_roles(self) -> None:
        """fsdp2, on the first call: every role sharded per layer (the frozen ones without optimizer)."""
        if not self.shard_pending:
            return
        self.shard_pending = False
        with torch.inference_mode(False):  # the first use may be a rollout's: shards trained later
            self._shard_every_role()

    def _shard_every_role(self) -> None:
        r = self.roles
        precision = r.policy.precision
        bf16 = precision is not None and precision.uses_autocast  # dtype bfloat16: gathered in bf16
        for role in self.learners:
            role.learner.shard()  # as planned when it was built (rlhf/parallel/parallel_plan.py)
        frozen = {
            "reference": r.reference.own_module,
            "reward_model": r.reward_model and r.reward_model.model,
        }
        for name, module in frozen.items():
            if module is not None and r.hosts(name):  # a Ray group's others are on the meta device
                fsdp.shard_from_rank0(module, self.peers, bf16_compute=bf16, offload=self.offload)

    def whole_model(
        self, model: nn.Module, every_rank: bool = False
    ) -> AbstractContextManager[nn.Module | None]:
        self.shard_roles()
        return fsdp.whole_copy(model, every_rank)

    def save_checkpoint(self, directory: Path, state: dict[str, Any], steps_done: int) -> None:
        """ddp: rank 0 writes it all (every rank holds the same); fsdp2: every rank writes its shards
        of the parameters and optimizer moments (DCP), rank 0 the rest (Roles.save_checkpoint)."""
        if not self.sharded:
            super().save_checkpoint(directory, state, steps_done)
            return
        self.shard_roles()
        roles_state = self.role_state()  # the optimizer moments left out: they are in the shards
        self.roles.save_checkpoint(directory, {**state, "roles": roles_state}, steps_done, peers=self.peers)

    def export(self, directory: Path) -> None:
        """fsdp2: the optimizer moments freed first (the last checkpoint's shards hold them), so each
        model's whole parameters are gathered in turn with that memory free."""
        if self.sharded:
            self.release_optimizer_state()
        super().export(directory)

    @property
    def writer(self) -> bool:
        return self.peers.rank == 0

    def check_rows(self, rows: int) -> None:
        if rows < self.peers.world_size:
            raise ConfigError(
                f"rollout.batch_size {rows} is smaller than the {self.peers.world_size} data-parallel ranks: "
                f"some would have no row. Fix: --rollout.batch_size {self.peers.world_size} or more."
            )

    def generate(self, prompts: list[list[int]], return_logprobs: bool) -> Rollout:
        """This rank's share of the rollout, joined with the other ranks' into the whole batch's."""
        policy = self.roles.policy
        return self._sampled(prompts, return_logprobs, policy.sampling, policy.generator)

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        """An evaluator's sampling, shared over the ranks as `generate` (every rank seeds the same
        generator, so the tokens are the one process's)."""
        generator = torch.Generator(self.roles.policy.device).manual_seed(seed)
        return self._sampled(prompts, False, sampling, generator)

    def _sampled(
        self,
        prompts: list[list[int]],
        return_logprobs: bool,
        sampling: SamplingConfig,
        generator: torch.Generator,
    ) -> Rollout:
        self.check_rows(len(prompts))
        share = row_share(self.peers, len(prompts))
        self.shard_roles()
        policy = self.roles.policy
        draws = {"sampling": sampling, "generator": generator}
        if self.sharded and self.rollout_gather == "per_layer":  # a layer at a time, ranks in lockstep
            with fsdp.gathered_per_layer(policy.learner.module):
                mine = policy.generate(
                    prompts, return_logprobs, share=share, all_ranks_done=self.peers.all, **draws
                )
        else:
            with fsdp.unsharded([policy.learner.module]):  # fsdp2: gathered once, not per decoding step
                mine = policy.generate(prompts, return_logprobs, share=share, **draws)
        return join_rollouts(
            self.peers, mine, share, generator, sampling.do_sample, policy.tokenizer.pad_token_id
        )

    def map_rows(self, forward: Callable[[Sequences], torch.Tensor], sequences: Sequences) -> torch.Tensor:
        rows = sequences.batch_size
        self.check_rows(rows)
        self.shard_roles()
        share = self.peers.rows(rows)
        if not self.sharded:
            return self.peers.gather_rows(super().map_rows(forward, sequences.rows(share)), rows)
        # sharded: every rank runs as many rows (fillers dropped), on this thread (collectives);
        # outside inference mode: FSDP's gather buffers are reused by the training steps
        index, real = self.peers.padded_share(rows)
        with torch.inference_mode(False), torch.no_grad():
            mine = forward(sequences.rows(torch.tensor(index)))[:real]
        return self.peers.gather_rows(mine, rows)

    def steps(self, roles: Sequence[str], minibatches: Sequence[Minibatch]) -> list[dict[str, float]]:
        """Each named learner's steps on every minibatch, as in one process: each learner takes this
        rank's rows of it (rlhf/train/learner.py); the stats (summed over the ranks) of every step."""
        self.shard_roles()
        return super().steps(roles, minibatches)

    def overlap_threads(self, learners: Sequence[Any]) -> int | None:
        return None  # one process group: the policy's and critic's all-reduces must not interleave


def runtime_for(roles: RoleSet, config: RLConfig) -> LocalRuntime:
    """The runtime of a run: distributed inside a torchrun process group (`data_parallel`), else local."""
    if dist.is_available() and dist.is_initialized():
        d = config.dist
        return DistributedRuntime(
            roles,
            config.runtime,
            strategy=d.strategy,
            offload=d.offload,
            rollout_gather=d.rollout_gather,
        )
    return LocalRuntime(roles, config.runtime)
