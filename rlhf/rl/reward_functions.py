"""Rewards computed by Python functions (`--reward-fn module:function`, `reward.functions`), alone or
added to a reward model's score (docs/algorithms.md#31-reward-functions).

A reward function is any callable

    fn(prompts: list[str], responses: list[str], response_token_ids: list[list[int]], rows: list[dict])
        -> one float per response (a list, tuple, 1-D array or tensor of length B)

`response_token_ids` are each response's real tokens (its EOS included when it ended with one);
`rows` are the prompt file's records (every field of the line, e.g. a reference answer), one per
response. The total reward is ``model_weight * RM score + sum_k weight_k * fn_k``; every part is
logged. Nothing is imported unless the user names it; a function that raises, returns the wrong
number of values or a non-finite one stops the run with a message naming it and the row.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlhf.config import ConfigError


class RewardFunctionError(ConfigError):
    """A reward function that cannot be loaded or that returned something unusable (exit code 2)."""


@dataclass(frozen=True)
class RewardFunction:
    name: str  # "module:function", as the user wrote it
    weight: float
    fn: Callable


def parse_specs(specs: Sequence[object], key: str = "reward.functions") -> list[tuple[str, float]]:
    """`["pkg.mod:fn", {"name": "pkg.mod:other", "weight": 0.5}]` -> [(name, weight)], checked."""
    parsed = []
    for i, spec in enumerate(specs):
        if isinstance(spec, str):
            name, weight = spec, 1.0
        elif isinstance(spec, dict) and set(spec) <= {"name", "weight"} and "name" in spec:
            name, weight = spec["name"], spec.get("weight", 1.0)
        else:
            raise RewardFunctionError(
                f"{key}[{i}] is {spec!r}. Fix: 'module:function' or {{name: 'module:function', weight: 1.0}}."
            )
        module, _, attribute = str(name).partition(":")
        if not module or not attribute:
            raise RewardFunctionError(
                f"{key}[{i}] is {name!r}: name the module and the function, as 'module:function' "
                "(e.g. rlhf.worlds.reward:gold_reward). Fix: --reward-fn package.module:function."
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise RewardFunctionError(f"{key}[{i}] ({name}): weight must be a finite number, got {weight!r}.")
        parsed.append((str(name), float(weight)))
    return parsed


def load_reward_functions(specs: Sequence[object], key: str = "reward.functions") -> list[RewardFunction]:
    """Import each named function (and only those)."""
    loaded = []
    for name, weight in parse_specs(specs, key):
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise RewardFunctionError(
                f"reward function {name}: cannot import module {module_name!r} ({err}). Fix: check the name, "
                "and that its directory is on PYTHONPATH (or installed)."
            ) from None
        fn = module
        for part in attribute.split("."):
            fn = getattr(fn, part, None)
        if not callable(fn):
            raise RewardFunctionError(
                f"reward function {name}: module {module_name!r} has no callable {attribute!r}. "
                "Fix: name a function defined in that module."
            )
        loaded.append(RewardFunction(name, weight, fn))
    return loaded


def call_reward_function(
    reward: RewardFunction,
    prompts: list[str],
    responses: list[str],
    response_token_ids: list[list[int]],
    rows: list[dict],
    *,
    where: str = "",
) -> torch.Tensor:
    """The function's rewards as a float32 [B] tensor; any failure a RewardFunctionError naming it."""
    fix = "Fix: make it return one finite float per response, in order; stopped before training on it."
    size = len(prompts)
    try:
        out = reward.fn(prompts, responses, response_token_ids, rows)
    except Exception as err:  # the user's code: whatever it raises stops the run with its name
        raise RewardFunctionError(
            f"reward function {reward.name} raised {type(err).__name__}: {err} ({where}{size} responses; "
            f"the first: {responses[0][:60]!r} to {prompts[0][:60]!r}). Fix: debug the function on that input."
        ) from None
    try:
        values = torch.as_tensor(out, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        raise RewardFunctionError(
            f"reward function {reward.name} returned {type(out).__name__}, not numbers ({where}{size} responses). {fix}"
        ) from None
    if values.shape != (size,):
        raise RewardFunctionError(
            f"reward function {reward.name} returned shape {tuple(values.shape)} for {size} responses "
            f"({where}); expected ({size},). {fix}"
        )
    bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise RewardFunctionError(
            f"reward function {reward.name} returned {float(values[i])} for row {i} ({where}response "
            f"{responses[i][:60]!r} to prompt {prompts[i][:60]!r}; {len(bad)} non-finite in all). {fix}"
        )
    return values.float()


def weighted_reward(
    functions: Sequence[RewardFunction],
    model_scores: torch.Tensor | None,
    model_weight: float,
    prompts: list[str],
    responses: list[str],
    response_token_ids: list[list[int]],
    rows: list[dict],
    *,
    where: str = "",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(total [B], {part name: its weighted values [B]}): ``model_weight * RM + sum weight_k * fn_k``."""
    parts: dict[str, torch.Tensor] = {}
    if model_scores is not None:
        parts["reward_model"] = model_weight * model_scores.detach().float().cpu()
    for reward in functions:
        values = call_reward_function(reward, prompts, responses, response_token_ids, rows, where=where)
        parts[reward.name] = parts.get(reward.name, 0) + reward.weight * values
    total = torch.stack(list(parts.values())).sum(0)
    device = model_scores.device if model_scores is not None else "cpu"
    return total.to(device), parts


def part_metrics(parts: dict[str, torch.Tensor]) -> dict[str, float]:
    """`reward/part/<name>`: the mean weighted value of each part (logged beside the total)."""
    return {f"reward/part/{name}": float(values.mean()) for name, values in parts.items()}


def rollout_texts(tokenizer, rollout) -> tuple[list[str], list[str], list[list[int]]]:
    """(prompt texts, response texts without EOS, response token ids with the EOS) of a rollout."""
    from rlhf.evaluation.judging import decode_responses

    prompts = [
        tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True).strip()
        for ids, mask in zip(rollout.prompt_ids.tolist(), rollout.prompt_mask.tolist())
    ]
    token_ids = [
        [t for t, m in zip(ids, mask) if m]
        for ids, mask in zip(rollout.response_ids.tolist(), rollout.response_mask.tolist())
    ]
    return prompts, decode_responses(tokenizer, rollout), token_ids


def judge_with_functions(judge_factory, functions: Sequence[RewardFunction], tokenizer, rows: list[dict]):
    """`rlhf eval`'s judge factory with the reward functions added (weight each; the judge's own score,
    if any, with weight 1): `factory(start, end) -> judge(rollout, responses) -> [B]`."""

    def factory(start: int, end: int):
        base = judge_factory(start, end) if judge_factory is not None else None

        def judge(rollout, responses: list[str]) -> torch.Tensor:
            scores = base(rollout, responses) if base is not None else None
            prompts, _, token_ids = rollout_texts(tokenizer, rollout)
            total, _ = weighted_reward(
                functions, scores, 1.0, prompts, responses, token_ids, rows[start:end], where="rlhf eval, "
            )
            return total.cpu()

        return judge

    return factory
