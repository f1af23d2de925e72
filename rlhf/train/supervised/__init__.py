"""One skeleton for every supervised stage (`rlhf sft`, `rlhf rm`, `rlhf dpo`): setup, data, the
optimizer steps through the same `Learner` the RL roles use (rlhf/train/learner.py: data-parallel and
sharded training written once), the evaluation cadence, and the finish (export, report, summary).
A stage says only what differs, by subclassing `SupervisedStage`; `run_supervised` runs it.
Beside the skeleton: checkpoint.py (a resumable stage's checkpoints) and model_call.py (the one call
every forward goes through).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import nn

from rlhf.config import ConfigError
from rlhf.data.examples import Example
from rlhf.data.length_grouping import length_grouped_order
from rlhf.data.loading import load_examples, split_examples
from rlhf.data.tokenize import TruncationStats
from rlhf.models.backbone import model_context
from rlhf.models.device import resolve_device
from rlhf.models.grad_checkpointing import gradient_checkpointing
from rlhf.models.precision import Precision, cast_parameters
from rlhf.monitor import MetricsLogger, print_summary
from rlhf.monitor.progress import announce
from rlhf.parallel.parallel_plan import ParallelPlan
from rlhf.parallel.peers import Peers, current_peers
from rlhf.rundir import checkpoint as ckpt
from rlhf.rundir.directory import SilentLogger, open_metrics_logger
from rlhf.rundir.export import export_models
from rlhf.rundir.final_report import write_final_report
from rlhf.rundir.footprint import footprint_line
from rlhf.train.context_check import check_rows_fit
from rlhf.train.guards import SkippedStepStreak, loss_scale_fix
from rlhf.train.learner import Learner
from rlhf.train.micro_batches import MicroBatching
from rlhf.train.optimizer import Optimizer
from rlhf.train.setup import start_run, with_compile, with_packing
from rlhf.train.supervised.checkpoint import (
    latest_checkpoint,
    load_supervised_checkpoint,
    save_supervised_checkpoint,
)
from rlhf.train.supervised.model_call import ModelCall


@dataclass
class SupervisedRun:
    """What the stage's hooks may read: the run directory, tokenizer, model and its learner, and
    the process's place in a torchrun launch."""

    out: Path
    tokenizer: Any  # a Hugging Face tokenizer
    model: nn.Module
    learner: Learner
    precision: Precision
    peers: Peers | None  # torchrun: this rank's share of every batch (rlhf/parallel/peers.py)
    writer: bool  # rank 0 (or the only process) writes the run directory

    @property
    def pad_id(self) -> int:
        pad_id: int = self.tokenizer.pad_token_id
        return pad_id

    @property
    def call(self) -> nn.Module:
        """The model's one call, `call(fn, *args)` = fn(model, *args): what every forward of a
        sharded model goes through (rlhf/train/supervised/model_call.py); under ddp its DistributedDataParallel
        wrapper (whose backward reduces the gradients, rlhf/parallel/replicated.py)."""
        return self.learner.call

    @property
    def per_layer(self) -> bool:
        """fsdp2: sharded per layer, every rank runs as many forwards and backwards (rlhf/train/learner.py)."""
        return self.learner.per_layer


