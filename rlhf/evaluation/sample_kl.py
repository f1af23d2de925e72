"""How far a policy moved from its baseline, measured on the policy's own answers (eval.json's
"kl", docs/algorithms.md §38): per held-out prompt, the summed log-ratio
log pi_policy(y|x) - log pi_baseline(y|x) of the policy's sampled response y. Its mean is the k1
estimate of KL(pi_policy || pi_baseline) over responses of at most `max_new_tokens` tokens, exact in
expectation when the answers were drawn at temperature 1 without top-p (the default of `rlhf eval`);
at another temperature it is the log-ratio on the answers the policy gave, and says so."""

from __future__ import annotations

import contextlib
import math

import torch

from rlhf.models.logprobs import response_logprobs
from rlhf.models.precision import Precision
from rlhf.models.sampling import Rollout


@torch.no_grad()
def response_logprob_sums(model, rollouts: list[Rollout], precision: Precision | None = None) -> torch.Tensor:
    """[n] float64: each sampled response's summed log-prob (temperature 1, EOS included) under
    `model`, in the rollouts' order. The rollouts are left-padded prompts + right-padded responses, as
    the sampler wrote them."""
    was_training = model.training
    model.eval()
    sums = []
    try:
        for rollout in rollouts:
            with precision.autocast() if precision is not None else contextlib.nullcontext():
                logp, _ = response_logprobs(
                    model, rollout.input_ids, rollout.attention_mask, rollout.prompt_length
                )
            sums.append((logp.double() * rollout.response_mask.double()).sum(-1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64)


def sample_kl(
    policy_logps: torch.Tensor, baseline_logps: torch.Tensor, lengths: torch.Tensor, sampling: dict
) -> dict:
    """eval.json's "kl" from the policy's and the baseline's summed log-probs [n] of the policy's
    answers and the answers' token counts [n]: the mean log-ratio per answer with a normal 95%
    interval, per token (summed ratios over summed tokens), the n, and the sampling it holds for."""
    ratios = (policy_logps - baseline_logps).double()
    n = int(ratios.numel())
    tokens = int(lengths.sum())
    exact = sampling.get("temperature") == 1.0 and sampling.get("top_p", 1.0) == 1.0
    result: dict = {
        "n": n,
        "mean": None,
        "ci95": None,
        "per_token": None,
        "tokens": tokens,
        "estimator": "k1: mean of log pi_policy(y|x) - log pi_baseline(y|x), y ~ policy",
        "exact_in_expectation": bool(exact and sampling.get("do_sample", True)),
    }
    if n == 0:
        return result
    mean = float(ratios.mean())
    half = 1.96 * float(ratios.std(unbiased=True)) / math.sqrt(n) if n > 1 else float("nan")
    result["mean"] = mean
    result["ci95"] = [mean - half, mean + half] if n > 1 else None
    result["per_token"] = float(ratios.sum()) / tokens if tokens else None
    return result
