"""Every stage's export: Hugging Face directories written atomically into a run directory.

`models.export.export_copy` turns each model into what is saved (float32, LoRA merged, without
touching the model being trained); `checkpoint.atomic_export` builds the whole export in a
temporary directory and commits it with one rename before moving it into place, beside the run's
own files (metrics, config), which stay: a killed export leaves the previous one (or none), never a mix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from torch import nn

from rlhf.models.export import export_copy
from rlhf.rundir.checkpoint import atomic_export
from rlhf.rundir.directory import quiet_hf_saves


def export_models(
    directory: str | Path,
    tokenizer,
    models: dict[str, nn.Module],
    *,
    whole: Callable[[nn.Module], AbstractContextManager[nn.Module | None]] | None = None,
    write: bool = True,
) -> None:
    """Save each of `models` (`{subdirectory: model}`, "" for `directory` itself) with its
    `save_pretrained`, and the tokenizer into `directory`. Sharded (fsdp2): `whole(model)` gives a
    plain copy of one model with its whole parameters at a time, gathered by every rank (each calls
    this), rank 0's (`write` on rank 0 only)."""
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(atomic_export(Path(directory))) if write else None
        stack.enter_context(quiet_hf_saves())
        write_models(tmp, models, whole=whole)
        if write:
            tokenizer.save_pretrained(tmp)


def write_models(
    tmp: Path | None,
    models: dict[str, nn.Module],
    *,
    whole: Callable[[nn.Module], AbstractContextManager[nn.Module | None]] | None = None,
) -> None:
    """Each of `models` into `tmp` (an export under way; None: a rank that gathers but does not
    write), for `export_models` or a Ray actor writing its roles' part of one (rlhf/ray_runtime/)."""
    whole = whole or contextlib.nullcontext
    with quiet_hf_saves():
        for where, model in models.items():
            with whole(model) as plain:
                if tmp is not None:
                    assert plain is not None  # the writer is rank 0, which holds the copy
                    export_copy(plain).save_pretrained(Path(tmp) / where if where else tmp)