class SupervisedStage:
    """What one supervised stage adds to the skeleton:

    build_model      the model to train (loaded from `config.model` unless one is given; on the meta
                     device when `on_meta`: a sharded launch's ranks but 0, filled from rank 0)
    encode           examples -> the stage's rows
    positions        the positions one forward of a row computes: checked against the model's
                     context, and what the micro-batches are cut by
    schedule         the number of optimizer steps and each step's row indices (a CPU generator: the
                     same data order on every device and rank count); by default `train.epochs` or
                     `train.max_steps` of shuffled `train.batch_size` batches
    train_step       one optimizer step on a step's rows (`run.learner.step` with the stage's loss)
    evaluate         held-out metrics (logged under eval/); `step` None: before the first update
    finish           export the trained model (every rank joins the gathers, rank 0 writes)

    and, when it needs them, `before_training` (once). A `resumable` stage (DPO) saves a checkpoint
    every `checkpoint.every` steps and continues from the newest with `resume=True`; its own state
    beyond model, optimizer, schedule and RNGs goes through `checkpoint_state` / `restore_state`."""

    title = ""  # the summary's heading: "SFT", "Reward model"
    command = ""  # the progress display's name: "sft", "rm", "dpo"
    data_kind = ""  # the rows `load_examples` reads: "sft" | "preference"
    key_metrics: tuple[str, ...] = ()  # shown in the progress line
    baseline_eval = False  # evaluate the held-out rows before the first update (step 0's record)
    resumable = False  # checkpoints every `config.checkpoint.every` steps; `resume=True` continues
    uses_every_parameter = False  # every training pass reaches every trained parameter (ddp: no unused walk)

    def __init__(self, config: Any) -> None:  # the stage's config (rlhf/config)
        self.config = config

    def build_model(self, model: nn.Module | None, precision: Precision, on_meta: bool = False) -> nn.Module:
        raise NotImplementedError

    def encode(self, tokenizer: Any, examples: list[Example], stats: TruncationStats) -> list[Any]:
        raise NotImplementedError

    def positions(self, row: Any) -> int:
        """The positions one forward of `row` computes (its prompt and its longest response)."""
        raise NotImplementedError

    def schedule(self, rows: list[Any], generator: torch.Generator) -> tuple[int, Iterator[list[int]]]:
        """`train.max_steps`, or the steps of `train.epochs` over the rows, of `train.batch_size` rows
        each, reshuffled every epoch (`train.group_by_length across_steps`: of similar length)."""
        t = self.config.train
        steps = steps_of_epochs(t.epochs, len(rows), t.batch_size, t.max_steps)
        lengths = [self.positions(r) for r in rows]
        return steps, shuffled_step_batches(steps, t.batch_size, lengths, t.group_by_length, generator)

    def before_training(
        self, run: SupervisedRun, train_rows: list[Any], test_rows: list[Any], status: Callable[[str], None]
    ) -> None:
        """Once, after the rows are read and before the first step (DPO caches its reference
        log-probs here); `status(what)` tells the progress display what it is doing."""

    def train_step(self, run: SupervisedRun, rows: list[Any]) -> dict[str, Any]:
        """One optimizer step on `rows` (`run.learner.step`): its metrics, the step's own among them
        (`rlhf.train.optimizer.step_metrics("train", ...)`)."""
        raise NotImplementedError

    def evaluate(self, run: SupervisedRun, rows: list[Any], step: int | None = None) -> dict[str, Any]:
        """Held-out metrics after optimizer step `step` (None: before the first update)."""
        raise NotImplementedError

    def checkpoint_state(self, train_rows: list[Any], test_rows: list[Any]) -> dict[str, Any]:
        """What a checkpoint stores of the stage beyond the model, optimizer, schedule and RNGs (a
        nested dict of numbers, strings and tensors)."""
        return {}

    def restore_state(self, state: dict[str, Any], train_rows: list[Any], test_rows: list[Any]) -> None:
        """Put `checkpoint_state`'s dict back, on a resumed run, before `before_training`."""

    def finish(self, run: SupervisedRun, final: dict[str, Any], stats: TruncationStats) -> dict[str, Any]:
        """The final metrics with the data's truncation counts; the trained causal LM exported (the
        reward model saves its best checkpoint instead)."""
        final.update({f"data/{k}": v for k, v in stats.as_dict().items()})
        export_causal_lm(run)  # float32, LoRA merged (a copy), whatever the training used
        return final


