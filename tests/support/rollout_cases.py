"""What the per-layer rollout tests run on each rank and in one process (`dist.rollout_gather`,
tests/runtime/test_rollout_gather.py).

A PPO-max run on the 2-layer tiny models whose rollouts are watched: every rollout's joined tokens,
each rank's own rows (when they all ended), the decoder-layer forwards each rank ran while sampling,
and the most policy parameter elements gathered at once (held whole rather than as shards).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from rlhf.parallel.fsdp import transformer_blocks
from tests.support.dist_cases import DATA_PARALLEL_CASE, trainer_of
from tests.support.train_testing import metric_rows, rl_config

# 8 new tokens: every rollout has rows that end early and rows that run on (uneven EOS over the ranks)
ROLLOUT_CASE = {**DATA_PARALLEL_CASE, "rollout": {"batch_size": 10, "max_new_tokens": 8}}


class GatheredParameters(TorchDispatchMode):
    """While `active`, the most elements of `module`'s parameters held whole (not DTensor shards)
    when any op runs: FSDP2 registers a unit's gathered parameters on its modules while gathered."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.active = False
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.active:
            whole = sum(p.numel() for p in self.module.parameters() if not isinstance(p, DTensor))
            self.most = max(self.most, whole)
        return func(*args, **(kwargs or {}))


def watched_rollout_run(run_dir: str, gather: str, max_new_tokens: int = 20) -> dict:
    """A 2-iteration fsdp2 PPO-max run (2 decoder layers per model) with `dist.rollout_gather
    gather`, its rollouts watched; in one process (no group) the local runtime's."""
    case = {**ROLLOUT_CASE, "rollout": {**ROLLOUT_CASE["rollout"], "max_new_tokens": max_new_tokens}}
    config = rl_config(
        "ppo_max", case, {"dist": {"strategy": "fsdp2", "rollout_gather": gather}}, out=run_dir
    )
    trainer = trainer_of(config, Path(run_dir), num_layers=2)
    runtime, policy = trainer.runtime, trainer.runtime.roles.policy
    blocks = transformer_blocks(policy.learner.module)
    watch = GatheredParameters(policy.learner.module)
    layer_calls = [0]  # decoder-layer forwards while sampling

    def count(*_):
        layer_calls[0] += watch.active

    for block in blocks:
        block.register_forward_pre_hook(count)
    rollouts, own = [], []
    joined_generate, own_generate = runtime.generate, policy.generate

    def generate(*args, **kwargs):
        if hasattr(runtime, "shard_roles"):
            runtime.shard_roles()  # at the first use: the whole models are cut into shards first
        watch.active = True
        try:
            rollout = joined_generate(*args, **kwargs)
        finally:
            watch.active = False
        rollouts.append(rollout.input_ids.clone())
        return rollout

    def generate_own(*args, **kwargs):
        mine = own_generate(*args, **kwargs)
        lengths = mine.response_mask.sum(-1)
        ended = bool(mine.ended_with_eos.all())  # else a row ran to max_new_tokens
        own.append(int(lengths.max()) if ended else max_new_tokens)
        return mine

    runtime.generate, policy.generate = generate, generate_own
    with watch:
        last = trainer.train()
    root_only = sum(p.numel() for p in policy.learner.module.parameters()) - sum(
        p.numel() for b in blocks for p in b.parameters()
    )
    return {
        "last": {k: v for k, v in last.items() if not k.startswith(("time/", "throughput/"))},
        "written": metric_rows(run_dir) if runtime.writer else None,
        "rollouts": rollouts,
        "own_rows_ended_at": own,  # per rollout: the step at which this rank's rows had all ended
        "layer_calls": layer_calls[0],
        "most_gathered": watch.most,
        "policy_elements": sum(p.numel() for p in policy.learner.module.parameters()),
        "root_elements": root_only,
        "largest_layer_elements": max(sum(p.numel() for p in b.parameters()) for b in blocks),
    }
