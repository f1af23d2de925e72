"""Checkpoints of a supervised stage (`rlhf dpo --resume`): what the skeleton needs to go on after N
optimizer steps as if it had never stopped. `checkpoints/iter_N/` (layout, checksums, pruning and
damaged checkpoints as `rlhf train`'s, rlhf/rundir/checkpoint.py) holds `model.trained.safetensors`
(the trained parameters, a LoRA policy's adapters, with the frozen ones' fingerprint), or under
`fsdp2` every rank's DCP `shards/`; `trainer.{json,safetensors}` (steps done, AdamW moments and
schedule, every RNG state, the stage's own state: DPO's reference log-probs and a digest of the
pairs); `DONE` last. Either kind resumes at any rank count (rank 0 reads the whole state before the
model is sharded again). The data order is drawn from `seed` alone: a resume redraws and drops the
first N steps' batches.
"""

from __future__ import annotations

from pathlib import Path

from rlhf.rundir import checkpoint as ckpt
from rlhf.rundir.sharded_checkpoint import has_shards, load_learner_shards, write_shards_and_state
from rlhf.rundir.termination import finish_first
from rlhf.rundir.weights import load_trained, save_trained

MODEL = "model"
STATE = "trainer"


def checkpoint_path(run_dir: Path, steps_done: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"iter_{steps_done:06d}"


def save_supervised_checkpoint(run, steps_done: int, stage_state: dict, keep: int) -> Path:
    """Write the checkpoint after `steps_done` optimizer steps and prune to `keep`: the writer alone,
    or under fsdp2 every rank (each its shards)."""
    target = checkpoint_path(run.out, steps_done)
    state = {
        "step": steps_done,
        "learner": run.learner.state_dict(),  # fsdp2: without the moments (in the shards)
        "rng": ckpt.rng_state(),
        "stage": stage_state,
    }
    with finish_first():  # a Ctrl-C or SIGTERM waits for the write and the pruning
        if run.per_layer:
            write_shards_and_state({MODEL: run.learner}, run.peers, target, state, steps_done)
        else:
            with ckpt.atomic_directory(target) as tmp:
                save_trained(run.model, tmp, MODEL)
                ckpt.save_state(state, tmp, STATE)
                ckpt.write_done(tmp, steps_done)  # sizes and checksums: verified on resume
        if run.writer:
            ckpt.prune_checkpoints(run.out, keep)
    return target


def load_supervised_checkpoint(run, path: Path, weights: bool = True) -> dict:
    """Restore the trained parameters (`weights`: False on a sharded launch's ranks but 0, whose
    shards come from rank 0) and the optimizer and schedule of `run` from `path`, into the whole,
    not yet sharded model; the state (steps done, RNG states, the stage's state) for the caller."""
    if weights and has_shards(path):  # an fsdp2 run's: read whole here, from any number of ranks
        load_learner_shards({MODEL: run.learner}, path)
    elif weights:
        load_trained(run.model, path, MODEL)
    state = ckpt.load_state(Path(path), STATE)
    run.learner.load_state_dict(state["learner"])
    return state


def latest_checkpoint(run_dir: Path, warn) -> Path | None:
    """The newest complete checkpoint of `run_dir` (damaged newer ones skipped with `warn`)."""
    return ckpt.latest_verified(Path(run_dir), warn)
