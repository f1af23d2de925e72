"""`dist.strategy fsdp2`: every role's parameters sharded over the ranks with
`torch.distributed.fsdp.fully_shard` (docs/distributed.md, docs/scale.md).

Per layer (`shard_from_rank0`), as torchtitan applies FSDP2: each decoder layer its own unit, then the
role's root (embeddings, final norm, heads); each rank keeps a dim-0 shard of every parameter and
AdamW's moments of it. Forwards gather a layer at a time; backwards reduce-scatter its gradient,
summed (divide factor 1: losses are already token-weighted). The step clips by the global norm over
the shards (`step_shards`); `dist.offload` keeps shards and AdamW state in CPU memory. The rollout
unshards the policy once (`unsharded`) or gathers a layer per decode step (`gathered_per_layer`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from rlhf.parallel.peers import Peers


def _precision(peers: Peers, bf16_compute: bool = True, offload: bool = False) -> dict[str, Any]:
    """fully_shard's keywords: on a GPU under bf16 compute (`dtype bfloat16`: float32 master
    weights, bf16 autocast) the layers are gathered in bfloat16 and the gradients reduced in float32
    (MixedPrecisionPolicy), else in the parameters' dtype; `offload` (`dist.offload`): the shards,
    gradients and AdamW state in CPU memory (CPUOffloadPolicy), each layer copied to the device for
    its use, from pinned memory on a GPU (on the CPU the policy holds and copies nothing: what the
    CPU tests check)."""
    kwargs: dict[str, Any] = {}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=peers.device.type == "cuda")
    if peers.device.type == "cuda" and bf16_compute:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return kwargs


def _point_optimizer_at_shards(
    optimizer: torch.optim.Optimizer | None,
    before: dict[str, nn.Parameter],
    after: dict[str, nn.Parameter],
    peers: Peers,
) -> None:
    """`optimizer`'s parameters replaced by their shards (`before`/`after`: the module's named
    parameters before and after fully_shard), its per-element state cut to each shard's rows."""
    if optimizer is None:
        return
    shard_of = {id(before[name]): after[name] for name in before}
    for group in optimizer.param_groups:
        group["params"] = [shard_of[id(p)] for p in group["params"]]
    state: dict[torch.Tensor, dict[str, Any]] = {}
    for param, moments in optimizer.state.items():
        shard = cast(DTensor, shard_of[id(param)])  # fully_shard's parameters are DTensors
        state[shard] = {
            key: _shard_like(value, shard, peers) if _is_per_element(value, param) else value
            for key, value in moments.items()
        }
    optimizer.state.clear()
    optimizer.state.update(state)


