"""The sampler's decode engines: how one step's forward reaches the decoder and its KV cache.
    eager       a `DynamicCache` grown by one column per step, the mask cut to the columns seen
    static      a `StaticCache` preallocated for the call, written in place: fixed shapes every step
    cuda_graph  static, the one-token step (decoder and head) captured once per call and replayed
    compiled    static, the one-token step compiled by `torch.compile` (and captured on CUDA), the
                cache's columns rounded up to `COLUMN_BUCKET` so prompt widths share one compile

`auto` picks per device, model, call length and repetition (`resolve_engine`); sliding-window and
static-cache-incapable models are steered or refused. The same tokens whatever the engine (compiled:
to float rounding); choices and figures: docs/speed.md "The sampler's decode engines".
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import sys
import time
import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn
from transformers import DynamicCache, StaticCache

from rlhf.models.backbone import unwrap_causal_lm

Engine = Literal["auto", "eager", "static", "cuda_graph", "compiled"]
ENGINES: tuple[str, ...] = ("auto", "eager", "static", "cuda_graph", "compiled")

# The engine `auto` picks on a CPU: measured fastest there (bench/speed/sampler.py, docs/speed.md).
AUTO_CPU_ENGINE = "eager"

# A graph pays for its capture (one warm-up step and the capture, about two eager steps) from a few
# replays on: calls with fewer decode forwards than this run the static engine uncaptured.
MIN_GRAPH_STEPS = 4

# The compiled engine's cache columns are rounded up to a multiple of this: one compile per (batch,
# bucket) rather than per prompt width (torch.compile specializes on shapes; dynamo recompiles at most
# `torch._dynamo.config.recompile_limit` times, 8 by default, after which a shape decodes uncompiled).
COLUMN_BUCKET = 64

# A compile takes about 40 s per (batch, column bucket) on an H200's host and saves about 2.6 ms a decode
# step at batch 64 (docs/speed.md): it pays over many long calls of one shape only. So `auto` compiles
# on CUDA a call of at least MIN_COMPILE_FORWARDS decode forwards whose model and shape it has sampled
# COMPILE_AFTER_CALLS times before in this process (an RL rollout from its third iteration on); the
# calls before, and short or one-off ones (`rlhf eval`, a run's sample log), take the graph.
MIN_COMPILE_FORWARDS = 32
COMPILE_AFTER_CALLS = 2

# `auto`'s long CUDA calls so far, per (model, rows, column bucket)
_auto_calls: collections.Counter[tuple[int, int, int]] = collections.Counter()
# Set when a compile `auto` chose failed in this process: `auto` takes the graph from then on.
_auto_compile_failed = False


def auto_compiles(model: nn.Module, rows: int, columns: int, decode_forwards: int) -> bool:
    """Whether `auto` compiles this CUDA call's decode step (`rows` x `columns` of prompt + new
    tokens, `decode_forwards` one-token forwards), counting the call: a long call of a shape sampled
    COMPILE_AFTER_CALLS times before, inductor's GPU backend (triton) installed, no compile failed."""
    if (
        decode_forwards < MIN_COMPILE_FORWARDS
        or _auto_compile_failed
        or importlib.util.find_spec("triton") is None
    ):
        return False
    shape = (id(model), rows, -(-columns // COLUMN_BUCKET))
    _auto_calls[shape] += 1
    return _auto_calls[shape] > COMPILE_AFTER_CALLS


def is_fsdp_sharded(model: nn.Module) -> bool:
    """True when a module of `model` is an FSDP2 unit (its forward hooks gather and free parameters)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


def static_cache_capable(model: nn.Module) -> bool:
    """Whether transformers says `model` works with a static cache under torch.compile (its class's
    `_can_compile_fullgraph`; a decoder from outside transformers is assumed to)."""
    return bool(getattr(type(unwrap_causal_lm(model)), "_can_compile_fullgraph", True))


def sliding_windows(model: nn.Module, columns: int) -> tuple[bool, int | None]:
    """(whether `model`'s static cache has sliding-window layers, the shortest window when it is
    shorter than `columns`, so that it fills within a call of that many columns; else None). Read
    from the cache transformers builds for the model's config (built lazily: nothing allocated)."""
    config = getattr(model, "config", None)
    if config is None:
        return False, None
    try:
        cache = StaticCache(config=config, max_cache_len=max(1, columns))
    except (TypeError, ValueError, AttributeError):  # not a transformers config: no static cache to read
        return False, None
    sliding = [layer for layer in getattr(cache, "layers", ()) if getattr(layer, "is_sliding", False)]
    windows = [getattr(layer, "max_cache_len", columns) for layer in sliding]
    shortest = min(windows, default=columns)
    return bool(sliding), (shortest if shortest < columns else None)


def resolve_engine(
    engine: str,
    device: torch.device,
    model: nn.Module,
    lockstep: bool,
    shape: tuple[int, int, int] = (0, 0, 0),
) -> str:
    """The engine that runs: `engine`, or for `auto` the fastest that works on `device` for `model`
    and a call of `shape` (rows, columns, decode forwards: `auto_compiles`). An engine asked for where
    it cannot run is an error naming the fix."""
    if engine not in ENGINES:
        raise ValueError(f"sampling engine {engine!r} is not one of {', '.join(ENGINES)}.")
    capable = static_cache_capable(model)
    collectives = lockstep or is_fsdp_sharded(model)  # per-layer collectives in every step
    graphable = device.type == "cuda" and not collectives and capable
    needs_static_cache = engine in ("cuda_graph", "compiled") or (engine == "auto" and graphable)
    sliding, fills = sliding_windows(model, shape[1]) if capable and needs_static_cache else (False, None)
    if engine == "auto":
        if not capable:
            return "eager"
        if device.type != "cuda":
            return AUTO_CPU_ENGINE if device.type == "cpu" else "eager"
        if not graphable or fills is not None:
            return "static"
        return "compiled" if not sliding and auto_compiles(model, *shape) else "cuda_graph"
    why = _why_not(engine, device, model, capable, collectives, sliding, fills, shape[1])
    if why is not None:
        reason, fix = why
        raise ValueError(
            f"rollout.engine {engine} cannot run here: {reason}. Fix: --rollout.engine {fix} (or auto)."
        )
    return engine


def _why_not(
    engine: str,
    device: torch.device,
    model: nn.Module,
    capable: bool,
    collectives: bool,
    sliding: bool,
    fills: int | None,
    columns: int,
) -> tuple[str, str] | None:
    """(why `engine` cannot run, the engine to take instead), or None when it can."""
    if engine not in ("cuda_graph", "compiled"):
        return None
    if not capable:
        name = type(unwrap_causal_lm(model)).__name__
        return (f"transformers marks {name} as unable to run a static KV cache under torch.compile "
                "(_can_compile_fullgraph is False), which the step replays", "eager")  # fmt: skip
    if collectives:
        return ("the policy is sharded by FSDP2 or decodes in lockstep with other ranks (their per-layer "
                "collectives cannot be replayed from a graph or compiled into the step)", "static")  # fmt: skip
    if engine == "compiled" and sliding:
        return ("the model has sliding-window attention, whose static cache counts its positions in Python, "
                "so torch.compile would recompile the step at every token", "cuda_graph on a GPU, static elsewhere")  # fmt: skip
    if engine == "cuda_graph" and device.type != "cuda":
        return f"the model is on {device}, not a CUDA GPU", "static"
    if engine == "cuda_graph" and fills is not None:
        return (f"the model's sliding window ({fills} positions) is shorter than a call's prompt + new tokens "
                f"({columns}); once it fills, its cache moves by Python decisions that a replayed graph would "
                "not make", "static")  # fmt: skip
    return None


class EagerSteps:
    """Decode steps over a `DynamicCache`: the attention mask of each step is its seen columns."""

    can_drop_rows = True

    def __init__(self, decoder: nn.Module, head: Callable, keyword: str, length: int, decode_forwards: int):
        """`length`: prompt + new tokens (the cache's columns); `decode_forwards`: the one-token
        forwards the call runs at most (max_new_tokens - 1)."""
        self.decoder, self.head = decoder, head
        self.columns = self.cache_columns(length)  # the mask's and the cache's width
        self.cache = self.make_cache(decoder, self.columns)
        self.with_cache = {keyword: self.cache, "use_cache": True}

    def cache_columns(self, length: int) -> int:
        return length

    def make_cache(self, decoder: nn.Module, length: int):
        return DynamicCache(config=decoder.config)

    def step_mask(self, mask: torch.Tensor, active: torch.Tensor, seen: int) -> torch.Tensor:
        """The attention mask of a forward over `seen` columns, for the rows in the decoder's batch."""
        return mask[active, :seen] if len(active) < mask.shape[0] else mask[:, :seen]

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, V] at the last column of `ids`."""
        hidden = self.decoder(input_ids=ids, attention_mask=mask, position_ids=positions, **self.with_cache)[
            0
        ]
        return self.head(hidden[:, -1])

    def prefill(self, prompt_ids, mask, active, positions) -> torch.Tensor:
        return self.forward(prompt_ids, self.step_mask(mask, active, prompt_ids.shape[1]), positions)

    def step(self, chosen, mask, active, seen, positions) -> torch.Tensor:
        return self.forward(chosen.unsqueeze(1), self.step_mask(mask, active, seen), positions)

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Narrow the cache to the batch rows `keep` (the finished rows leave)."""
        self.cache.reorder_cache(keep)


class OneDtypeStaticCache(StaticCache):
    """A `StaticCache` whose keys and values are written in one dtype. Under bf16 autocast over
    float32 weights the values leave their projection in bf16 while RoPE leaves the keys in float32;
    some transformers versions allocate both buffers in the keys' dtype, so `index_copy_` refuses the
    values. Both are promoted (exactly) to their common dtype, and
    attention casts them back under autocast as it does the eager cache's."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if key_states.dtype != value_states.dtype:
            common = torch.promote_types(key_states.dtype, value_states.dtype)
            key_states, value_states = key_states.to(common), value_states.to(common)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class StaticSteps(EagerSteps):
    """Decode steps over a `StaticCache` of `length` columns: the same shapes at every step, the
    attention mask always the whole block (unwritten columns are 0 there)."""

    def make_cache(self, decoder: nn.Module, length: int):
        return OneDtypeStaticCache(config=decoder.config, max_cache_len=length)

    def step_mask(self, mask: torch.Tensor, active: torch.Tensor, seen: int) -> torch.Tensor:
        return mask[active] if len(active) < mask.shape[0] else mask


class CudaGraphSteps(StaticSteps):
    """Static steps with the decode forward captured as a CUDA graph at the second step (the first
    runs eagerly on a side stream: the warm-up a capture needs) and replayed after: the step's token
    ids and positions are copied into the graph's input buffers, the mask is read in place."""

    can_drop_rows = False

    def __init__(self, decoder, head, keyword, length, decode_forwards):
        super().__init__(decoder, head, keyword, length, decode_forwards)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.decode_steps = 0
        self.capture = decode_forwards >= MIN_GRAPH_STEPS  # few steps: the capture would not pay
        self.ids = self.positions = self.logits = None

    def step(self, chosen, mask, active, seen, positions) -> torch.Tensor:
        self.decode_steps += 1
        if not self.capture:
            return super().step(chosen, mask, active, seen, positions)
        if self.graph is None:
            self.ids = chosen.unsqueeze(1).clone()
            self.positions = positions.clone()
            if self.decode_steps == 1:  # warm-up: allocator, cuBLAS handles and the cache's lazy state
                return self._on_side_stream(lambda: self.forward(self.ids, mask, self.positions))
            self._capture(mask)
        else:
            self.ids.copy_(chosen.unsqueeze(1))
            self.positions.copy_(positions)
        self.graph.replay()
        return self.logits

    def _on_side_stream(self, fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), _no_autocast_cache():
            out = fn()
        torch.cuda.current_stream().wait_stream(side)
        out.record_stream(torch.cuda.current_stream())  # made on the side stream, read on this one
        return out

    def _capture(self, mask: torch.Tensor) -> None:
        """Record one decode forward (not run: `replay` runs it) reading `mask` in place."""
        graph = torch.cuda.CUDAGraph()
        with _no_autocast_cache(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.logits = self.forward(self.ids, mask, self.positions)
        self.graph = graph


class CompiledSteps(CudaGraphSteps):
    """Static steps whose one-token forward runs the decoder compiled by `torch.compile` (inductor,
    shapes specialized: one compile per batch and column bucket, reused by later calls), on CUDA
    captured as a CUDA graph per call as `CudaGraphSteps` does (the compile happens in the warm-up
    step, before the capture). The prefill runs uncompiled (its width changes with every batch).
    The tokens are the static engine's to float rounding: the fused kernels round differently."""

    # (decoder, batch, columns, dtype) a step was compiled for in this process: a new one is announced
    compiled_shapes: set[tuple] = set()

    def __init__(self, decoder, head, keyword, length, decode_forwards, fall_back: bool = False):
        """`fall_back`: `auto` chose this engine, so a compile that fails here decodes uncompiled
        (the graph engine's step) with a warning instead of stopping the run."""
        super().__init__(decoder, head, keyword, length, decode_forwards)
        on_cuda = next(decoder.parameters()).device.type == "cuda"
        self.capture = self.capture and on_cuda
        self.fall_back = fall_back
        self.compiling = True  # False once the step decodes uncompiled (a failed compile, dynamo's limit)

    def cache_columns(self, length: int) -> int:
        return -(-length // COLUMN_BUCKET) * COLUMN_BUCKET

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        global _auto_compile_failed
        if ids.shape[1] != 1 or not self.compiling:  # the prefill, or a step decoding uncompiled
            return super().forward(ids, mask, positions)
        shape = (id(self.decoder), *mask.shape, next(self.decoder.parameters()).dtype)
        new_shape = shape not in CompiledSteps.compiled_shapes
        if new_shape:  # dynamo compiles on this call: tens of seconds the user should not wonder about
            rows, columns = mask.shape
            print(f"compiling the decode step for {rows} rows x {columns} columns (torch.compile, once "
                  "per shape) ...", file=sys.stderr, flush=True)  # fmt: skip
            start = time.monotonic()
        try:
            with _recompile_limit_raises():
                hidden = compiled_decode_step()(self.decoder, ids, mask, positions, self.with_cache)
        except RECOMPILE_LIMIT_HIT:  # this process compiled the step for as many shapes as dynamo allows
            return self._uncompiled_after(
                "torch.compile reached its recompile limit for the decode step (torch._dynamo.config."
                "recompile_limit shapes in this process): this shape decodes uncompiled, as the cuda_graph "
                "engine does. Fix: fewer distinct shapes (a fixed rollout.batch_size), or a higher limit.",
                ids, mask, positions,
            )  # fmt: skip
        except torch._dynamo.exc.TorchDynamoException as error:  # the compile itself failed here
            cause = getattr(error, "inner_exception", None) or error  # the compiler's own error
            first = (str(cause).strip().splitlines() or [""])[0][:300]
            if self.fall_back:  # `auto` chose the compile: a warning, and `auto` stops choosing it
                _auto_compile_failed = True
                return self._uncompiled_after(
                    f"rollout.engine auto: torch.compile failed on this machine ({type(cause).__name__}: "
                    f"{first}); decoding with the cuda_graph engine instead (2.2x slower on an H200). Set "
                    "--rollout.engine cuda_graph to skip the attempt, or make torch.compile work here "
                    "(triton on a GPU).",
                    ids, mask, positions,
                )  # fmt: skip
            raise ValueError(
                f"rollout.engine compiled could not compile the decode step on this machine "
                f"({type(cause).__name__}: {first}). Fix: --rollout.engine static (or auto), or make "
                "torch.compile work here (inductor needs a C++ compiler on a CPU, triton on a GPU)."
            ) from None
        if new_shape:
            CompiledSteps.compiled_shapes.add(shape)
            print(f"compiled the decode step ({time.monotonic() - start:.1f} s)", file=sys.stderr, flush=True)
        return self.head(hidden)

    def _uncompiled_after(self, warning: str, ids, mask, positions) -> torch.Tensor:
        """`warning`, then this step and the call's later ones uncompiled (the graph engine's step)."""
        self.compiling = False
        warnings.warn(warning, stacklevel=3)
        return super().forward(ids, mask, positions)


# Raised by dynamo at its recompile limit when `fail_on_recompile_limit_hit` is set (else it would run the
# step uncompiled without a word, while the engine announced a compile); absent from older torch.
_LIMIT_HIT = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None)
RECOMPILE_LIMIT_HIT: tuple[type[BaseException], ...] = (_LIMIT_HIT,) if _LIMIT_HIT is not None else ()


def _recompile_limit_raises() -> contextlib.AbstractContextManager:
    """Dynamo raises RECOMPILE_LIMIT_HIT at its recompile limit inside this block (where it can)."""
    if RECOMPILE_LIMIT_HIT and hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        return torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
    return contextlib.nullcontext()


def _decode_step(decoder: nn.Module, ids, mask, positions, with_cache: dict) -> torch.Tensor:
    """The last hidden state [B, H] of one decode forward (what `compiled_decode_step` compiles)."""
    return decoder(input_ids=ids, attention_mask=mask, position_ids=positions, **with_cache)[0][:, -1]


@functools.cache
def compiled_decode_step() -> Callable:
    """`_decode_step` under `torch.compile` (one wrapper for the process: dynamo keeps its compiled
    code per decoder and shape, guarded)."""
    return torch.compile(_decode_step, dynamic=False)


def _no_autocast_cache():
    """Autocast as the caller set it, without its cache of cast weights: a captured graph must cast
    the weights itself (a cached copy made before the capture could be freed under the graph)."""
    if not torch.is_autocast_enabled("cuda"):
        return torch.autocast("cuda", enabled=False)
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)


ENGINE_STEPS = {
    "eager": EagerSteps,
    "static": StaticSteps,
    "cuda_graph": CudaGraphSteps,
    "compiled": CompiledSteps,
}


def engine_steps(
    engine: str,
    decoder: nn.Module,
    head: Callable,
    keyword: str,
    length: int,
    decode_forwards: int,
    auto: bool,
) -> EagerSteps:
    """The steps of the resolved `engine` for one call; `auto`: the user left the choice to `auto`
    (a compile it chose falls back on failure rather than stopping the run)."""
    if engine == "compiled":
        return CompiledSteps(decoder, head, keyword, length, decode_forwards, fall_back=auto)
    return ENGINE_STEPS[engine](decoder, head, keyword, length, decode_forwards)
