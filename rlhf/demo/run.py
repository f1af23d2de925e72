"""`rlhf demo`: the whole pipeline on the built-in world, with a report.

1. build the world and a tiny Llama model; SFT it on base responses;
2. train the proxy reward model on the world's noisy preference pairs (held-out label and gold accuracy);
3. run PPO-max (or, with --compare, vanilla PPO, PPO-max, APA, AWR, GRPO, RLOO and DPO over --seeds
   seeds; --compare-only NAMES trains only those of them, DPO and online DPO, e.g. ppo_max,dpo,online_dpo)
   against the proxy, evaluating proxy and gold reward, KL, perplexity, length and distinct-2 on held-out prompts;
4. write report.html and summary.json (with --compare also the gold gain where each run's KL first
   reaches `kl_budget`, as `rlhf ablate` reads it), print a one-screen summary."""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlhf.config import (
    ConfigError,
    DPOConfig,
    DPODataConfig,
    DPOLossConfig,
    DPOTrainConfig,
    OptimConfig,
    RewardConfig,
    RewardDataConfig,
    RewardTrainConfig,
    RLConfig,
    SFTConfig,
    SFTDataConfig,
    SFTTrainConfig,
    deep_merge,
    from_dict,
    load_config,
    parse_overrides,
    read_yaml,
    to_dict,
)
from rlhf.data.loading import load_examples
from rlhf.data.tokenize import encode_prompt
from rlhf.demo.held_out import ModulesInProcess, evaluate_policy
from rlhf.demo.report import write_report
from rlhf.demo.world_scores import world_scores_hook
from rlhf.models.loading import load_causal_lm
from rlhf.models.reference import ReferenceModel
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm
from rlhf.monitor import print_summary
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import LocalRuntime
from rlhf.stages.dpo import DPOStage
from rlhf.stages.prompt_files import encode_prompts
from rlhf.stages.rm import encode_pairs, evaluate_pairs, run_reward_training
from rlhf.stages.sft import run_sft
from rlhf.train.supervised import SupervisedRun, run_supervised
from rlhf.worlds import WorldConfig, build_world

ALGORITHMS = ("vanilla_ppo", "ppo_max", "apa", "awr", "grpo", "rloo")
NAMED_ONLY = ("online_dpo",)  # RL runs of --compare-only (or `algorithms`) only, not of a plain --compare
REPORT_KEYS = {
    "proxy": "reward/raw_mean",
    "gold": "eval/gold",
    "kl": "kl/ref",
    "ppl": "policy_ppl",
    "length": "response/length_mean",
    "distinct2": "response/distinct2",
}


@dataclass
class DemoModelConfig:
    hidden_size: int = 64  # tiny Llama width
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads


@dataclass
class DemoConfig:
    world: WorldConfig = field(default_factory=WorldConfig)  # the built-in world (rlhf/worlds)
    model: DemoModelConfig = field(default_factory=DemoModelConfig)
    sft_steps: int = 600  # SFT optimizer steps
    sft_batch_size: int = 32  # SFT examples per step
    sft_lr: float = 3e-3  # SFT peak learning rate (tiny models learn with large rates)
    rm_steps: int = 400  # reward-model optimizer steps
    rm_batch_size: int = 32  # pairs per step
    rm_lr: float = 1e-3  # reward-model peak learning rate
    rm_lm_coef: float = 0.0  # beta_rm for the demo's reward model
    iterations: int = 100  # RL iterations per run
    eval_every: int = 5  # evaluate on held-out prompts every N iterations
    eval_prompts: int = 128  # held-out prompts per evaluation
    algorithms: list[str] = field(default_factory=lambda: ["ppo_max"])  # without --compare
    rl: dict = field(default_factory=dict)  # overrides applied to every RL run (dotted RLConfig keys, nested)
    threads: int = 1  # torch intra-op threads: tiny models run fastest on one (no thread contention)
    # DPO under --compare (docs/algorithms.md §32), on the reward model's pairs; tiny models want
    # large rates: the DPO paper's 1e-6 moves nothing here
    dpo_steps: int = 300  # DPO optimizer steps per seed
    dpo_batch_size: int = 32  # pairs per step (the reward model's batch)
    dpo_lr: float = 3e-4  # DPO peak learning rate, the RL policies' (linear decay after a 10% warmup)
    dpo_beta: float = 0.1  # DPO's beta (the DPO paper's dialogue value)
    dpo_eval_every: int = 15  # evaluate the DPO policy on the held-out prompts every N steps
    kl_budget: float = 2.0  # --compare: gold gain where a run's KL first reaches this (rlhf ablate's default)


