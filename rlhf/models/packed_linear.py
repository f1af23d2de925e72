"""Sampling on a CPU with every linear layer reading a oneDNN-prepacked copy of its weight.

MKL repacks a weight at every call, which a decode step's few rows cannot amortize once the weights
leave the L2 cache; oneDNN's linear over a weight reordered once (`torch.ops.mkldnn`, as inductor
does for frozen CPU weights) does not (docs/speed.md, `runtime.pack_weights`). `generate` packs per
call (the weights change between PPO iterations); products differ from `F.linear` by float rounding.
Only plain float32 CPU `nn.Linear` modules are routed, through an instance `forward` removed on exit
(`.weight` untouched); subclasses, modules with their own instance `forward` and compiled models are
left alone. Each weight shape is checked once against `F.linear`; a failed check routes nothing.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

# Below this many bytes of linear weights a model stays in the per-core caches between decode steps,
# where MKL's call (no fixed ~15 us oneDNN overhead) is the faster one: a tiny model (0.8 MB) sampled
# 0.042 s plain against 0.056 s packed, the small one (21 MB) 0.247 against 0.201 s (python -m bench.speed.sampler).
MIN_PACKED_BYTES = 4 * 2**20

# Packing costs about two passes over the weights per call (small model: 10 ms; SmolLM2: 0.3-0.8 s)
# and saves 1.3 ms (small) to ~40 ms (SmolLM2) per decode step: it pays from ~8 to ~18 steps, so a
# sampler asked for fewer new tokens than this does not pack.
MIN_PACKED_NEW_TOKENS = 16

# (out_features, in_features, has_bias) whose packed product matched F.linear in this process
_checked_shapes: set[tuple[int, int, bool]] = set()
_disabled_reason: str | None = None


def packing_available() -> bool:
    """oneDNN's prepacked linear exists in this torch build (and no check has failed)."""
    if _disabled_reason is not None or not torch.backends.mkldnn.is_available():
        return False
    return hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(
        torch.ops.mkldnn, "_linear_pointwise"
    )


def packable(module: nn.Module) -> bool:
    """A plain float32 CPU `nn.Linear` without an instance `forward` of its own."""
    if type(module) is not nn.Linear or "forward" in module.__dict__:
        return False
    tensors = [module.weight] + ([module.bias] if module.bias is not None else [])
    return all(
        type(t) is nn.Parameter
        and t.device.type == "cpu"
        and t.dtype == torch.float32
        and t.layout == torch.strided
        for t in tensors
    )


class _PackedForward:
    """`module.forward` replacement: the product with a oneDNN-reordered copy of the weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.original = (weight, bias)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.bias = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_autocast_enabled("cpu"):
            return F.linear(x, *self.original)  # what a plain Linear would do (autocast casts its inputs)
        if x.numel() <= x.shape[-1]:
            # one row (a batch-1 decode step): MKL's matrix-vector product repacks nothing, and oneDNN's
            # one-row product is far slower on two threads (SmolLM2's 576x576: 0.12-0.35 ms against
            # 11-24 ms on a 2-core machine; equal on one thread; docs/speed.md)
            return F.linear(x, *self.original)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [None], "")


def _matches_f_linear(packed: _PackedForward, module: nn.Linear) -> bool:
    probe = torch.randn(3, module.in_features, generator=torch.Generator().manual_seed(0))
    want = F.linear(probe, module.weight.detach(), None if module.bias is None else module.bias.detach())
    got = packed(probe)
    tolerance = 1e-4 * float(want.abs().max()) + 1e-6
    return got.shape == want.shape and bool(((got - want).abs() <= tolerance).all())


def _disable(reason: str) -> None:
    global _disabled_reason
    _disabled_reason = reason
    warnings.warn(
        f"rlhf: packed linear weights for sampling are off for this process ({reason}); sampling uses "
        "F.linear (same results, slower on CPU).",
        RuntimeWarning,
        stacklevel=3,
    )


def _restore(modules: list[nn.Module]) -> None:
    for module in modules:
        module.__dict__.pop("forward", None)


def _route(modules: list[nn.Module]) -> list[nn.Module]:
    """Give each module a packed `forward`; on a failed pack or check, undo all and turn packing off."""
    routed: list[nn.Module] = []
    try:
        for module in modules:
            packed = _PackedForward(module.weight, module.bias)
            shape = (module.out_features, module.in_features, module.bias is not None)
            if shape not in _checked_shapes:
                if not _matches_f_linear(packed, module):
                    raise ValueError(
                        f"the packed product of a {tuple(module.weight.shape)} weight differs from F.linear"
                    )
                _checked_shapes.add(shape)
            module.forward = packed  # an instance attribute: nn.Module.__call__ (and its hooks) use it
            routed.append(module)
    except (RuntimeError, ValueError) as error:  # e.g. an op missing from this build's oneDNN
        _restore(routed)
        _disable(str(error).splitlines()[0] if str(error) else type(error).__name__)
        return []
    return routed


@contextlib.contextmanager
def packed_linears(model: nn.Module, enabled: bool = True) -> Iterator[int]:
    """Within the block, route `model`'s packable linear layers through prepacked weights; yields how
    many were routed: 0 when `enabled` is False, the ops are unavailable, `model` is compiled, or its
    packable weights total less than MIN_PACKED_BYTES. For inference only: the weights must not
    change inside the block (the packed copies would be stale)."""
    modules: list[nn.Module] = []
    if enabled and packing_available() and not hasattr(model, "_orig_mod"):
        modules = [m for m in model.modules() if packable(m)]
    if sum(m.weight.numel() * m.weight.element_size() for m in modules) < MIN_PACKED_BYTES:
        modules = []
    routed = _route(modules)
    try:
        yield len(routed)
    finally:
        _restore(routed)
