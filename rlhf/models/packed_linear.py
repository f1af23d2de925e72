"""Sampling on a CPU with every linear layer reading a oneDNN-prepacked copy of its weight.

A decode step multiplies a few rows by every weight matrix of the model. torch's default CPU
GEMM (MKL) repacks the weight on every call, and once the model's weights no longer fit in the
L2 cache that repacking streams them slowly: [16, 256] x [256, 1024] takes ~240 us with the
weights in L3 against ~130 us in L2. oneDNN's linear with the weight reordered once into its
blocked layout (`torch.ops.mkldnn`, the ops torch's inductor uses for frozen CPU weights) takes
~120 us (bench/NOTES.md, session 5). The policy's weights change between PPO iterations, so
`generate` packs them per call; for that call the packed copies take about the linear weights'
size again (SmolLM2-135M: ~0.5 GB, packed in 0.3-0.8 s). Products differ from `F.linear` by
float rounding (~1e-6 relative), so a near-tie can sample another token.

Only plain float32 `nn.Linear` modules on the CPU are routed, through an instance `forward`
that is removed on exit (their weights are never touched: code reading `.weight` still sees the
original). A module with its own instance `forward` (accelerate's hooks), a subclass (quantized
layers, LoRA wrappers: their inner `base_layer` is a plain Linear and is routed) or a compiled
model is left alone. Each weight shape is checked once per process against `F.linear`; if the
ops are missing or a check fails, nothing is routed (with one warning).
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
# 0.042 s plain against 0.056 s packed, the small one (21 MB) 0.247 against 0.201 s (bench/NOTES.md).
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
            # 11-24 ms on the shared 2-core machine; equal on one thread; bench/NOTES.md, issue 37)
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