def transformer_blocks(module: nn.Module) -> list[nn.Module]:
    """The decoder layers inside `module`, each an FSDP unit of its own: the submodules whose class
    a Hugging Face model names in `_no_split_modules` (what accelerate's FSDP auto-wrap shards one
    by one); for a model without that list, the entries of its longest nn.ModuleList."""
    names = {name for m in module.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    blocks = [m for m in module.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists: list[nn.ModuleList] = [m for m in module.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        return []
    longest: nn.ModuleList = max(lists, key=len)
    return list(longest)


# what a role calls on its root besides `forward`: a policy's rollout, a reward model's scores
FORWARD_METHODS = ("sample", "score")


def shard_from_rank0(
    root: nn.Module,
    peers: Peers,
    optimizer: torch.optim.Optimizer | None = None,
    bf16_compute: bool = False,
    offload: bool = False,
) -> nn.Module:
    """Shard `root` in place per layer (`_shard_layers`), every rank's rows of the parameters,
    buffers and AdamW state sent by rank 0: the only rank that must hold the whole module (the
    others may have built it on the meta device, rlhf/models/loading.py, and never hold more than one
    whole tensor, in transit). Rank 0's parameters are what a resumed run loaded there, or what
    every rank would have read. `optimizer` (None for a frozen role) is pointed at the shards;
    `bf16_compute`: on a GPU, layers gathered in bfloat16; `offload`: state in CPU memory (`_precision`)."""
    whole = dict(root.named_parameters())  # rank 0: the whole tensors, kept until their rows are sent
    moments = {n: dict(optimizer.state.get(p, {})) for n, p in whole.items()} if optimizer is not None else {}
    if optimizer is not None and peers.rank != 0:
        optimizer.state.clear()  # a meta rank's (a resume loads its state on rank 0 alone)
    _shard_layers(root, peers, optimizer, _precision(peers, bf16_compute, offload))
    device = torch.device("cpu") if offload else peers.device  # where the shards live
    meta = any(cast(DTensor, p).to_local().is_meta for p in root.parameters())  # fully_shard's DTensors
    if meta or any(b.is_meta for b in root.buffers()):
        root.to_empty(device=device)
    shards = dict(root.named_parameters())
    with torch.no_grad():
        for name, param in whole.items():
            _local_of(shards[name]).copy_(_rows_from_rank0(param, peers))
        for buffer in root.buffers():  # rotary frequencies and the like: not in any checkpoint
            dist.broadcast(buffer, src=0, group=peers.group)
    if optimizer is not None:
        _optimizer_state_from_rank0(optimizer, moments, shards, peers)
    return root


def _shard_layers(
    root: nn.Module, peers: Peers, optimizer: torch.optim.Optimizer | None, precision: dict[str, Any]
) -> None:
    """`fully_shard` each decoder layer of `root`, then `root` (the rest: the embeddings, the final
    norm, the heads), every unit resharded after its forward, gradients reduce-scattered as sums
    (divide factor 1); `optimizer`'s parameters and state pointed at the shards. `root` is what the
    role calls: its `forward` and FORWARD_METHODS gather its own parameters (and make it FSDP's
    root); a submodule called directly would bypass them."""
    _META_COPIES[root] = _meta_copy(root)  # what `whole_copy` fills
    before = dict(root.named_parameters())
    for block in transformer_blocks(root):
        fully_shard(block, reshard_after_forward=True, **precision)
    fully_shard(root, reshard_after_forward=True, **precision)
    for unit in fsdp_units(root):
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    for name in FORWARD_METHODS:
        if callable(getattr(root, name, None)):
            register_fsdp_forward_method(root, name)
    _point_optimizer_at_shards(optimizer, before, dict(root.named_parameters()), peers)


def _local_of(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _rows_from_rank0(param: torch.Tensor, peers: Peers) -> torch.Tensor:
    """This rank's dim-0 chunk of rank 0's whole `param`: broadcast whole (one tensor in transit)."""
    whole = (
        param.detach()
        if peers.rank == 0
        else torch.empty(param.shape, dtype=param.dtype, device=peers.device)
    )
    whole = whole.to(peers.device).contiguous()
    dist.broadcast(whole, src=0, group=peers.group)
    return _local_rows(whole, peers.rank, peers.world_size)


def _optimizer_state_from_rank0(
    optimizer: torch.optim.Optimizer,
    moments: dict[str, dict[str, Any]],
    shards: dict[str, nn.Parameter],
    peers: Peers,
) -> None:
    """Rank 0's AdamW state (a resumed run's), cut to every rank's shards; the fused kernel on."""
    layout = peers.gather(
        {n: {k: (tuple(v.shape), v.dtype) for k, v in state.items()} for n, state in moments.items() if state}
    )[0]
    # built on the meta device without it (rlhf/train/optimizer.py `build_optimizer`)
    for group in optimizer.param_groups:
        group["fused"] = peers.device.type in ("cpu", "cuda")
    for name, keys in layout.items():
        shard = cast(DTensor, shards[name])  # fully_shard's parameters are DTensors
        state: dict[str, torch.Tensor] = {}
        for key, (shape, dtype) in keys.items():
            mine = moments.get(name, {}).get(key)
            # rank 0 holds every moment its layout names
            carrier = cast(torch.Tensor, mine) if peers.rank == 0 else torch.empty(shape, dtype=dtype)
            if len(shape) > 0 and tuple(shape) == tuple(shard.shape):  # per element: this rank's rows
                rows = _rows_from_rank0(carrier, peers).to(_local_of(shard).device)
                state[key] = _as_shard_of(rows.clone(), shard)
            else:  # AdamW's step count
                value = carrier.detach().to(peers.device).clone()
                dist.broadcast(value, src=0, group=peers.group)
                state[key] = value.to(_local_of(shard).device)
        optimizer.state[shard] = state


def fsdp_units(root: nn.Module) -> list[FSDPModule]:
    """The FSDP units of a sharded module tree: its layers and its root."""
    return [m for m in root.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def unsharded(roots: Sequence[nn.Module]) -> Iterator[None]:
    """Every unit of the sharded `roots` gathered once for the body and kept so through its forwards
    (a rollout's hundreds of decoding steps: one all-gather per unit instead of one per step and
    layer), sharded again after. On a GPU the gathered parameters are in the compute dtype."""
    units = [u for root in roots if is_sharded(root) for u in fsdp_units(root)]
    with torch.inference_mode(False):  # gathered under a rollout's inference mode, trained on later
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


@contextlib.contextmanager
def gathered_per_layer(root: nn.Module) -> Iterator[None]:
    """The rollout of `dist.rollout_gather per_layer`: the sharded `root` left sharded, so that every
    decoding step's forward gathers one layer at a time through FSDP2's own hooks and frees it after
    (the root unit, embeddings and heads, held through the `sample` call); every rank must then run
    the same forwards (rlhf.models.sampling, `all_ranks_done`). Each unit is first gathered and freed
    once outside inference mode, one at a time: FSDP2 keeps the gathered parameters' tensors for its
    later gathers, which the training steps must be able to use (an inference tensor made by the
    first gather, under the sampler's inference mode, could not be saved for a backward)."""
    with torch.inference_mode(False):
        for unit in fsdp_units(root) if is_sharded(root) else []:
            unit.unshard()
            unit.reshard()
    yield


def step_shards(
    root: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    peers: Peers,
    max_grad_norm: float | None,
) -> float:
    """The optimizer step of a module sharded per layer after its micro-batches' backwards (whose
    reduce-scatters left each rank its shard of the summed gradients): clip by the global norm over
    every rank's shards (PPO paper §5.4), step AdamW on this rank's shards; the pre-clip norm."""
    with_grad = [p for p in root.parameters() if p.grad is not None]
    return _clip_and_step_shards(with_grad, optimizer, scheduler, peers, max_grad_norm)


def _clip_and_step_shards(
    with_grad: Sequence[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    peers: Peers,
    max_grad_norm: float | None,
) -> float:
    """Clip the shards' gradients by their global norm, step AdamW and the schedule; the pre-clip norm.
    A NaN/inf global norm (the same on every rank) skips the step on every rank (algorithms.md §19)."""
    norm = global_norm(with_grad, peers)
    if math.isfinite(norm):
        clip_shards(with_grad, norm, max_grad_norm)
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def clip_shards(params: Sequence[torch.Tensor], norm: float, max_grad_norm: float | None) -> None:
    """clip_grad_norm_'s coefficient min(1, max / (norm + 1e-6)), applied to each shard's gradient."""
    if max_grad_norm is not None and not max_grad_norm / (norm + 1e-6) >= 1.0:
        scale = max_grad_norm / (norm + 1e-6)
        for p in params:
            cast(DTensor, p.grad).to_local().mul_(scale)  # a shard's gradient


def _is_per_element(value: object, param: torch.Tensor) -> bool:
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
def whole_copy(model: nn.Module, every_rank: bool = False) -> Iterator[nn.Module | None]:
    """`model` (a sharded root, any part of one, or a module never sharded) with its whole
    parameters for the body: what saving, exporting, copying and comparing need. Never sharded:
    `model` itself. Sharded: a plain module of `model`'s own class, without FSDP's hooks (an export
    of a LoRA model deep-copies it), built from the meta-device copy `_shard_layers` made of its
    root and holding the full state dict torch's `get_model_state_dict` gathers (an all-gather on
    every rank, so every rank must call this; in the stored dtype: float32 master weights stay
    float32; tied weights stay one parameter) and `model`'s buffers. That copy is rank 0's, in CPU
    memory (None on the other ranks), or with `every_rank` each rank's, on the shards' device."""
    part = _meta_part(model)
    if part is None:
        if any(isinstance(p, DTensor) for p in model.parameters()):
            raise RuntimeError("a part of a sharded module whose root is gone: keep the root (its meta copy)")
        yield model
        return
    options = StateDictOptions(full_state_dict=True, cpu_offload=not every_rank)
    state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    if not every_rank and dist.get_rank() != 0:  # torch's CPU copy is rank 0's alone
        yield None
        return
    plain = copy.deepcopy(part)  # still on the meta device: no memory
    first_of = {id(p): n for n, p in reversed(list(plain.named_parameters(remove_duplicate=False)))}
    tied = [(n, first_of[id(p)]) for n, p in plain.named_parameters(remove_duplicate=False)]
    with torch.inference_mode(False):  # one rank: the state may be the shards a rollout made
        state = {k: v.clone() if v.is_inference() else v for k, v in state.items()}
    plain.load_state_dict(state, assign=True)
    for name, first in tied:
        if name != first:  # the state holds a tensor of each name: one parameter again
            _set(plain, name, plain.get_parameter(first))
    for name, buffer in model.named_buffers():  # rotary frequencies and the like: not in the state
        _set(plain, name, buffer if every_rank else buffer.cpu())
    yield plain


# each sharded root's plain copy on the meta device, made before it was sharded (`whole_copy`)
_META_COPIES: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def _meta_copy(module: nn.Module) -> nn.Module:
    """`module`'s structure on the meta device (a deep copy whose parameters and buffers are empty
    meta tensors: no memory; a parameter tied in two places is one in the copy as well)."""
    memo: dict[int, Any] = {}
    for tensor in (*module.parameters(), *module.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        is_param = isinstance(tensor, nn.Parameter)
        memo[id(tensor)] = nn.Parameter(meta, requires_grad=tensor.requires_grad) if is_param else meta
    return copy.deepcopy(module, memo)


def _meta_part(model: nn.Module) -> nn.Module | None:
    """The part of a sharded root's meta copy that stands where `model` stands in the root (None:
    `model` is in no sharded root)."""
    for root, meta in _META_COPIES.items():
        for name, module in root.named_modules():
            if module is model:
                return meta.get_submodule(name)
    return None


def _set(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Set the parameter or buffer `name` (dotted) of `module` to `value`."""
    owner, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(owner), leaf, value)


def _local_rows(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's dim-0 chunk of `full`, as fully_shard splits it (torch.chunk; empty past the end)."""
    chunks = torch.chunk(full, world_size, dim=0)
    return chunks[rank] if rank < len(chunks) else full[:0]


def global_norm(params: Sequence[torch.Tensor], peers: Peers) -> float:
    """The L2 norm of the gradients of every shard of `params` (DTensor parameters) over the ranks."""
    local = sum(float(cast(DTensor, p.grad).to_local().double().square().sum()) for p in params)
    return math.sqrt(peers.sum(local))