# Settings of every demo RL run, layered over each algorithm's preset (tiny models want large rates).
DEMO_RL = {
    "rollout": {"batch_size": 64, "max_new_tokens": 32, "temperature": 1.0},
    "train": {"ppo_epochs": 2, "minibatches": 2, "micro_batch_size": 64},
    "policy_optim": {"lr": 3e-4, "warmup_fraction": 0.0},
    "critic_optim": {"lr": 1e-3, "warmup_fraction": 0.0},
    "critic": {"pretrain_iterations": 0},
    "log": {"eval_every": 5},
}
# Per preset: every KL-penalized algorithm gets the same beta and 5 critic pre-training iterations.
# PPO-max runs without PPO-ptx here (the demo passes no ptx data; its gain is measured without it).
# The demo keeps the values it was measured with (bench/results/demo.json) where the presets since
# moved to the papers' values (docs/algorithms.md §23): reward clip 5, PPO-max whitening, vanilla
# PPO's critic from the SFT trunk. APA and AWR take the APA paper's whitening and uncapped weights but
# keep a KL penalty: without it both collapse at the demo's learning rates (bench/studies/ablation.md).
PRESET_DEMO = {
    "vanilla_ppo": {"model": {"critic_init": "policy"}},
    "ppo_max": {
        "critic": {"pretrain_iterations": 5},
        "kl": {"beta": 0.1},
        "policy": {"ptx_coef": 0.0},
        "reward": {"clip": 5.0},
        "advantage": {"whiten": True},
    },
    "apa": {"critic": {"pretrain_iterations": 5}, "kl": {"beta": 0.1}, "reward": {"clip": 5.0}},
    "awr": {"critic": {"pretrain_iterations": 5}, "kl": {"beta": 0.1}, "reward": {"clip": 5.0}},
    # critic-free: groups of 4 responses per prompt; GRPO's KL is in its loss (same coefficient)
    "grpo": {"rollout": {"samples_per_prompt": 4}, "policy": {"kl_loss_coef": 0.1}},
    "rloo": {"rollout": {"samples_per_prompt": 4}, "kl": {"beta": 0.1}},
    # pairs sampled by the current policy; DPO's loss with the beta of the offline DPO runs (dpo_beta 0.1)
    "online_dpo": {"policy": {"dpo": {"beta": 0.1}}},
}
CRITIC_GROUPS = ("critic", "critic_optim")  # settings that only runs with a critic take


