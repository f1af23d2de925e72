"""A judge-free verdict from held-out human labels (docs/algorithms.md §38, which gives the formulas):
on preference pairs no model was trained on, did the policy P raise the log-likelihood of the response
people chose, relative to a reference B, more than that of the one they rejected?

Per pair, the margin m_i = r_P(y_c) - r_P(y_r) with r_P(y) = log pi_P(y | x) - log pi_B(y | x) (summed
response log-probs, EOS included). `accuracy`: the share of pairs with m_i > 0, a tie counting half,
with a 95% Wilson interval; the margin with a 95% normal interval; `per_token_accuracy` on r_P(y) / |y|."""

from __future__ import annotations

import contextlib
import math

import torch

from rlhf.data.collate import collate_pairs
from rlhf.evaluation.judging import wilson_interval
from rlhf.models.device import model_device, to_device
from rlhf.models.precision import Precision
from rlhf.train.lm_loss import sequence_logprobs


@torch.inference_mode()
def pair_logprobs(
    model,
    prompts: list[list[int]],
    chosen: list[list[int]],
    rejected: list[list[int]],
    pad_id: int,
    batch_size: int = 8,
    *,
    precision: Precision | None = None,
    on_batch=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs ([n] float64 each, in input order) of each pair's chosen and rejected response
    given its prompt, under the causal LM `model`, `batch_size` pairs a forward (right-padded: a
    row's figure does not depend on its batch's padding). Pairs of similar length share a batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    was_training = model.training
    model.eval()
    device = model_device(model)
    n = len(prompts)
    out_chosen = torch.zeros(n, dtype=torch.float64)
    out_rejected = torch.zeros(n, dtype=torch.float64)
    order = sorted(range(n), key=lambda i: 2 * len(prompts[i]) + len(chosen[i]) + len(rejected[i]))
    try:
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            batch = collate_pairs(
                [prompts[i] for i in index], [chosen[i] for i in index], [rejected[i] for i in index], pad_id
            )
            batch = to_device(batch, device)
            with precision.autocast() if precision is not None else contextlib.nullcontext():
                logp = sequence_logprobs(
                    model, batch["input_ids"], batch["attention_mask"], batch["response_mask"]
                )
            logp = logp.double().cpu()
            out_chosen[index], out_rejected[index] = logp[: len(index)], logp[len(index) :]
            if on_batch is not None:
                on_batch(len(index))
    finally:
        model.train(was_training)
    return out_chosen, out_rejected


def _share(margins: torch.Tensor) -> dict:
    """wins (m > 0), ties (m == 0), losses, and the accuracy (ties half) with its Wilson interval."""
    n = len(margins)
    wins, ties = int((margins > 0).sum()), int((margins == 0).sum())
    successes = wins + 0.5 * ties
    return {
        "wins": wins,
        "ties": ties,
        "losses": n - wins - ties,
        "accuracy": successes / n if n else None,
        "ci95": wilson_interval(successes, n) if n else None,
    }


def _mean_ci(values: torch.Tensor, z: float = 1.96) -> tuple[float | None, list[float] | None]:
    n = len(values)
    if not n:
        return None, None
    mean = float(values.mean())
    half = z * float(values.std()) / math.sqrt(n) if n > 1 else 0.0
    return mean, [mean - half, mean + half]


def label_pair_verdict(
    policy_chosen,
    policy_rejected,
    baseline_chosen,
    baseline_rejected,
    chosen_tokens=None,
    rejected_tokens=None,
) -> dict:
    """The verdict of the module docstring from the four summed log-probs per pair (sequences of n
    floats); `chosen_tokens` / `rejected_tokens` (response lengths in tokens, >= 1) add the per-token
    accuracy. Every input must be finite (ValueError naming the first bad pair otherwise)."""
    values = [
        torch.as_tensor(v, dtype=torch.float64).flatten()
        for v in (policy_chosen, policy_rejected, baseline_chosen, baseline_rejected)
    ]
    n = len(values[0])
    if any(len(v) != n for v in values):
        raise ValueError(f"the four log-prob lists must be equally long, got {[len(v) for v in values]}")
    for name, v in zip(("policy chosen", "policy rejected", "baseline chosen", "baseline rejected"), values):
        bad = (~torch.isfinite(v)).nonzero()
        if len(bad):
            raise ValueError(f"{name} log-prob of pair {int(bad[0])} is {float(v[bad[0]])} (not finite)")
    chosen_ratio = values[0] - values[2]
    rejected_ratio = values[1] - values[3]
    margins = chosen_ratio - rejected_ratio
    mean, interval = _mean_ci(margins)
    result = {"n": n, **_share(margins), "margin_mean": mean, "margin_ci95": interval}
    result["margin_median"] = float(margins.median()) if n else None
    for name, ratio in (("chosen", chosen_ratio), ("rejected", rejected_ratio)):
        result[f"{name}_logratio_mean"], result[f"{name}_logratio_ci95"] = _mean_ci(ratio)
    if chosen_tokens is not None and rejected_tokens is not None:
        lc = torch.as_tensor(chosen_tokens, dtype=torch.float64).flatten()
        lr = torch.as_tensor(rejected_tokens, dtype=torch.float64).flatten()
        if len(lc) != n or len(lr) != n or bool((lc < 1).any()) or bool((lr < 1).any()):
            raise ValueError("chosen_tokens / rejected_tokens must hold one length >= 1 per pair")
        per_token = _share(chosen_ratio / lc - rejected_ratio / lr)
        result["per_token_accuracy"] = per_token["accuracy"]
        result["per_token_ci95"] = per_token["ci95"]
    return result
