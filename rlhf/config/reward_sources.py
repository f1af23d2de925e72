"""The reward sources of an `rlhf train` run, in the order `reward.weights` follows: the reward model
(or the reward server standing for it), the LLM judge, then each reward function (docs/algorithms.md
§31). Their weighted scores are summed; an environment's rewards are added unweighted."""

from __future__ import annotations

import math
from typing import Any

from rlhf.config.checks import refuse


def reward_sources(config: Any) -> list[tuple[str, str]]:
    """[(the source's name in the metrics, how the command line gives it)] of an RLConfig, in order."""
    reward = config.reward
    sources = []
    if config.model.reward_model:
        sources.append(("reward_model", f"--reward-model {config.model.reward_model}"))
    elif reward.remote.url:
        sources.append(("reward_model", f"--reward-url {reward.remote.url}"))
    if reward.llm_judge.url:
        sources.append(("llm_judge", f"--judge-url {reward.llm_judge.url}"))
    for spec in reward.functions:
        name = str(spec.get("name")) if isinstance(spec, dict) else str(spec)
        sources.append((name, f"--reward-fn {name}"))
    return sources


def check_reward_weights(config: Any, prefix: str = "") -> None:
    """`reward.weights`, when given: one finite number per source, and no second weight for a source
    (`reward.model_weight`, a function's own `weight`)."""
    weights = config.reward.weights
    if not weights:
        return
    key = f"{prefix}reward.weights"
    sources = reward_sources(config)
    listed = ", ".join(f"{i + 1}. {said}" for i, (_, said) in enumerate(sources)) or "none"
    if not isinstance(weights, list) or any(
        isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) for w in weights
    ):
        refuse(f"{key} is {weights!r}, not a list of finite numbers. Fix: --{key} '[1.0, 0.5]'.", key)
    if len(weights) != len(sources):
        refuse(
            f"{key} holds {len(weights)} weight{'s' if len(weights) != 1 else ''} for {len(sources)} reward "
            f"source{'s' if len(sources) != 1 else ''} ({listed}). Fix: one weight per source, in that order "
            f"(reward model or --reward-url, --judge-url, then each --reward-fn), or drop {key}.",
            key,
        )
    if config.reward.model_weight != 1.0:
        refuse(
            f"{key} and {prefix}reward.model_weight ({config.reward.model_weight:g}) both weigh the reward "
            f"model. Fix: give its weight first in {key} and drop {prefix}reward.model_weight.",
            key,
        )
    weighted = [s["name"] for s in config.reward.functions if isinstance(s, dict) and "weight" in s]
    if weighted:
        refuse(
            f"{key} and the weight of {prefix}reward.functions entry {weighted[0]} both weigh that function. "
            f"Fix: give its weight in {key} and drop the entry's weight.",
            key,
        )


def source_weights(config: Any) -> dict[str, float]:
    """{source name: weight} of every non-function source (the reward model, the LLM judge):
    `reward.weights`' when given, else model_weight and 1 for the judge."""
    names = [name for name, _ in reward_sources(config)]
    given = config.reward.weights
    weights = dict(zip(names, given)) if given else {}
    out = {}
    if "reward_model" in names:
        out["reward_model"] = float(weights.get("reward_model", config.reward.model_weight))
    if "llm_judge" in names:
        out["llm_judge"] = float(weights.get("llm_judge", 1.0))
    return out


def function_weights(config: Any) -> list[float] | None:
    """The functions' weights from `reward.weights` (in reward.functions' order), None when not given."""
    given = config.reward.weights
    if not given:
        return None
    skip = len(reward_sources(config)) - len(config.reward.functions)
    return [float(w) for w in given[skip:]]