def demo_rl_overrides(cfg: DemoConfig, algorithm: str) -> dict:
    """The demo's RL settings for one algorithm over its preset. Every run samples the same number
    of responses per iteration (`rollout.batch_size` counts responses here): a run with groups of n
    samples batch_size / n prompts. Critic settings go only to runs that have a critic."""
    layers = deep_merge(deep_merge(DEMO_RL, PRESET_DEMO.get(algorithm, {})), cfg.rl)
    layers = deep_merge(
        layers, {"train": {"iterations": cfg.iterations}, "log": {"eval_every": cfg.eval_every}}
    )
    preset = load_config(RLConfig, preset=algorithm)
    if not preset.uses_critic:
        layers = without_critic(layers)
    rollout = layers["rollout"] = dict(layers.get("rollout", {}))  # a copy: DEMO_RL's stays as it is
    n = rollout.get("samples_per_prompt", preset.rollout.samples_per_prompt)
    responses = rollout.get("batch_size", preset.rollout.batch_size)
    rollout["batch_size"] = max(1, responses // n)
    return layers


def without_critic(layers: dict) -> dict:
    """`layers` less the settings only a run with a critic takes (a critic-free preset refuses them)."""
    layers = {k: v for k, v in layers.items() if k not in CRITIC_GROUPS}
    if "model" in layers:
        model = layers["model"]
        layers["model"] = {k: v for k, v in model.items() if not k.startswith(("critic", "value_coef"))}
    return layers


def demo_config(config_file: str | None, overrides: list[str]) -> DemoConfig:
    data = {}
    if config_file:
        data = read_yaml(config_file)
    data = deep_merge(data, parse_overrides(overrides))
    origin = config_file or "command line"
    try:
        cfg = from_dict(DemoConfig, data, origin=origin)
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(
            f"{origin}: {str(err).replace('WorldConfig.', 'world.')}. Fix: give the world setting a value in its range."
        ) from None
    check_demo_ranges(cfg, origin)
    return cfg


# DemoConfig fields that may be 0 (the rest of the counts must be >= 1, the rates > 0)
DEMO_ZERO_OK = {"threads": "0: torch's own thread count", "rm_lm_coef": "0: no LM term"}


def check_demo_ranges(cfg: DemoConfig, origin: str) -> None:
    """Every count of the demo >= 1 and every rate > 0 (those in DEMO_ZERO_OK >= 0), the key named."""
    groups = (("", cfg), ("model.", cfg.model))
    for prefix, group in groups:
        for f in dataclasses.fields(group):
            value = getattr(group, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            low_ok = value >= 0 if f.name in DEMO_ZERO_OK else value > 0
            if not low_ok:
                need = ">= 0" if f.name in DEMO_ZERO_OK else ">= 1" if isinstance(value, int) else "> 0"
                raise ConfigError(
                    f"{origin}: {prefix}{f.name} must be {need}, got {value!r}. "
                    f"Fix: --{prefix}{f.name} {f.default if f.default is not dataclasses.MISSING else 1}."
                )


# ---------------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------------
def run_demo(
    out: str = "runs/demo",
    compare: bool = False,
    seeds: int = 1,
    config_file: str | None = None,
    overrides: list[str] | None = None,
    quiet: bool = False,
    compare_only: list[str] | None = None,
) -> int:
    cfg = demo_config(config_file, overrides or [])
    only = check_compare_only(compare_only)
    compare = compare or only is not None
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    out_dir = Path(out)
    clear_demo_outputs(out_dir)
    started = time.perf_counter()
    say = (lambda *a: None) if quiet else print
    stage = prepare_stage(cfg, out_dir, say=say, quiet=quiet)
    world, tokenizer, reward_model = stage.world, stage.tokenizer, stage.reward_model
    eval_texts, eval_ids = stage.eval_texts, stage.eval_ids
    sft_summary, rm_summary = stage.sft_summary, stage.rm_summary

    # 3. RL runs ---------------------------------------------------------------------------------
    listed = (*ALGORITHMS, *NAMED_ONLY)
    algorithms = [a for a in listed if a in (only or ALGORITHMS)] if compare else list(cfg.algorithms)
    runs, run_summaries = [], []
    total = len(algorithms) * seeds
    for k, (algorithm, seed) in enumerate((a, s) for a in algorithms for s in range(seeds)):
        say(f"[3/4] RL run {k + 1}/{total}: {algorithm}, seed {seed} ...")
        run, summary = run_one(
            cfg, algorithm, seed, out_dir, tokenizer, reward_model, world, eval_texts, eval_ids, quiet=quiet
        )
        runs.append(run)
        run_summaries.append(summary)
    if compare and (only is None or "dpo" in only):  # DPO from the same SFT model on the RM's pairs
        for seed in range(seeds):
            say(f"[3/4] DPO run {seed + 1}/{seeds}: seed {seed} ...")
            run, summary = run_dpo_one(
                cfg, seed, out_dir, tokenizer, reward_model, world, eval_texts, eval_ids, quiet=quiet
            )
            runs.append(run)
            run_summaries.append(summary)

    # 4. summary + report --------------------------------------------------------------------------
    summary = {
        "sft": sft_summary,
        "reward_model": rm_summary,
        "runs": run_summaries,
        "world": cfg.world.to_dict() if hasattr(cfg.world, "to_dict") else to_dict(cfg.world),
        "seconds": time.perf_counter() - started,
    }
    summary["findings"] = findings(summary)
    if compare:
        summary["equal_kl"] = equal_kl(summary, runs, cfg.kl_budget)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "runs.json").write_text(json.dumps(runs))
    write_report(out_dir / "report.html", summary, runs, title="rlhf demo report", metric_keys=REPORT_KEYS)
    if not quiet:
        print_demo_summary(summary, out_dir)
    return 0


def check_compare_only(names: list[str] | None) -> list[str] | None:
    """`--compare-only`: the subset of --compare's runs (ALGORITHMS and "dpo") to train, or None (all)."""
    if names is None:
        return None
    known = (*ALGORITHMS, *NAMED_ONLY, "dpo")
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(
            f"--compare-only {','.join(names)}: {', '.join(unknown) or 'nothing'} is not one of --compare's "
            f"runs. Fix: a comma-separated subset of {','.join(known)}."
        )
    return list(names)


@dataclass
class Stage:
    """What every RL run of a demo (or an ablation) starts from: the world, the SFT model (on disk
    in out_dir/sft), the proxy reward model, the held-out evaluation prompts and the summaries."""

    world: object
    tokenizer: object
    reward_model: ScalarHeadModel
    eval_texts: list[str]
    eval_ids: list[list[int]]
    sft_summary: dict
    rm_summary: dict


def prepare_stage(cfg: DemoConfig, out_dir: Path, *, say=print, quiet: bool = False) -> Stage:
    """Steps 1 and 2: build and write the world, SFT a tiny Llama, train the proxy reward model,
    and evaluate the SFT model on the held-out prompts."""
    say(f"[1/4] building the world (seed {cfg.world.seed}) and SFT of a tiny Llama ...")
    world = build_world(cfg.world)
    world_dir = out_dir / "world"
    world.write(world_dir)
    sft_final, sft_seconds = _train_sft(cfg, world, out_dir, quiet)
    say("[2/4] training the proxy reward model on noisy preference pairs ...")
    reward_model, rm_summary = _train_proxy_reward_model(cfg, world, out_dir, quiet)
    eval_texts, eval_ids = eval_prompts(cfg, world_dir, world.tokenizer)
    sft_summary = _sft_baseline(world, reward_model, out_dir, eval_texts, eval_ids)
    sft_summary.update({"eval_loss": sft_final.get("eval/loss"), "seconds": sft_seconds})
    return Stage(world, world.tokenizer, reward_model, eval_texts, eval_ids, sft_summary, rm_summary)


def _stage_steps(steps: int, batch_size: int) -> dict:
    """The `train` keys of the demo's SFT and reward-model stages: `steps` steps of `batch_size`
    rows, one micro-batch each, evaluated four times."""
    return {
        "max_steps": steps,
        "batch_size": batch_size,
        "micro_batch_size": batch_size,
        "eval_every": max(1, steps // 4),
    }


def _stage_optim(lr: float, steps: int) -> OptimConfig:
    """Their optimizer: warm-up over the first 5% of `steps`, then a cosine decay to a tenth of `lr`."""
    return OptimConfig(lr=lr, warmup_steps=max(1, steps // 20), schedule="cosine", min_lr_ratio=0.1)


def _train_sft(cfg: DemoConfig, world, out_dir: Path, quiet: bool) -> tuple[dict, float]:
    """A tiny Llama fine-tuned on the world's base responses, saved in out_dir/sft; (final metrics,
    seconds)."""
    tokenizer, world_dir = world.tokenizer, out_dir / "world"
    model = tiny_causal_lm(
        tokenizer,
        seed=cfg.world.seed,
        hidden_size=cfg.model.hidden_size,
        num_layers=cfg.model.num_layers,
        num_heads=cfg.model.num_heads,
    )
    sft_cfg = SFTConfig(
        out=str(out_dir / "sft"),
        seed=cfg.world.seed,
        data=SFTDataConfig(path=str(world_dir / "sft_train.jsonl"), test_fraction=0.05),
        train=SFTTrainConfig(**_stage_steps(cfg.sft_steps, cfg.sft_batch_size)),
        optim=_stage_optim(cfg.sft_lr, cfg.sft_steps),
        sinks=["jsonl"] if quiet else ["console", "jsonl"],
    )
    t0 = time.perf_counter()
    sft_final = run_sft(sft_cfg, model=model, tokenizer=tokenizer, quiet=True)
    sft_seconds = time.perf_counter() - t0
    return sft_final, sft_seconds


def _train_proxy_reward_model(cfg: DemoConfig, world, out_dir: Path, quiet: bool):
    """The proxy reward model trained on the world's noisy preference pairs (out_dir/rm), and its
    accuracy on the held-out pairs' noisy labels and gold ordering."""
    tokenizer, world_dir = world.tokenizer, out_dir / "world"
    rm_cfg = RewardConfig(
        model=str(out_dir / "sft"),
        out=str(out_dir / "rm"),
        seed=cfg.world.seed,
        data=RewardDataConfig(path=str(world_dir / "pairs_train.jsonl"), test_fraction=0.0),
        train=RewardTrainConfig(**_stage_steps(cfg.rm_steps, cfg.rm_batch_size), lm_coef=cfg.rm_lm_coef),
        optim=_stage_optim(cfg.rm_lr, cfg.rm_steps),
        sinks=["jsonl"] if quiet else ["console", "jsonl"],
    )
    test_pairs = load_examples(world_dir / "pairs_test.jsonl", kind="preference").examples
    test_rows = encode_pairs(tokenizer, test_pairs, rm_cfg, stats=None)
    t0 = time.perf_counter()
    run_reward_training(rm_cfg, tokenizer=tokenizer, test_rows=test_rows, quiet=True)
    rm_seconds = time.perf_counter() - t0
    reward_model = ScalarHeadModel.from_pretrained(out_dir / "rm").eval()
    rm_eval = evaluate_pairs(reward_model, test_rows, tokenizer.pad_token_id, 64, with_lm=False)
    gold_margin = [
        world.gold_reward(ex.prompt, ex.chosen) - world.gold_reward(ex.prompt, ex.rejected)
        for ex in test_pairs
    ]
    gold_pairs = [(m, g) for m, g in zip(rm_eval["margins"], gold_margin) if g != 0]
    rm_summary = {
        "label_accuracy": rm_eval["accuracy"],
        "gold_accuracy": sum((m > 0) == (g > 0) for m, g in gold_pairs) / max(len(gold_pairs), 1),
        "seconds": rm_seconds,
    }
    return reward_model, rm_summary


def _sft_baseline(world, reward_model, out_dir: Path, eval_texts, eval_ids) -> dict:
    """The SFT model's held-out figures: the baseline every run's gain is read against."""
    tokenizer = world.tokenizer
    sft_policy = load_causal_lm(out_dir / "sft")
    sft_ref = ReferenceModel(sft_policy, mode="copy")
    max_new = DEMO_RL["rollout"]["max_new_tokens"]
    sft_record, sft_samples, sft_gold = evaluate_policy(
        ModulesInProcess(sft_policy, sft_ref, reward_model, tokenizer),
        tokenizer,
        world,
        eval_texts,
        eval_ids,
        seed=12345,
        max_new_tokens=max_new,
    )
    sft_summary = {
        "gold_mean": sft_record["gold"],
        "gold_std": float(sft_gold.std()),
        "proxy_mean": sft_record["proxy"],
        "ppl": sft_record["ppl"],
        "length": sft_record["length"],
        "distinct2": sft_record["distinct2"],
        "topic_rate": sft_record["topic_rate"],
        "repetition_rate": sft_record["repetition_rate"],
    }
    return sft_summary


def load_stage(cfg: DemoConfig, out_dir: Path, sft_summary: dict, rm_summary: dict) -> Stage:
    """The Stage of a finished prepare_stage in `out_dir` (the world rebuilt from its config, the
    reward model and the prompts read back), for a resumed ablation."""
    world = build_world(cfg.world)
    reward_model = ScalarHeadModel.from_pretrained(out_dir / "rm").eval()
    eval_texts, eval_ids = eval_prompts(cfg, out_dir / "world", world.tokenizer)
    return Stage(world, world.tokenizer, reward_model, eval_texts, eval_ids, sft_summary, rm_summary)


def eval_prompts(cfg: DemoConfig, world_dir: Path, tokenizer) -> tuple[list[str], list[list[int]]]:
    """The `cfg.eval_prompts` held-out prompts (cycling through the test prompts) and their ids."""
    test_prompt_texts = [
        ex.prompt for ex in load_examples(world_dir / "prompts_test.jsonl", kind="prompt").examples
    ]
    eval_texts = [test_prompt_texts[i % len(test_prompt_texts)] for i in range(cfg.eval_prompts)]
    return eval_texts, [encode_prompt(tokenizer, p, 64) for p in eval_texts]


def run_one(
    cfg,
    algorithm,
    seed,
    out_dir,
    tokenizer,
    reward_model,
    world,
    eval_texts,
    eval_ids,
    *,
    quiet=False,
    rl_overrides: dict | None = None,
    name: str | None = None,
):
    """One RL run from the shared SFT and reward model; returns (report run, summary.json run).
    `rl_overrides` (default: the demo's, `demo_rl_overrides`) are layered over the preset
    `algorithm`, then cfg.rl and the iteration counts; the run lands in runs/<name>-seed<seed>."""
    if rl_overrides is None:
        layers = demo_rl_overrides(cfg, algorithm)
    else:
        layers = deep_merge(rl_overrides, cfg.rl)
        layers = deep_merge(
            layers, {"train": {"iterations": cfg.iterations}, "log": {"eval_every": cfg.eval_every}}
        )
    config = load_config(RLConfig, preset=algorithm, overrides=layers)
    config.seed = seed
    config.out = str(out_dir / "runs" / f"{name or algorithm}-seed{seed}")
    policy = load_causal_lm(out_dir / "sft")
    roles = assemble_roles(config, tokenizer=tokenizer, policy=policy, reward_model=reward_model)
    train_prompts = encode_prompts(
        tokenizer,
        str(out_dir / "world" / "prompts_train.jsonl"),
        format="auto",
        max_tokens=64,
        skip_invalid=False,
    )
    history: list[dict] = []
    samples: dict = {}
    evaluator = rl_evaluator(
        tokenizer, world, eval_texts, eval_ids, seed, config.rollout.max_new_tokens, history, samples
    )
    started = time.perf_counter()
    # a world with rm_* options distorts the raw scores RL sees (None: the default world)
    runtime = LocalRuntime(roles, config.runtime)
    trainer = RLTrainer(config, runtime, train_prompts, evaluator=evaluator, quiet=quiet,
                        raw_scores_hook=world_scores_hook(cfg.world, config.seed))  # fmt: skip
    trainer.train()
    if not history or history[-1]["iteration"] != trainer.iteration:
        evaluator(trainer, trainer.iteration)
    seconds = time.perf_counter() - started
    metrics = [
        m for m in _read_jsonl(Path(config.out) / "metrics.jsonl") if "iteration" in m and "event" not in m
    ]
    warnings = [
        {"iteration": m.get("iteration", m.get("step", 0)), "message": m.get("message", "")}
        for m in _read_jsonl(Path(config.out) / "metrics.jsonl")
        if m.get("event") == "warning" and "collapse" in m.get("message", "").lower()
    ]
    final = history[-1]
    run = {
        "algorithm": algorithm,
        "seed": seed,
        "metrics": metrics,
        "eval": history,
        "reward_samples": [
            {"iteration": m["iteration"], "scores": m.get("reward/raw_scores", [])} for m in metrics
        ],
        "samples": samples,
        "warnings": warnings,
    }
    summary = {
        "algorithm": algorithm,
        "seed": seed,
        "final": {k: final[k] for k in ("proxy", "gold", "kl", "ppl", "length", "distinct2")},
        "peak_gold": max(h["gold"] for h in history),
        "collapse_detected": bool(trainer.monitors.detector.fired),
        "iterations": trainer.iteration,
        "seconds": seconds,
    }
    return run, summary


def held_out_recorder(tokenizer, world, eval_texts, eval_ids, seed, max_new_tokens, history, samples):
    """A run's held-out evaluation, `record(models, at, extra)`: the figures of the policy `models`
    answers for (sampling seed 1000 + seed), appended to `history` between `at` (the iteration or
    step) and `extra` (figures of the run's own); the first and latest 4 samples in `samples`."""

    def record(models, at: dict, extra: dict | None = None) -> dict:
        figures, picked, _ = evaluate_policy(
            models, tokenizer, world, eval_texts, eval_ids, seed=1000 + seed, max_new_tokens=max_new_tokens
        )
        history.append({**at, **figures, **(extra or {})})
        samples.setdefault("start", picked)
        samples["end"] = picked
        return figures

    return record


def rl_evaluator(tokenizer, world, eval_texts, eval_ids, seed, max_new_tokens, history, samples):
    """An RL run's evaluator (the trainer calls it every `eval_every` iterations): the held-out
    figures of the policy, appended to `history`; the first and latest 4 samples in `samples`."""
    record = held_out_recorder(tokenizer, world, eval_texts, eval_ids, seed, max_new_tokens, history, samples)

    def evaluator(trainer: RLTrainer, iteration: int) -> dict:
        # through the runtime, by role name: the roles may live in other processes (torchrun, Ray)
        return record(trainer.runtime, {"iteration": iteration})

    return evaluator


class DemoDPOStage(DPOStage):
    """DPO as `rlhf dpo` trains it (run_dpo's stage), with the demo's evaluation of the policy on the
    held-out prompts before the first step and at each of the stage's evaluations."""

    def __init__(self, config: DPOConfig, evaluator) -> None:
        super().__init__(config)
        self.evaluator = evaluator  # (policy, reference, optimizer steps done, held-out pair figures)

    def before_training(self, run: SupervisedRun, train_rows, test_rows, status) -> None:
        super().before_training(run, train_rows, test_rows, status)
        self._evaluate(run, 0, {})

    def evaluate(self, run: SupervisedRun, rows, step: int | None = None) -> dict:
        result = super().evaluate(run, rows, step)
        if step is not None:
            self._evaluate(run, step + 1, result)
        return result

    def _evaluate(self, run: SupervisedRun, steps: int, pairs: dict) -> None:
        was_training = run.model.training
        run.model.eval()
        try:
            self.evaluator(run.model, self.reference, steps, pairs)  # one process: the model whole
        finally:
            run.model.train(was_training)


def dpo_config(cfg: DemoConfig, seed: int, out_dir: Path, *, quiet: bool = False) -> DPOConfig:
    """DPO from the demo's SFT model on the pairs its proxy reward model was trained on (all of
    pairs_train.jsonl; pairs_test.jsonl is the held-out evaluation, as for the reward model)."""
    return DPOConfig(
        model=str(out_dir / "sft"),
        out=str(out_dir / "runs" / f"dpo-seed{seed}"),
        seed=seed,
        data=DPODataConfig(path=str(out_dir / "world" / "pairs_train.jsonl"), test_fraction=0.0),
        train=DPOTrainConfig(
            max_steps=cfg.dpo_steps,
            batch_size=cfg.dpo_batch_size,
            micro_batch_size=cfg.dpo_batch_size,
            eval_every=cfg.dpo_eval_every,
        ),
        optim=OptimConfig(lr=cfg.dpo_lr, warmup_fraction=0.1, schedule="linear"),
        dpo=DPOLossConfig(loss="sigmoid", beta=cfg.dpo_beta),
        sinks=["jsonl"] if quiet else ["console", "jsonl"],
    )


def run_dpo_one(cfg, seed, out_dir, tokenizer, reward_model, world, eval_texts, eval_ids, *, quiet=False):
    """One DPO run from the shared SFT model (docs/algorithms.md §32), evaluated by the RL runs'
    evaluator (same held-out prompts and sampling seed) every `cfg.dpo_eval_every` optimizer steps;
    returns (report run, summary.json run) as run_one does, with steps in place of iterations."""
    config = dpo_config(cfg, seed, out_dir, quiet=quiet)
    test_pairs = load_examples(out_dir / "world" / "pairs_test.jsonl", kind="preference").examples
    max_new = deep_merge(DEMO_RL, cfg.rl)["rollout"]["max_new_tokens"]  # as the RL runs evaluate
    history: list[dict] = []
    samples: dict = {}

    record = held_out_recorder(tokenizer, world, eval_texts, eval_ids, seed, max_new, history, samples)

    def evaluator(policy, reference, steps: int, pairs: dict) -> None:
        pair_figures = {f"pair_{k}": pairs[k] for k in ("accuracy", "margin") if k in pairs}
        record(ModulesInProcess(policy, reference, reward_model, tokenizer), {"step": steps}, pair_figures)

    stage = DemoDPOStage(config, evaluator)
    test_rows = stage.encode(tokenizer, test_pairs, stats=None)  # as `rlhf dpo` encodes its pairs
    started = time.perf_counter()
    run_supervised(stage, tokenizer=tokenizer, test_rows=test_rows, quiet=True)
    seconds = time.perf_counter() - started
    metrics = [m for m in _read_jsonl(Path(config.out) / "metrics.jsonl") if "event" not in m]
    final = history[-1]
    run = {
        "algorithm": "dpo",
        "seed": seed,
        "x_axis": "optimizer step",  # the report draws DPO's curves against its steps
        "metrics": metrics,
        "eval": history,
        "samples": samples,
        "warnings": [],
    }
    summary = {
        "algorithm": "dpo",
        "seed": seed,
        "final": {k: final[k] for k in ("proxy", "gold", "kl", "ppl", "length", "distinct2")},
        "peak_gold": max(h["gold"] for h in history),
        "collapse_detected": None,  # the collapse detector watches RL iterations; DPO has none
        "steps": final["step"],
        "pair_accuracy": final.get("pair_accuracy"),  # on the held-out pairs (the noisy labels)
        "seconds": seconds,
    }
    return run, summary


def equal_kl(summary: dict, runs: list[dict], budget: float) -> dict:
    """Per algorithm over seeds: the gold gain over SFT where each run's KL first reaches `budget`
    (interpolated, as `rlhf ablate` reads it: rlhf/demo/ablate/report.py) and at the end, with
    95% t intervals, and how many runs reached the budget."""
    from rlhf.demo.ablate.report import run_numbers
    from rlhf.demo.ablate.stats import mean_ci

    sft_gold = summary["sft"]["gold_mean"]
    numbers: dict[str, list[dict]] = {}
    for entry, run in zip(summary["runs"], runs):
        trajectory = [{"kl": h["kl"], "gold": h["gold"]} for h in run["eval"]]
        result = {**entry, "collapse_detected": bool(entry["collapse_detected"]), "trajectory": trajectory}
        numbers.setdefault(entry["algorithm"], []).append(run_numbers(result, sft_gold, budget))
    table = {}
    for algorithm, rows in numbers.items():
        table[algorithm] = {
            key: mean_ci([n[key] for n in rows]) for key in ("gold_gain_at_kl", "gold_gain_end", "kl_end")
        }
        table[algorithm]["reached_kl_budget"] = f"{sum(n['reached_kl_budget'] for n in rows)}/{len(rows)}"
    return {"kl_budget": budget, "algorithms": table}


def findings(summary: dict) -> list[dict]:
    """The demo's claims (issue: 'what the demo must show'), each checked on the measured runs."""
    sft = summary["sft"]
    by_alg: dict[str, dict[int, dict]] = {}
    for r in summary["runs"]:
        by_alg.setdefault(r["algorithm"], {})[r["seed"]] = r
    out = []
    if "ppo_max" in by_alg:
        gains = [
            (r["final"]["gold"] - sft["gold_mean"]) / max(sft["gold_std"], 1e-9)
            for r in by_alg["ppo_max"].values()
        ]
        out.append(
            {
                "claim": "PPO-max raises gold reward over SFT by >= 1 SFT std, every seed",
                "holds": all(g >= 1.0 for g in gains),
                "evidence": f"gains in SFT std: {[round(g, 2) for g in gains]}",
            }
        )
        out.append(
            {
                "claim": "the collapse detector does not fire on PPO-max",
                "holds": not any(r["collapse_detected"] for r in by_alg["ppo_max"].values()),
                "evidence": f"fired: {[r['collapse_detected'] for r in by_alg['ppo_max'].values()]}",
            }
        )
    if "ppo_max" in by_alg and "vanilla_ppo" in by_alg:
        seeds = sorted(set(by_alg["ppo_max"]) & set(by_alg["vanilla_ppo"]))
        pairs = [(by_alg["vanilla_ppo"][s], by_alg["ppo_max"][s]) for s in seeds]
        out.append(
            {
                "claim": "vanilla PPO ends with higher proxy and lower gold than PPO-max, every seed",
                "holds": all(
                    v["final"]["proxy"] > m["final"]["proxy"] and v["final"]["gold"] < m["final"]["gold"]
                    for v, m in pairs
                ),
                "evidence": "; ".join(
                    f"seed {s}: proxy {v['final']['proxy']:.2f} vs {m['final']['proxy']:.2f}, "
                    f"gold {v['final']['gold']:.2f} vs {m['final']['gold']:.2f}"
                    for s, (v, m) in zip(seeds, pairs)
                ),
            }
        )
        out.append(
            {
                "claim": "vanilla PPO ends below its own gold peak, every seed",
                "holds": all(v["final"]["gold"] < v["peak_gold"] for v, _ in pairs),
                "evidence": "; ".join(
                    f"final {v['final']['gold']:.2f} / peak {v['peak_gold']:.2f}" for v, _ in pairs
                ),
            }
        )
        out.append(
            {
                "claim": "the collapse detector fires on vanilla PPO, every seed",
                "holds": all(v["collapse_detected"] for v, _ in pairs),
                "evidence": f"fired: {[v['collapse_detected'] for v, _ in pairs]}",
            }
        )
    return out


def print_demo_summary(summary: dict, out_dir: Path) -> None:
    rows = []
    by_alg: dict[str, list] = {}
    for r in summary["runs"]:
        by_alg.setdefault(r["algorithm"], []).append(r)
    sft = summary["sft"]
    rows.append(
        {
            "model": "SFT",
            "proxy": sft["proxy_mean"],
            "gold": sft["gold_mean"],
            "kl": 0.0,
            "ppl": sft["ppl"],
            "length": sft["length"],
            "distinct2": sft["distinct2"],
            "gold gain": "-",
            "collapse": "-",
        }
    )
    for alg, rs in by_alg.items():
        row = {"model": f"{alg} (x{len(rs)})"}
        for key in ("proxy", "gold", "kl", "ppl", "length", "distinct2"):
            row[key] = statistics.mean(r["final"][key] for r in rs)
        # gold gain over SFT in SFT standard deviations, mean [min, max] over the seeds
        gains = [(r["final"]["gold"] - sft["gold_mean"]) / max(sft["gold_std"], 1e-9) for r in rs]
        row["gold gain"] = f"{statistics.mean(gains):.2f} [{min(gains):.2f},{max(gains):.2f}]"
        watched = [r["collapse_detected"] for r in rs if r["collapse_detected"] is not None]
        row["collapse"] = f"{sum(watched)}/{len(watched)}" if watched else "-"  # DPO: not watched
        rows.append(row)
    print_summary("Final figures on held-out prompts (mean over seeds)", rows)
    if "equal_kl" in summary:
        budget = summary["equal_kl"]["kl_budget"]
        print(
            f"gold gain over SFT (in gold units) where KL first reaches {budget:g}, "
            "as rlhf ablate reads it (mean [95% interval] over seeds; runs that reached it):"
        )
        for alg, row in summary["equal_kl"]["algorithms"].items():
            print(f"  {alg:12s} {_interval(row['gold_gain_at_kl'])}  ({row['reached_kl_budget']})")
    rm = summary["reward_model"]
    print(
        f"reward model: accuracy {rm['label_accuracy']:.3f} on noisy labels, {rm['gold_accuracy']:.3f} on the gold ordering"
    )
    for f in summary["findings"]:
        print(f"[{'holds' if f['holds'] else 'FAILS'}] {f['claim']}: {f['evidence']}")
    print(
        f"report: {out_dir / 'report.html'}   summary: {out_dir / 'summary.json'}   ({summary['seconds']:.0f} s)"
    )


def _interval(stat: dict) -> str:
    ci = stat.get("ci95")
    return f"{stat['mean']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")


def rebuild_report(directory: str) -> int:
    d = Path(directory)
    missing = [name for name in ("summary.json", "runs.json") if not (d / name).is_file()]
    if missing:
        from rlhf.config import ConfigError

        raise ConfigError(
            f"{d} is not a demo output directory (no {' or '.join(missing)}). Fix: pass the --out directory "
            "of a finished `rlhf demo`; for a training run, open its metrics.jsonl."
        )
    summary = json.loads((d / "summary.json").read_text())
    runs = json.loads((d / "runs.json").read_text())
    write_report(d / "report.html", summary, runs, title="rlhf demo report", metric_keys=REPORT_KEYS)
    print(f"report: {d / 'report.html'}")
    return 0


def clear_demo_outputs(out_dir: Path) -> None:
    """Remove what an earlier demo wrote into `out_dir` (only the demo's own files), so a re-run starts clean."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("world", "sft", "rm", "runs"):
        shutil.rmtree(out_dir / name, ignore_errors=True)
    for name in ("summary.json", "runs.json", "report.html", "report_overview.png"):
        (out_dir / name).unlink(missing_ok=True)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
