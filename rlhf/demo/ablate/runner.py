"""Run an ablation: the demo's world, SFT model and proxy reward model once, then every variant of
the preset (tricks.py) over seeds, in parallel worker processes, resumable.

    world/ sft/ rm/  stage.json               the demo's stage 1-2 and the settings it was built with
    (arms.py: other presets run beside the variants, `--add-arm`)
    runs/<variant>-seed<k>/                   one RL run; result.json once it has finished
    ablation.json report.html ablation.md     the table over seeds, its forest plot (report.py)

Resume: the stage is reused when its settings are the same (else refused), every run with a
result.json of the same run settings is kept, any other run starts again from scratch."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from rlhf.config import PRESETS, ConfigError, RLConfig, deep_merge, from_dict, load_config, to_dict
from rlhf.demo.ablate.arms import arm_variants, run_layers
from rlhf.demo.ablate.report import aggregate, markdown_table, print_ablation, write_ablation_report
from rlhf.demo.ablate.tricks import OPTIONAL_TRICKS, Variant, variants
from rlhf.demo.run import DEMO_RL, DemoConfig, demo_config, load_stage, prepare_stage, run_one

# The scale of the demo's runs (tiny models want large rates, rlhf/demo/run.py DEMO_RL); everything
# else, tricks included, is the preset's own.
ABLATE_RL = {
    "rollout": DEMO_RL["rollout"],
    "train": {"micro_batch_size": DEMO_RL["train"]["micro_batch_size"]},
    "policy_optim": {"lr": DEMO_RL["policy_optim"]["lr"]},
    "critic_optim": {"lr": DEMO_RL["critic_optim"]["lr"]},
}
ABLATABLE_PRESETS = tuple(p for p in PRESETS if load_config(RLConfig, preset=p).uses_critic)
DEFAULT_KL_BUDGET = 2.0  # summed k1 per response, the demo's evaluation KL


def run_ablation(
    out: str = "runs/ablate",
    preset: str = "ppo_max",
    seeds: int = 3,
    jobs: int = 1,
    kl_budget: float = DEFAULT_KL_BUDGET,
    config_file: str | None = None,
    overrides: list[str] | None = None,
    quiet: bool = False,
    extra_tricks: tuple[str, ...] = (),
    arms: tuple[str, ...] = (),
) -> int:
    _check_args(preset, seeds, jobs, kl_budget, extra_tricks)
    cfg = demo_config(config_file, overrides or [])
    settings = deep_merge(ABLATE_RL, cfg.rl)  # every run's RL settings under its trick switch
    run_cfg = dataclasses.replace(cfg, rl={})  # cfg.rl is in `settings`, below the switch
    out_dir = Path(out)
    say = (lambda *a: None) if quiet else print
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    all_variants, skipped = variants(
        preset, settings, extra=extra_tricks
    )  # settings checked: before the stage
    all_variants += arm_variants(preset, settings, arms)
    for s in skipped:
        say(f"skipped {s['trick']}: {s['reason']}")
    stage = _stage(cfg, out_dir, say, quiet)
    run_key = {
        "preset": preset,
        "settings": settings,
        "iterations": cfg.iterations,
        "eval_every": cfg.eval_every,
    }
    todo = [(v, s) for v in all_variants for s in range(seeds) if not _finished(out_dir, v, s, run_key)]
    say(f"[3/4] {len(all_variants)} variants x {seeds} seeds: {len(todo)} runs to do "
        f"({len(all_variants) * seeds - len(todo)} already finished), {jobs} at a time ...")  # fmt: skip
    job_args = [(preset, settings, v, s, run_key) for v, s in todo]
    if jobs == 1:
        _STATE.update(cfg=run_cfg, out_dir=out_dir, stage=stage)
        for k, args in enumerate(job_args):
            say(f"      run {k + 1}/{len(todo)}: {args[2].name}, seed {args[3]}")
            _run_job(args)
    else:
        context = multiprocessing.get_context("spawn")
        init = (to_dict(run_cfg), str(out_dir), stage.sft_summary, stage.rm_summary)
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker, initargs=init) as pool:
            for done, result in enumerate(pool.map(_run_job, job_args), start=1):
                say(f"      finished {done}/{len(todo)}: {result['variant']}, seed {result['seed']}")
    results = [
        json.loads(_result_path(out_dir, v, s).read_text()) for v in all_variants for s in range(seeds)
    ]
    say("[4/4] ablation.json and report.html ...")
    ablation = aggregate(
        preset=preset,
        variants=all_variants,
        skipped=skipped,
        results=results,
        sft=stage.sft_summary,
        kl_budget=kl_budget,
        world=cfg.world.to_dict(),
        settings=settings,
    )
    ablation["seconds"] = time.perf_counter() - started
    (out_dir / "ablation.json").write_text(json.dumps(ablation, indent=2))
    write_ablation_report(out_dir / "report.html", ablation)
    (out_dir / "ablation.md").write_text(markdown_table(ablation))
    if not quiet:
        print_ablation(ablation, out_dir)
    return 0


def _check_args(preset: str, seeds: int, jobs: int, kl_budget: float, extra: tuple[str, ...] = ()) -> None:
    unknown = [name for name in extra if name not in OPTIONAL_TRICKS]
    if unknown:
        raise ConfigError(
            f"--add-trick {unknown[0]!r} is not an optional trick. Fix: one of {', '.join(OPTIONAL_TRICKS)}."
        )
    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r} is not a preset. Fix: one of {', '.join(PRESETS)}.")
    if (
        preset not in ABLATABLE_PRESETS
    ):  # the tricks switched are PPO's: a critic-free preset has half of them
        raise ConfigError(
            f"--preset {preset} trains no critic, and the ablation switches PPO-max's tricks (critic "
            f"pre-training, value clipping, ...). Fix: one of {', '.join(ABLATABLE_PRESETS)}."
        )
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}. Fix: --seeds 3.")
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}. Fix: --jobs 1 (or the free CPU cores).")
    if not kl_budget > 0:
        raise ConfigError(f"--kl-budget must be > 0, got {kl_budget}. Fix: --kl-budget {DEFAULT_KL_BUDGET}.")


STAGE_FIELDS = ("world", "model", "sft_steps", "sft_batch_size", "sft_lr", "rm_steps", "rm_batch_size", "rm_lr",
                "rm_lm_coef", "eval_prompts")  # fmt: skip


def _stage(cfg: DemoConfig, out_dir: Path, say, quiet: bool):
    """The demo's world, SFT model and reward model: built, or read back when `out_dir` holds them
    for the same settings (a resumed ablation)."""
    # what the stage depends on: a later ablation may change iterations, RL settings or the preset
    key = {name: value for name, value in to_dict(cfg).items() if name in STAGE_FIELDS}
    stage_file = out_dir / "stage.json"
    if stage_file.is_file():
        recorded = json.loads(stage_file.read_text())
        if recorded["settings"] != key:
            raise ConfigError(
                f"{out_dir} holds an ablation with other settings (stage.json). Fix: pass another --out, "
                "or repeat that ablation's own command and flags to resume it."
            )
        say(f"[1-2/4] resuming: the world, SFT and reward model of {out_dir} are reused")
        return load_stage(cfg, out_dir, recorded["sft"], recorded["reward_model"])
    for name in ("world", "sft", "rm", "runs"):
        shutil.rmtree(out_dir / name, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = prepare_stage(cfg, out_dir, say=say, quiet=quiet)
    stage_file.write_text(
        json.dumps({"settings": key, "sft": stage.sft_summary, "reward_model": stage.rm_summary}, indent=2)
    )
    return stage


def _result_path(out_dir: Path, variant: Variant, seed: int) -> Path:
    return out_dir / "runs" / f"{variant.name}-seed{seed}" / "result.json"


def _finished(out_dir: Path, variant: Variant, seed: int, run_key: dict) -> bool:
    """Whether this run has a result.json from the same run settings (else it runs again)."""
    path = _result_path(out_dir, variant, seed)
    return path.is_file() and json.loads(path.read_text()).get("run_key") == run_key


# -- one run, in this process or a worker ----------------------------------------------------------
_STATE: dict = {}


def _init_worker(cfg: dict, out_dir: str, sft_summary: dict, rm_summary: dict) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # as the CLI does in the main process
    config = from_dict(DemoConfig, cfg, origin="ablation")
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    _STATE.update(
        cfg=config, out_dir=Path(out_dir), stage=load_stage(config, Path(out_dir), sft_summary, rm_summary)
    )


def _run_job(args) -> dict:
    """Run one variant with one seed from a clean directory and write its result.json (last)."""
    preset, settings, variant, seed, run_key = args
    cfg, out_dir, stage = _STATE["cfg"], _STATE["out_dir"], _STATE["stage"]
    run_dir = out_dir / "runs" / f"{variant.name}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted run starts again
    _, summary = run_one_variant(cfg, stage, preset, settings, variant, seed, out_dir)
    result = {"variant": variant.name, "seed": seed, "run_key": run_key, **summary}
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(run_dir / "result.json")  # written whole or not at all: resume trusts it
    return result


def run_one_variant(cfg, stage, preset: str, settings: dict, variant: Variant, seed: int, out_dir: Path):
    """(report run, result) of one RL run of `variant`: the demo's run_one with the variant's switch
    over the ablation's settings (an arm: its own preset, arms.py), and the gold/KL numbers the
    ablation reads."""
    algorithm, layers = run_layers(preset, settings, variant)
    run, summary = run_one(
        cfg,
        algorithm,
        seed,
        out_dir,
        stage.tokenizer,
        stage.reward_model,
        stage.world,
        stage.eval_texts,
        stage.eval_ids,
        quiet=True,
        rl_overrides=layers,
        name=variant.name,
    )
    summary["trajectory"] = [
        {"iteration": h["iteration"], "kl": h["kl"], "gold": h["gold"]} for h in run["eval"]
    ]
    return run, summary
