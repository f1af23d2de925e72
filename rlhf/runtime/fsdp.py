"""`dist.strategy fsdp2`: a trained module's parameters and optimizer state sharded over the ranks
with `torch.distributed.fsdp.fully_shard` (docs/distributed.md).

Between uses each rank keeps one shard (dim 0 split in `world_size` chunks) of every parameter, and
AdamW's moments of that shard only. A use gathers the whole module explicitly (`gathered`): a
rollout's sampling and no-grad forwards, and each optimizer step's micro-batches. Inside an
optimizer step FSDP's own per-backward reduce-scatter is off, because ranks hold different numbers
of micro-batches (uneven rows and tokens: "global batch, local rows") and a collective inside a
backward would wait for a rank that has none left. Instead `step` sums the whole gradients over
the ranks once (the ddp sum), keeps this rank's shard of the sum, frees the gathered parameters,
clips by the global norm (the norm of all shards: PPO paper §5.4) and steps AdamW on the shard.
So the numbers are the one-process step's; the memory saved is the optimizer state and, outside
the rollout and the step, the parameters.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlhf.runtime.peers import Peers


class ShardRoot(nn.Module):
    """The root that fully_shard needs for a container of modules (a policy with its value head:
    nn.ModuleList). Its parameters are used through the inner modules, gathered (`gathered`)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        raise NotImplementedError("call the inner modules, inside rlhf.runtime.fsdp.gathered")


def shard_module(module: nn.Module, optimizer: torch.optim.Optimizer, peers: Peers) -> FSDPModule:
    """Shard `module` in place (every rank must hold the same parameters and optimizer state first)
    and point `optimizer` at the shards; the sharded root (`module`, or a ShardRoot around a
    container) is what `gathered`, `whole_copies` and `step` take. Optimizer state already there (a
    resumed run's) is cut to each shard's rows. On a GPU the forwards run in bfloat16
    (MixedPrecisionPolicy; untested here); on the CPU in the parameters' dtype."""
    if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
        module = ShardRoot(module)
    before = dict(module.named_parameters())
    kwargs = {}
    if peers.device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(module, reshard_after_forward=False, **kwargs)
    after = dict(module.named_parameters())
    shard_of = {id(before[name]): after[name] for name in before}
    for group in optimizer.param_groups:
        group["params"] = [shard_of[id(p)] for p in group["params"]]
    state = {}
    for param, moments in optimizer.state.items():
        shard = shard_of[id(param)]
        state[shard] = {
            key: _shard_like(value, shard, peers) if _is_per_element(value, param) else value
            for key, value in moments.items()
        }
    optimizer.state.clear()
    optimizer.state.update(state)
    return module


