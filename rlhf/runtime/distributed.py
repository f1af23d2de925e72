"""The distributed runtime: data parallelism over the ranks of a torchrun launch (docs/distributed.md).

Global batch, local rows. Every rank holds every role and runs the same loop (rlhf/rl/trainer.py) on
the same numbers: the same prompts, the same sampled tokens, the same experience and statistics.
The costly work on rows is shared:
- `generate`: each rank samples its share of the rows, drawing the whole batch's uniforms at each
  step, so the tokens do not depend on the number of ranks; the shares are gathered
  (rlhf/runtime/rollout_share.py);
- `map_rows`: each rank runs a rollout's no-grad forward (scores, log-probs, values) on its share of
  the rows; the shares are gathered, so every rank holds the whole batch's results;
- `train`: each rank runs every optimizer step on its share of the minibatch's rows, each
  micro-batch weighted by its tokens over the whole minibatch's tokens; the learners sum gradients
  and step statistics over the ranks (rlhf/runtime/peers.py), so every rank takes the one-process
  step. The critic's steps never run beside the policy's on a second thread here: both would
  all-reduce on one process group and could mix their buckets.
Under `dist.strategy fsdp2` the learners' modules and optimizer state are sharded at the first use
(after a resumed run has loaded its whole state) and gathered for each of the uses above
(rlhf/runtime/fsdp.py); checkpoints are written as each rank's shards
(rlhf/rundir/sharded_checkpoint.py). The frozen roles (reference, reward model) stay whole.
Rank 0 alone writes the run directory (`writer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlhf.config import ConfigError, RuntimeConfig
from rlhf.models.sequences import Sequences
from rlhf.runtime.fsdp import gathered, shard_module, whole_copies
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.peers import Peers
from rlhf.runtime.rollout_share import join_rollouts, row_share


class DistributedRuntime(LocalRuntime):
    """The local runtime's scheduling on this rank's share of the rows, joined over the ranks."""

    def __init__(self, roles, config: RuntimeConfig, group=None, strategy: str = "ddp") -> None:
        super().__init__(roles, config)
        self.peers = Peers(group)
        self.learners = roles.learners()  # the policy, and a critic of its own (none: critic-free)
        for learner in self.learners:
            learner.peers = self.peers
            self.peers.broadcast_parameters(learner.module.parameters())  # one start for every rank
        # fsdp2: the learners are sharded at the first use, after a resumed run loaded its whole state
        self.shard_pending = strategy == "fsdp2"
        self.sharded_checkpoints = strategy == "fsdp2"

    def sharded_modules(self) -> list:
        """The learners' modules, sharded on first call under fsdp2 (the frozen roles stay whole)."""
        if self.shard_pending:
            self.shard_pending = False
            for learner in self.learners:
                learner.sharded = shard_module(learner.module, learner.optimizer, self.peers)
        return [learner.sharded for learner in self.learners if learner.sharded is not None]

    def whole_models(self):
        return whole_copies(self.sharded_modules())

    @property
    def writer(self) -> bool:
        return self.peers.rank == 0

    def check_rows(self, rows: int) -> None:
        if rows < self.peers.world_size:
            raise ConfigError(
                f"rollout.batch_size {rows} is smaller than the {self.peers.world_size} data-parallel ranks: "
                f"some would have no row. Fix: --rollout.batch_size {self.peers.world_size} or more."
            )

    def generate(self, policy, prompts: list[list[int]], generator: torch.Generator, return_logprobs: bool):
        """This rank's share of the rollout, joined with the other ranks' into the whole batch's."""
        self.check_rows(len(prompts))
        share = row_share(self.peers, len(prompts))
        with gathered(self.sharded_modules()):
            mine = policy.generate(prompts, generator, return_logprobs, share=share)
        sampled = policy.sampling.do_sample
        return join_rollouts(self.peers, mine, share, generator, sampled, policy.tokenizer.pad_token_id)

    def map_rows(self, forward: Callable[[Sequences], torch.Tensor], sequences: Sequences) -> torch.Tensor:
        rows = sequences.batch_size
        self.check_rows(rows)
        with gathered(self.sharded_modules()):
            mine = super().map_rows(forward, sequences.rows(self.peers.rows(rows)))
        return self.peers.gather_rows(mine, rows)

    def train(self, learners: Sequence, minibatches: Sequence) -> list[dict[str, float]]:
        """Each learner's steps on this rank's rows of every minibatch, the loss denominator the whole
        minibatch's; the stats (summed over the ranks inside the step) of every step."""
        steps = []
        for learner in learners:
            for minibatch in minibatches:
                mine = torch.arange(minibatch.batch_size)[self.peers.rows(minibatch.batch_size)]
                with gathered(sharded_module_of(learner)):  # fsdp2: sharded again in its step
                    steps.append(
                        learner.train_step(minibatch.select(mine), learner.loss_denominator(minibatch))
                    )
        return steps

    def overlap_threads(self, learners: Sequence) -> int | None:
        return None  # one process group: the policy's and critic's all-reduces must not interleave


def sharded_module_of(learner) -> list:
    """[the module `learner` steps] when fsdp2 shards it (a shared critic steps the policy's), else []."""
    owner = learner.policy if getattr(learner, "shares_policy", False) else learner
    return [owner.sharded] if owner.sharded is not None else []


def runtime_for(roles, config) -> LocalRuntime:
    """The runtime of a run: distributed inside a torchrun process group (`data_parallel`), else local."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return DistributedRuntime(roles, config.runtime, strategy=config.dist.strategy)
    return LocalRuntime(roles, config.runtime)