class StageInputs(TypedDict, total=False):
    """What a stage's entry point (`run_sft`, `run_reward_training`, `run_dpo`) passes on to
    `run_supervised`: a model and tokenizer given in code, rows in place of the data file's, quiet
    output, a resume (a `resumable` stage)."""

    model: nn.Module | None
    tokenizer: Any
    train_rows: list[Any] | None
    test_rows: list[Any] | None
    quiet: bool
    resume: bool


def run_supervised(
    stage: SupervisedStage,
    *,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    train_rows: list[Any] | None = None,
    test_rows: list[Any] | None = None,
    quiet: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Train, evaluate and export `stage` into `stage.config.out`; the final metrics.

    `train_rows` / `test_rows` replace the rows read from `config.data.path` (given test rows are
    used as they are; without train rows the file is read and split by `data.test_fraction`).
    `resume` (a `resumable` stage): continue the run in `config.out` from its newest checkpoint; the
    model given or loaded is the one the run started from (`config.model`).

        run_dir, tokenizer <- start_run; model <- build_model; rows <- load, split, encode
        learner <- Learner(ModelCall(model), Optimizer, MicroBatching, ParallelPlan)   [ddp: replicated]
        [resume: the newest checkpoint's weights, optimizer, schedule, stage state; its N steps'
         batches drawn and dropped; its RNG states; metrics.jsonl cut after step N - 1]
        [fsdp2: sharded per layer from rank 0's state; dist.offload: in CPU memory]
        [evaluate before the first update: step 0's eval/ record]
        for each step: train_step, log; evaluate every train.eval_every steps and at the last;
                       [a checkpoint every checkpoint.every steps]
        [fsdp2: AdamW's moments freed]; finish, report.html, the one-screen summary
    """
    config = stage.config
    device = resolve_device(config.train.device, key="train.device")
    precision = Precision.resolve(config.dtype, device, key="dtype")
    peers = current_peers()
    writer = peers is None or peers.rank == 0
    _refuse_unsupported(stage, resume)
    out, tokenizer = start_run(config, tokenizer, writer=writer, resume=resume, resumable=stage.resumable)
    sharded = peers is not None and config.dist.strategy == "fsdp2"
    # fsdp2: ranks but 0 build the structure alone; every rank's shards come from rank 0's model
    on_meta = sharded and not writer and model is None
    with _shown(writer and model is None, f"loading the model {config.model}"):  # a sign of life
        model = stage.build_model(model, precision, on_meta)
    reference = getattr(getattr(stage, "reference", None), "model", None)  # DPO's frozen copy
    with_packing(config.train.packing, model, reference)  # every forward packed (train.packing)
    with_compile(config.train.compile, config.train.compile_backend, device, model)  # training forwards
    if config.gradient_checkpointing:
        gradient_checkpointing(model)
    stats = TruncationStats()
    if train_rows is None:
        train_rows, test_rows = _read_rows(stage, tokenizer, model, stats, test_rows)
    test_rows = test_rows or []
    if not train_rows:
        what = "SFT examples" if stage.data_kind == "sft" else "preference pairs"
        raise ValueError(f"no training {what}: the data left nothing to train on. Fix: check data.path.")
    generator = torch.Generator().manual_seed(config.seed)  # data order: on the CPU, the same everywhere
    steps, batches = stage.schedule(train_rows, generator)
    learner = _learner(stage, model, steps, peers, precision)
    run = SupervisedRun(out, tokenizer, model, learner, precision, peers, writer)
    done, resumed_rng = _resume(run, stage, batches, train_rows, test_rows) if resume else (0, None)
    if sharded:  # after a resume loaded the whole state (on rank 0): every rank's shards from rank 0's
        learner.shard()
    logger = open_metrics_logger(
        out,
        resumable=stage.resumable,
        sinks=tuple(config.sinks),  # `quiet` only drops the final summary table
        total=steps,
        indexed=True,  # step i of metrics.jsonl is the (i+1)-th update: `step i+1/N` on the console
        run_name=stage.command or None,
        key_metrics=stage.key_metrics,
        writer=writer,
        **({"resume": True, "resume_step": done - 1} if resume else {}),
    )
    stage.before_training(run, train_rows, test_rows, lambda what: logger.status(what, done, "step"))
    if resume:  # after the stage's own setup, which may draw numbers (none of DPO's does)
        assert resumed_rng is not None  # the checkpoint's (`_resume`)
        ckpt.set_rng_state(resumed_rng)
    with logger:
        if test_rows and stage.baseline_eval and not resume:  # held-out figures before any update
            logger.status("evaluating before training", 0, "step")
            before = stage.evaluate(run, test_rows, step=None)
            logger.log(0, {f"eval/{k}": v for k, v in before.items()}, kind="step", done=0)
        final = _train_steps(
            run,
            stage,
            logger,
            zip(range(done, steps), batches),
            steps,
            train_rows,
            test_rows,
            truncation_metrics(stats),
        )
    model.eval()
    if learner.sharded is not None:  # the export gathers whole weights: without AdamW's moments beside
        learner.release_optimizer_state()
    with _shown(writer, f"writing the trained model to {out}"):
        final = stage.finish(run, final, stats)
    if writer:  # rank 0 exports, reports and prints
        _report(stage, out, final, quiet)
    return final


def _learner(
    stage: SupervisedStage, model: nn.Module, steps: int, peers: Peers | None, precision: Precision
) -> Learner:
    """The model's learner: AdamW over `steps`, the run's data-parallel strategy, the stage's micro-batches."""
    c = stage.config
    call = ModelCall(model)  # the one call every forward goes through (rlhf/train/supervised/model_call.py)
    batching = MicroBatching(
        c.train.micro_batch_size,
        by_length=c.train.group_by_length != "none",  # micro-batches of rows of similar length
        micro_batch_tokens=c.train.micro_batch_tokens,  # or cut by a token budget
        packing=c.train.packing,  # micro-batches cut for packed forwards
    )
    plan = None
    if peers is not None:
        plan = ParallelPlan(peers, c.dist.strategy, precision.uses_autocast, c.dist.offload)
    optimizer = Optimizer(call.parameters(), c.optim, steps)
    return Learner(call, optimizer, batching, plan, uses_every_parameter=stage.uses_every_parameter)


def truncation_metrics(stats: TruncationStats) -> dict[str, float | None]:
    """The prompts that lost turns or tokens to the budget, as metrics (docs/usage.md, Chat models)."""
    if not stats.prompts:
        return {}
    return {
        "data/prompts": stats.prompts,
        "data/prompts_truncated": stats.prompts_truncated,
        "data/prompts_truncated_share": stats.prompts_truncated_share,
    }


def _refuse_unsupported(stage: SupervisedStage, resume: bool) -> None:
    """Settings this stage cannot honour: a resume of a stage without checkpoints, and the rollout's
    gathering (no rollout here: the setting would do nothing)."""
    config = stage.config
    if resume and not stage.resumable:
        raise ConfigError(f"`{stage.title}` runs cannot resume. Fix: start a new run (another --out).")
    if config.dist.rollout_gather != "whole":
        raise ConfigError(
            f"dist.rollout_gather is {config.dist.rollout_gather}, but `{stage.title}` samples no rollout "
            "(only `rlhf train` does). Fix: drop --dist.rollout_gather.",
            "dist.rollout_gather",
        )


def _report(stage: SupervisedStage, out: Path, final: dict[str, Any], quiet: bool) -> None:
    """report.html, and unless `quiet` the summary table, the directory's size line and the report's path."""
    report = write_final_report(out)
    if quiet:
        return
    shown = {k: v for k, v in final.items() if not isinstance(v, list)}
    print_summary(f"{stage.title} finished: {out}", shown)
    keep = stage.config.checkpoint.keep if stage.resumable else 0
    print(footprint_line(out, keep))  # what the directory keeps, and why (as `rlhf train`)
    print(f"report: {report}")  # a line of its own: the table would cut a long path


def _shown(show: bool, what: str) -> contextlib.AbstractContextManager[None]:
    """`announce(what)` (`what ...`, then `what: done (1.2 s)`) when `show`, else nothing."""
    return announce(what) if show else contextlib.nullcontext()


def _read_rows(
    stage: SupervisedStage,
    tokenizer: Any,
    model: nn.Module,
    stats: TruncationStats,
    test_rows: list[Any] | None,
) -> tuple[list[Any], list[Any]]:
    """(train rows, test rows) from `config.data.path`, split by `data.test_fraction` (given test
    rows kept as they are), encoded, every row checked against the model's positions."""
    d, seed = stage.config.data, stage.config.seed
    loaded = load_examples(d.path, kind=stage.data_kind, format=d.format, skip_invalid=d.skip_invalid)
    train_ex, test_ex = split_examples(loaded.examples, d.test_fraction, seed=seed)
    train_rows = stage.encode(tokenizer, train_ex, stats)
    read = list(zip(train_ex, train_rows))
    if test_rows is None:
        test_rows = stage.encode(tokenizer, test_ex, stats)
        read += zip(test_ex, test_rows)
    _check_rows_fit(stage, model, read)
    return train_rows, test_rows


def _train_steps(
    run: SupervisedRun,
    stage: SupervisedStage,
    logger: MetricsLogger | SilentLogger,
    numbered_batches: Iterable[tuple[int, list[int]]],
    steps: int,
    train_rows: list[Any],
    test_rows: list[Any],
    data_metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The optimizer steps of `numbered_batches` ((step, row indices) pairs), evaluated every
    `train.eval_every` steps and at the last, logged every `train.log_every`, a checkpoint every
    `checkpoint.every` (a resumable stage); the last step's metrics, which hold `data_metrics`
    too (what the prompt budget cost the data: in metrics.jsonl once)."""
    config, learner = stage.config, run.learner
    t = config.train
    every = config.checkpoint.every if stage.resumable else 0
    skipped = SkippedStepStreak(patience=3, unit="steps")  # every step skipped: the run stops, naming why
    final: dict[str, Any] = {}
    for step, indices in numbered_batches:
        logger.status("training", step, "step")  # the first step, and a long one, say so
        run.call.train()
        metrics = stage.train_step(run, [train_rows[i] for i in indices])
        if metrics["train/skipped_step_fraction"]:  # NaN/inf gradients: the weights stay as they were
            logger.warn(
                f"step {step}: the gradients were NaN or infinite; the step was skipped",
                step=step,
                kind="step",
            )
        skipped.update("model", metrics["train/skipped_step_fraction"], step, loss_scale_fix(config))
        metrics["train/lr"] = learner.lr
        last = step == steps - 1
        if last and data_metrics:
            metrics.update(data_metrics)
        if test_rows and (last or (t.eval_every and (step + 1) % t.eval_every == 0)):
            logger.status("evaluating", step, "step")
            result = stage.evaluate(run, test_rows, step)
            metrics.update({f"eval/{k}": v for k, v in result.items()})
        if last or step % t.log_every == 0 or any(k.startswith("eval/") for k in metrics):
            logger.log(step, metrics, kind="step")
        final = metrics
        if every and (step + 1) % every == 0 and not last and (run.writer or run.per_layer):
            # ddp: every rank holds the same state, rank 0 writes it; fsdp2: every rank its shards
            save_supervised_checkpoint(
                run, step + 1, stage.checkpoint_state(train_rows, test_rows), config.checkpoint.keep
            )
    return final


def placed(precision: Precision, model: nn.Module) -> nn.Module:
    """`precision.prepare(model)` (cast, on the run's device); a model built on the meta device
    (`on_meta`) stays there, filled from rank 0 when sharded (rlhf/parallel/fsdp.py)."""
    on_meta = any(p.is_meta for p in model.parameters())
    return precision.prepare(model, torch.device("meta") if on_meta else None)


def _check_rows_fit(stage: SupervisedStage, model: nn.Module, read: list[tuple[Example, Any]]) -> None:
    """Refuse, before the first step, rows longer than the model's positions (an IndexError mid-run
    on GPT-2's position table; on rotary models, silent training on untrained positions).
    `read`: (example, its encoded row) of each row read from the data file."""
    d = stage.config.data
    # the first row of the file that does not fit, not the first of the split
    by_file = sorted(read, key=lambda pair: (pair[0].source is None, getattr(pair[0].source, "line", 0) or 0))
    check_rows_fit(
        [stage.positions(row) for _, row in by_file],
        [example.source for example, _ in by_file],
        context=model_context(model),
        model_name=f"the model {stage.config.model}",
        max_prompt_tokens=d.max_prompt_tokens,
        max_response_tokens=d.max_response_tokens,
        what="pair" if stage.data_kind == "preference" else "row",
    )


def _resume(
    run: SupervisedRun,
    stage: SupervisedStage,
    batches: Iterator[list[int]],
    train_rows: list[Any],
    test_rows: list[Any],
) -> tuple[int, dict[str, Any]]:
    """Load the newest checkpoint of `run.out` into the run and the stage, draw and drop the step
    batches of the steps it has done (the data order of an uninterrupted run); (the steps done, the
    checkpoint's RNG states, set just before the first step)."""
    path = latest_checkpoint(run.out, warn=lambda message: print(f"warning: {message}", file=sys.stderr))
    if path is None:
        raise ConfigError(
            f"{run.out} has no complete checkpoint to resume from (checkpoints/iter_*/DONE). Fix: start a "
            "fresh run with another --out, with --checkpoint.every N to save during the run."
        )
    # fsdp2: rank 0 reads the weights and moments, every rank's shards come from it (run_supervised)
    sharded = run.peers is not None and stage.config.dist.strategy == "fsdp2"
    state = load_supervised_checkpoint(run, path, weights=run.writer or not sharded)
    stage.restore_state(state["stage"], train_rows, test_rows)
    done = int(state["step"])
    for _ in zip(range(done), batches):
        pass
    return done, state["rng"]


def export_causal_lm(run: SupervisedRun) -> None:
    """The trained causal LM as a float32 Hugging Face directory in the run directory (LoRA merged
    into a copy): every rank joins the gather of the whole model (fsdp2), rank 0 writes."""
    cast_parameters(run.model, torch.float32)  # training is over: float32 in place, no copy to export
    with run.learner.whole_copy(run.model) as model:
        if run.writer:
            assert model is not None  # the writer is rank 0, which holds the copy
            export_models(run.out, run.tokenizer, {"": model})


def shuffled_step_batches(
    steps: int, batch_size: int, lengths: list[int], group_by_length: str, generator: torch.Generator
) -> Iterator[list[int]]:
    """Step batches of `batch_size` row indices for `steps` steps: a fresh shuffled epoch whenever
    the current one runs out (`group_by_length across_steps`: steps of similar-length rows, the
    Hugging Face Trainer's group_by_length, rlhf/data/length_grouping.py); `lengths`: each row's."""
    order: list[int] = []
    for _ in range(steps):
        while len(order) < batch_size:
            order += torch.randperm(len(lengths), generator=generator).tolist()
            if group_by_length == "across_steps":  # the last epoch's leftover rows join in, so that
                order = length_grouped_order(order, lengths, batch_size, generator)  # steps stay aligned
        yield order[:batch_size]
        del order[:batch_size]


def steps_of_epochs(epochs: float, num_rows: int, batch_size: int, max_steps: int | None) -> int:
    """`max_steps`, or the steps of `epochs` passes over `num_rows` rows in batches of `batch_size`."""
    return max_steps or max(1, math.ceil(epochs * num_rows / batch_size))