def _is_per_element(value, param: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == param.shape


def _shard_like(full: torch.Tensor, shard: DTensor, peers: Peers) -> DTensor:
    return _as_shard_of(_local_rows(full, peers.rank, peers.world_size).clone().to(shard.device), shard)


def _as_shard_of(local: torch.Tensor, shard: DTensor) -> DTensor:
    """`local` (this rank's rows) as a DTensor laid out as `shard` (uneven chunks: the global shape given)."""
    return DTensor.from_local(
        local, shard.device_mesh, shard.placements, run_check=False, shape=shard.shape, stride=shard.stride()
    )


def is_sharded(module: nn.Module) -> bool:
    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def gathered(modules: Sequence[nn.Module]) -> Iterator[None]:
    """The whole parameters of every sharded module in `modules` for the body (one all-gather each,
    on every rank), sharded again after; FSDP's gradient reduction stays off inside. The gathered
    parameters are set on the submodules, so a role's model (a submodule of its learner's module)
    runs, saves and exports as an unsharded one."""
    sharded = [m for m in modules if is_sharded(m)]
    with torch.inference_mode(False):  # gathered under a rollout's inference mode, trained on later
        for module in sharded:
            module.set_requires_gradient_sync(False)
            module.set_reshard_after_backward(False)
            module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()


@contextlib.contextmanager
def whole_copies(modules: Sequence[nn.Module]) -> Iterator[None]:
    """As `gathered`, each gathered parameter replaced by a plain copy for the body: what saving and
    exporting need (FSDP's gathered parameters are views into its all-gather buffer, which
    safetensors cannot address). Resharding sets the shards back on the submodules."""
    owners = [owner for m in modules if is_sharded(m) for owner in m.modules()]
    # FSDP's state_dict pre-hooks would shard the parameters again before a save reads them
    hooks = {id(owner): owner._state_dict_pre_hooks for owner in owners}
    with gathered(modules):
        copies: dict[int, nn.Parameter] = {}
        for owner in owners:
            owner._state_dict_pre_hooks = OrderedDict()
            for name, param in list(owner._parameters.items()):
                if param is None:
                    continue
                if id(param) not in copies:  # tied weights stay one parameter
                    copies[id(param)] = nn.Parameter(
                        param.detach().clone(), requires_grad=param.requires_grad
                    )
                owner._parameters[name] = copies[id(param)]
        try:
            yield
        finally:
            for owner in owners:
                owner._state_dict_pre_hooks = hooks[id(owner)]


def step(
    module: FSDPModule,
    optimizer: torch.optim.Optimizer,
    scheduler,
    peers: Peers,
    max_grad_norm: float | None,
    summed: bool = False,
) -> float:
    """The optimizer step of a gathered sharded module after its micro-batches' backwards: sum the
    gradients over the ranks, keep this rank's shard, shard the parameters again, clip by the global
    norm, step; the pre-clip norm. `summed`: the caller has summed the gradients already."""
    whole = dict(module.named_parameters())  # while gathered: the whole parameters, with gradients
    trained = [p for p in whole.values() if p.requires_grad]
    for p in trained:  # sums in float32 (the MixedPrecisionPolicy's reduce dtype on a GPU)
        if p.grad is not None and p.grad.dtype != torch.float32:
            p.grad = p.grad.float()
    if not summed:
        peers.sum_gradients(trained)
    local = {}
    for name, p in whole.items():
        if p.requires_grad and p.grad is not None:
            local[name] = _local_rows(p.grad, peers.rank, peers.world_size).clone()
            p.grad = None
    module.reshard()
    shards = dict(module.named_parameters())  # now the DTensor shards the optimizer holds
    for name, grad in local.items():
        shard = shards[name]
        shard.grad = _as_shard_of(grad.to(shard.dtype), shard)
    trained = list(local)
    with_grad = [shards[name] for name in trained if shards[name].grad is not None]
    norm = global_norm(with_grad, peers)
    # clip_grad_norm_'s coefficient min(1, max / (norm + 1e-6)), applied to each shard
    if max_grad_norm is not None and not max_grad_norm / (norm + 1e-6) >= 1.0:
        scale = max_grad_norm / (norm + 1e-6)
        for p in with_grad:
            p.grad.to_local().mul_(scale)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def _local_rows(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's dim-0 chunk of `full`, as fully_shard splits it (torch.chunk; empty past the end)."""
    chunks = torch.chunk(full, world_size, dim=0)
    return chunks[rank] if rank < len(chunks) else full[:0]


def global_norm(params: Sequence[torch.Tensor], peers: Peers) -> float:
    """The L2 norm of the gradients of every shard of `params` (DTensor parameters) over the ranks."""
    local = sum(float(p.grad.to_local().double().square().sum()) for p in params)
    return math.sqrt(peers.sum(local))


def shard_trained(
    strategy: str, model: nn.Module, optimizer: torch.optim.Optimizer, peers: Peers | None
) -> list:
    """[model], sharded, under `dist.strategy fsdp2` in a process group; else [] (nothing to gather):
    what SFT and reward-model training pass to `gathered`, `whole_copies` and `step`."""
    if peers is None or strategy != "fsdp2":
        return []
    return [shard_module(model, optimizer, peers)]
