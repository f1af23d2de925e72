"""Helpers of the trainer tests (tests.support.train_testing): the tiny world's words and config."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlhf.config import RLConfig, deep_merge, load_config, preset_dict

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
PROMPT_TEXTS = [" ".join(WORDS[i : i + 2 + i % 3]) for i in range(12)]  # 2 to 4 words: left padding
MAX_NEW_TOKENS = 5

# Overrides that make any preset tiny; tests deep-merge their own on top.
TINY = {
    "seed": 0,
    "train": {"iterations": 2, "micro_batch_size": 4, "minibatches": 2, "ppo_epochs": 1},
    "rollout": {"batch_size": 8, "max_new_tokens": MAX_NEW_TOKENS},
    "critic": {"pretrain_iterations": 0},
    "policy_optim": {"lr": 1e-3},
    "critic_optim": {"lr": 1e-3},
    "log": {"sinks": ["jsonl"]},
}


def rl_config(
    preset: str | None = "vanilla_ppo", *layers: dict, out: str | Path = "unused", **overrides
) -> RLConfig:
    """A validated tiny RLConfig: preset < TINY < `layers` < `overrides` (groups as nested dicts,
    e.g. `rl_config("ppo_max", ONE_BATCH, kl={"beta": 0.1})`)."""
    user: dict = {}
    for layer in (*layers, overrides):
        user = deep_merge(user, layer)
    preset_estimator = (preset_dict(preset) if preset else {}).get("advantage", {}).get("estimator", "gae")
    tiny = TINY
    if user.get("advantage", {}).get("estimator", preset_estimator) != "gae":  # a critic-free run
        tiny = {k: v for k, v in TINY.items() if k not in ("critic", "critic_optim")}
    merged = deep_merge(deep_merge(tiny, {"out": str(out)}), user)
    return load_config(RLConfig, preset=preset, overrides=merged)


def metric_rows(run_dir: str | Path, *, kinds: tuple[str, ...] = ("iteration", "pretrain")) -> list[dict]:
    """The metric records of a run, without warnings and without time/throughput keys."""
    rows = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "event" in record or not any(k in record for k in kinds):
            continue
        rows.append({k: v for k, v in record.items() if not k.startswith(("time/", "throughput/"))})
    return rows


def params_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def max_change(before: dict[str, torch.Tensor], module: torch.nn.Module) -> float:
    """Largest absolute change of any parameter since `before`."""
    return max(float((p.detach() - before[n]).abs().max()) for n, p in module.named_parameters())


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def perturb(module: torch.nn.Module, scale: float, seed: int = 0) -> None:
    """Add N(0, scale^2) noise to every parameter (a policy that differs from its reference)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))


def raw_scores(trainer, exp) -> torch.Tensor:
    """The reward model's scores [B] of an experience's rollout."""
    with torch.no_grad():
        return trainer.runtime.roles.reward_model.model.score(exp.input_ids, exp.attention_mask)


def loop_gae(rewards, values, mask, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE by plain Python loops over each row's valid tokens (docs/algorithms.md §10)."""
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        n = int(mask[b].sum())
        running = 0.0
        for t in reversed(range(n)):
            next_value = float(values[b, t + 1]) if t + 1 < n else 0.0
            delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
            running = delta + gamma * lam * running
            adv[b, t] = running
    return adv, (adv + values) * mask
