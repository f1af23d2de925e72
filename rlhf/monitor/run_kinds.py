"""What the report of each kind of run shows: its headline metrics (with the direction that counts as
best), its configuration highlights, and the monitor groups its metric keys fall into.

A metric key belongs to the group named by its prefix (`policy/clip_fraction` -> `policy`), with a
few keys mapped by hand (`policy_ppl` -> perplexity, `time/*` and `throughput/*` -> speed). Keys no
spec names are still plotted, in the group of their prefix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KindSpec:
    title: str
    headline: tuple[tuple[str, str | None], ...]  # (key, "min" | "max" | None: no best)
    config_keys: tuple[str, ...]  # dotted keys of config.yaml shown in the summary
    length_keys: tuple[str, ...]  # config keys giving the planned length of the run, first set wins


SPECS: dict[str, KindSpec] = {
    "sft": KindSpec(
        title="SFT",
        headline=(("train/loss", "min"), ("eval/loss", "min"), ("eval/ppl", "min"), ("train/grad_norm", None)),
        config_keys=(
            "model", "data.path", "data.max_prompt_tokens", "data.max_response_tokens", "train.epochs",
            "train.max_steps", "train.batch_size", "optim.lr", "optim.schedule", "lora.enabled", "seed",
        ),
        length_keys=("train.max_steps",),
    ),
    "rm": KindSpec(
        title="reward model",
        headline=(
            ("train/loss", "min"), ("train/accuracy", "max"), ("eval/accuracy", "max"),
            ("eval/margin_mean", "max"), ("eval/rank_loss", "min"), ("eval/lm_ppl", "min"),
        ),
        config_keys=(
            "model", "data.path", "train.batching", "train.batch_size", "train.epochs", "train.max_steps",
            "train.lm_coef", "optim.lr", "optim.warmup_fraction", "lora.enabled", "seed",
        ),
        length_keys=("train.max_steps",),
    ),
    "dpo": KindSpec(
        title="DPO",
        headline=(
            ("train/loss", "min"), ("eval/loss", "min"), ("eval/accuracy", "max"), ("eval/margin", "max"),
            ("eval/chosen_logp", None), ("eval/rejected_logp", None),
        ),
        config_keys=(
            "model", "data.path", "dpo.loss", "dpo.beta", "dpo.label_smoothing", "dpo.simpo_gamma",
            "dpo.precompute_reference",
            "train.epochs", "train.max_steps", "train.batch_size", "optim.lr", "lora.enabled", "seed",
        ),
        length_keys=("train.max_steps",),
    ),
    "rl": KindSpec(
        title="RL",
        headline=(
            ("reward/raw_mean", "max"), ("kl/ref", None), ("policy_ppl", None), ("response/length_mean", None),
            ("response/distinct2", None), ("policy/clip_fraction", None), ("value/loss", "min"),
            ("value/explained_variance", "max"),
        ),
        config_keys=(
            "preset", "model.policy", "model.reward_model", "data.prompts", "train.iterations",
            "rollout.batch_size", "rollout.max_new_tokens", "rollout.samples_per_prompt", "policy.loss",
            "advantage.estimator", "kl.beta", "kl.adaptive",
            "policy_optim.lr", "critic_optim.lr", "model.lora.enabled", "seed",
        ),
        length_keys=("train.iterations",),
    ),
}  # fmt: skip

GROUP_TITLES: dict[str, str] = {
    "train": "Training batches (loss, gradient norm, learning rate)",
    "eval": "Held-out evaluation",
    "reward": "Reward-model scores of the sampled responses",
    "kl": "KL to the reference policy",
    "perplexity": "Perplexity of the sampled responses (policy and reference)",
    "response": "Responses (length, EOS rate, diversity)",
    "policy": "Policy update (loss, clipping, ratios, entropy)",
    "value": "Critic (value loss, explained variance)",
    "mismatch": "Sampler vs trainer log-probs of the same tokens (KL, max ratio, mean |diff|)",
    "advantage": "Advantages and returns",
    "critic_pretrain": "Critic pre-training (policy frozen)",
    "speed": "Speed (seconds per phase, tokens per second)",
}
GROUP_ORDER = tuple(GROUP_TITLES)
BY_HAND = {"policy_ppl": "perplexity", "ref_ppl": "perplexity"}
PANEL_BY_HAND = {"policy_ppl": ("perplexity", "policy"), "ref_ppl": ("perplexity", "reference")}
SUFFIXES = ("_mean", "_min", "_max", "_std")  # statistics of one quantity: lines of one panel
PREFIX_GROUPS = {"time": "speed", "throughput": "speed", "return": "advantage"}
NOT_PLOTTED = {"collapse", "stop"}  # flags of a record, not monitors


def group_of(key: str) -> str:
    """The monitor group of a metric key."""
    if key in BY_HAND:
        return BY_HAND[key]
    prefix = key.split("/", 1)[0] if "/" in key else "other"
    return PREFIX_GROUPS.get(prefix, prefix)


def group_title(group: str) -> str:
    return GROUP_TITLES.get(group, group)


def ordered_groups(groups) -> list[str]:
    """Known groups in their reading order, then the others alphabetically."""
    known = [g for g in GROUP_ORDER if g in groups]
    return known + sorted(g for g in groups if g not in GROUP_TITLES)


def config_value(config: dict, dotted: str):
    """The value at a dotted key of a nested dict, or KeyError."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def panel_of(key: str) -> tuple[str, str]:
    """(panel title, line label) of a metric key: the statistics of one quantity (`length_mean`,
    `length_max`) share a panel, and so do the phase timings (`time/*`)."""
    if key in PANEL_BY_HAND:
        return PANEL_BY_HAND[key]
    if key.startswith("time/"):
        return "time per phase (s)", key[len("time/") :]
    for suffix in SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix) and not key.endswith("/" + suffix[1:]):
            return key[: -len(suffix)], suffix[1:]
    return key, key.rsplit("/", 1)[-1]
