"""The demo's evaluation of a policy on held-out prompts: proxy and gold reward, KL to the
reference, perplexity, length, distinct-2 (the figures of docs/results.md).

It asks for its rollout and forwards by role name, as the RL loop does (rlhf/runtime/protocol.py):
`sample(prompts, sampling, seed)` and `forward(role, sequences, temperature)`. An RL run's trainer
answers through its runtime (local, torchrun or Ray: the roles may live in other processes); a DPO
stage, whose policy and reference are plain modules in this process, through `ModulesInProcess`.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import nn

from rlhf.evaluation.judging import decode_responses, sample_responses
from rlhf.models.logprobs import response_logprobs
from rlhf.models.reference import ReferenceModel
from rlhf.models.sampling import Rollout, SamplingConfig
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.sequences import Sequences
from rlhf.rl.metrics import distinct_n
from rlhf.worlds import World

TEMPERATURE = 1.0  # the held-out responses are sampled, and their log-probs read, at temperature 1


class HeldOutModels(Protocol):
    """What the evaluation asks of the models it evaluates: a `Runtime`'s two calls."""

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout: ...

    def forward(self, role: str, sequences: Sequences, temperature: float | None = None) -> torch.Tensor: ...


class ModulesInProcess:
    """The evaluator's two calls over modules in this process: the whole batch in one forward."""

    def __init__(
        self, policy: nn.Module, reference: ReferenceModel, reward_model: ScalarHeadModel, tokenizer: Any
    ) -> None:
        self.policy, self.reference, self.reward_model = policy, reference, reward_model
        self.tokenizer = tokenizer

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        rollouts, _ = sample_responses(
            self.policy, self.tokenizer, prompts, sampling, seed=seed, batch_size=len(prompts)
        )
        return rollouts[0]

    def forward(self, role: str, sequences: Sequences, temperature: float | None = None) -> torch.Tensor:
        s, t = sequences, TEMPERATURE if temperature is None else temperature
        if role == "reward_model":
            return self.reward_model.score(s.input_ids, s.attention_mask)
        if role == "policy":
            return response_logprobs(self.policy, s.input_ids, s.attention_mask, s.prompt_length, t)[0]
        if role == "reference":
            return self.reference.logprobs(s.input_ids, s.attention_mask, s.prompt_length, temperature=t)
        raise ValueError(f"no role {role!r} in a held-out evaluation (policy, reference, reward_model)")


@torch.inference_mode()
def evaluate_policy(
    models: HeldOutModels,
    tokenizer: Any,
    world: World,
    prompts: list[str],
    prompt_ids: list[list[int]],
    *,
    seed: int,
    max_new_tokens: int,
) -> tuple[dict[str, float], list[dict[str, Any]], torch.Tensor]:
    """(figures, the first 4 samples, gold rewards [N]) of the policy `models` answers for (a
    runtime, or ModulesInProcess): one response per prompt sampled from `seed`; KL to the reference
    is the summed k1 per response, log pi - log pi_ref, averaged over responses."""
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=TEMPERATURE)
    rollout = models.sample(prompt_ids, sampling, seed)
    texts = decode_responses(tokenizer, rollout)
    sequences = rollout.sequences
    proxy = models.forward("reward_model", sequences)
    gold = torch.tensor(
        world.gold_rewards(prompts, texts, rollout.ended_with_eos.tolist()), dtype=torch.float32
    )
    rmask = rollout.response_mask.float()
    logp = models.forward("policy", sequences, temperature=TEMPERATURE)
    ref = models.forward("reference", sequences, temperature=TEMPERATURE)
    kl = ((logp - ref) * rmask).sum(1).mean()
    nll = -(logp * rmask).sum() / rmask.sum().clamp(min=1)
    diag = world.diagnostics(prompts, texts, rollout.ended_with_eos.tolist())
    record = {
        "proxy": float(proxy.mean()),
        "gold": float(gold.mean()),
        "gold_std": float(gold.std()),
        "kl": float(kl),
        "ppl": math.exp(float(nll)),
        "length": float(rmask.sum(1).mean()),
        "distinct2": distinct_n(rollout.response_ids, rollout.response_mask, n=2),
        "topic_rate": diag["topic_rate"],
        "off_topic_rate": diag["off_topic_rate"],
        "repetition_rate": diag["repetition_rate"],
        "eos_rate": float(rollout.ended_with_eos.float().mean()),
    }
    samples = [
        {"prompt": p, "response": t, "proxy": round(float(a), 3), "gold": round(float(b), 3)}
        for p, t, a, b in list(zip(prompts, texts, proxy, gold))[:4]
    ]
    return record, samples, gold
