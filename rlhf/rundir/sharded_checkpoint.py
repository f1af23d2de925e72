"""Sharded checkpoints of an `fsdp2` run with torch.distributed.checkpoint (DCP; docs/distributed.md).

Every rank writes its own chunks of the trained roles' parameters and AdamW moments into the
checkpoint's `shards/` directory (one `.distcp` file per rank, plus DCP's `.metadata`); rank 0
writes the rest of the trainer state (schedules, generators, score moments, ...; the optimizer
moments left out) and `DONE`, whose checksums cover the shards. Keys are flat:
`{role}/model/{parameter}` and `{role}/optim/{parameter}/{moment}`, the parameter names of the
unsharded module, so a checkpoint loads into whole modules: at any number of ranks (the run shards
them after loading), with `ddp`, or in one process (no process group: DCP reads every chunk).
A Ray run's sharded role groups write the same into `groups/<group>/shards/` (`group_shards`).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from rlhf.parallel.peers import Peers
from rlhf.rundir import checkpoint as ckpt

SHARDS = "shards"
GROUPS = "groups"  # a Ray run's sharded role groups, each its own `shards/`


def trained_learners(roles) -> dict:
    """The roles whose parameters and optimizer state the shards hold: {name: learner} (a shared
    critic is part of the policy's module; a critic-free run has none)."""
    if roles.separate_critic is None:
        return {"policy": roles.policy.learner}
    return {"policy": roles.policy.learner, "critic": roles.separate_critic.learner}


def has_shards(path: Path) -> bool:
    return (Path(path) / SHARDS).is_dir()


def shard_state(learners: dict) -> dict[str, torch.Tensor]:
    """The flat DCP state of `learners`: their parameters and optimizer moments (DTensor chunks when
    sharded), under the unsharded modules' parameter names."""
    state: dict[str, torch.Tensor] = {}
    for role, learner in learners.items():
        for name, param in learner.module.named_parameters():
            state[f"{role}/model/{name}"] = param.detach()
            for key, value in learner.optimizer.adamw.state.get(param, {}).items():
                state[f"{role}/optim/{name}/{key}"] = value
    return state


def write_shards_and_state(learners: dict, peers: Peers, target: Path, state: dict, steps_done: int) -> None:
    """The checkpoint `target` of sharded `learners` ({name: learner}): every rank writes its shards of
    their parameters and moments (every rank calls this); rank 0 `state` (`trainer.*`, the moments
    left out) and DONE, after every rank's shards."""
    writer = peers.rank == 0
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(ckpt.atomic_directory(target)) if writer else None
        tmp = Path(peers.gather(str(tmp) if writer else None)[0])  # rank 0's temporary directory
        save_learner_shards(learners, tmp)
        if writer:  # dcp.save returns once every rank's shards and the metadata are written
            ckpt.save_state(state, tmp, "trainer")
            ckpt.write_done(tmp, steps_done)  # sizes and checksums of every shard too


def save_learner_shards(learners: dict, path: Path) -> None:
    """Every rank's shards of `learners`' parameters and moments into `path/shards` (every rank of
    the default process group calls this; a Ray role group's own, rlhf/ray_runtime/worker.py)."""
    dcp.save(shard_state(learners), checkpoint_id=Path(path) / SHARDS)


def group_shards(directory: Path, group: str) -> Path:
    """Where a checkpoint holds the shards of a Ray role group sharded under fsdp2 (its own DCP
    directory: each group is a process group of its own; rlhf/ray_runtime/worker.py)."""
    return Path(directory) / GROUPS / group


def load_group_shards(roles, directory: Path) -> set[str]:
    """The trained roles hosted here whose Ray group left shards in checkpoint `directory` (a
    learner's group is named after it, rlhf/ray_runtime/hosts.py), loaded whole; their names."""
    loaded = set()
    for name, learner in trained_learners(roles).items():
        if roles.hosts(name) and has_shards(group_shards(directory, name)):
            load_learner_shards({name: learner}, group_shards(directory, name))
            loaded.add(name)
    return loaded


def load_sharded_weights(roles, path: Path) -> None:
    """Load a sharded checkpoint's parameters and optimizer moments into the (whole, not yet sharded)
    trained roles, in a process group or in one process."""
    load_learner_shards(trained_learners(roles), path)


def load_learner_shards(learners: dict, path: Path) -> None:
    """`write_shards_and_state`'s parameters and optimizer moments of `learners` ({name: learner},
    whole modules, not yet sharded), read in this process alone (any number of ranks wrote them)."""
    reader = dcp.FileSystemReader(str(Path(path) / SHARDS))
    saved = reader.read_metadata().state_dict_metadata
    state: dict[str, torch.Tensor] = {}
    moments: list[tuple] = []  # (optimizer, param, moment key, tensor)
    for role, learner in learners.items():
        for name, param in learner.module.named_parameters():
            key = f"{role}/model/{name}"
            if key not in saved:
                raise ValueError(
                    f"{path}: the sharded checkpoint has no {key} (a checkpoint of another model?)"
                )
            state[key] = param.detach()  # loaded in place
            prefix = f"{role}/optim/{name}/"
            for saved_key, meta in saved.items():
                if saved_key.startswith(prefix):
                    tensor = torch.empty(meta.size, dtype=meta.properties.dtype, device=param.device)
                    state[saved_key] = tensor
                    moments.append((learner.optimizer.adamw, param, saved_key[len(prefix) :], tensor))
    with torch.no_grad(), warnings.catch_warnings():
        # without collectives: each rank that loads reads every chunk of the whole tensors (under
        # fsdp2 rank 0 alone loads, the other ranks' models are on the meta device until sharded);
        # DCP warns that it assumes a load in one process: that is what is asked
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninit")
        dcp.load(state, storage_reader=reader, no_dist=True)
    for optimizer in {id(o): o for o, *_ in moments}.values():
        optimizer.state.clear()
    for optimizer, param, key, tensor in moments:
        optimizer.state.setdefault(param, {})[key] = tensor
