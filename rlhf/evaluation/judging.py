"""Evaluation: mean reward of two policies on held-out prompts and the win/tie/loss rate between them.

A judge maps a rollout to one score per response: a reward model (`reward_model_judge`) or any
callable on texts, such as a built-in world's gold reward (`text_judge`).

Devices: each policy samples on its own device with a generator there (the same seed draws other
numbers on a GPU than on a CPU); scores come back as float32 CPU tensors.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch

from rlhf.data.collate import left_pad
from rlhf.models.device import model_device
from rlhf.models.precision import Precision
from rlhf.models.rollout_rows import concat_rollouts, select_rollout, trim_rollout
from rlhf.models.sampling import Rollout, SamplingConfig, generate
from rlhf.train.guards import require_finite_scores

Judge = Callable[[Rollout, list[str]], torch.Tensor]


def _autocast(precision: Precision | None):
    return precision.autocast() if precision is not None else contextlib.nullcontext()


def reward_model_judge(reward_model, micro_batch_size: int = 16, precision: Precision | None = None) -> Judge:
    """Scores from a reward model, run on its own device under `precision`."""
    device = model_device(reward_model)

    @torch.inference_mode()
    def judge(rollout: Rollout, responses: list[str]) -> torch.Tensor:
        ids, attn = rollout.input_ids.to(device), rollout.attention_mask.to(device)
        with _autocast(precision):
            scores = [
                reward_model.score(ids[i : i + micro_batch_size], attn[i : i + micro_batch_size])
                for i in range(0, len(ids), micro_batch_size)
            ]
        return torch.cat(scores).float().cpu()

    return judge


def text_judge(
    score_texts: Callable[[list[str], list[str], list[bool]], list[float]], prompts: list[str]
) -> Judge:
    """A judge from `score_texts(prompts, responses, ended_with_eos)`; `prompts` aligned with the rollout rows."""

    def judge(rollout: Rollout, responses: list[str]) -> torch.Tensor:
        return torch.tensor(
            score_texts(prompts, responses, rollout.ended_with_eos.tolist()), dtype=torch.float32
        )

    return judge


def decode_responses(tokenizer, rollout: Rollout) -> list[str]:
    """Response texts without the EOS and padding (lengths come from the mask, not from pad ids); a
    multi-turn episode's is its whole transcript, the environment's replies included (their tokens
    are real in the attention mask, not in the response mask)."""
    texts = []
    real = rollout.attention_mask[:, rollout.prompt_length :]
    for ids, mask, ended in zip(
        rollout.response_ids.tolist(), real.tolist(), rollout.ended_with_eos.tolist()
    ):
        n = int(sum(mask)) - (1 if ended else 0)
        texts.append(tokenizer.decode(ids[:n], skip_special_tokens=True).strip())
    return texts


def in_file_order(
    batches: list[Rollout], order: list[int], batch_size: int, pad_token_id: int
) -> list[Rollout]:
    """Rollouts of the prompts in file order, `batch_size` rows each, from `batches` whose rows are
    the prompts `order` (in that order); each batch trimmed of its all-padding columns."""
    joined = concat_rollouts(batches, pad_token_id)
    row_of = torch.empty(len(order), dtype=torch.long)
    row_of[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return [
        trim_rollout(select_rollout(joined, row_of[start : start + batch_size]))
        for start in range(0, len(order), batch_size)
    ]


@torch.inference_mode()
def sample_responses(
    policy,
    tokenizer,
    prompt_ids: list[list[int]],
    sampling: SamplingConfig,
    *,
    seed: int,
    batch_size: int = 32,
    precision: Precision | None = None,
    on_batch: Callable[[int], None] | None = None,
    stop_ids: Sequence[int] | None = None,
) -> tuple[list[Rollout], list[str]]:
    """One response per prompt, sampled on the policy's device (rollouts stay there); a response ends
    at one of `stop_ids` (default: the tokenizer's EOS; with a chat template,
    `rlhf.data.chat.stop_token_ids` adds its end-of-turn token); `on_batch(n)` after each batch of n
    prompts (progress display).

    Over several batches, prompts of similar length share one (a batch's prefill pads to its longest
    prompt; 1,000 SVAMP prompts in file order pad to 1.42x their tokens, sorted to 1.01x); the
    rollouts come back in file order, `batch_size` rows each, as the judges read them. One batch
    keeps the file order: its row i draws the sampler's row-i numbers, as `generate` on it would."""
    generator = torch.Generator(device=model_device(policy)).manual_seed(seed)
    order = list(range(len(prompt_ids)))
    if len(order) > batch_size:
        order.sort(key=lambda i: len(prompt_ids[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        ids, mask = left_pad([prompt_ids[i] for i in index], tokenizer.pad_token_id)
        with _autocast(precision):
            batches.append(
                generate(
                    policy,
                    ids,
                    mask,
                    sampling,
                    eos_token_id=tokenizer.eos_token_id if stop_ids is None else list(stop_ids),
                    pad_token_id=tokenizer.pad_token_id,
                    generator=generator,
                )
            )
        if on_batch is not None:
            on_batch(len(index))
    rollouts = in_file_order(batches, order, batch_size, tokenizer.pad_token_id)
    texts = [text for rollout in rollouts for text in decode_responses(tokenizer, rollout)]
    return rollouts, texts


def check_finite_scores(scores: torch.Tensor, judge_name: str, policy_name: str) -> None:
    """Stop (`guards.NonFiniteScoresError`) naming the judge, the policy and the prompts (1-based, in file
    order) whose responses got a NaN or infinite score."""
    require_finite_scores(
        scores,
        model=f"the judge {judge_name}",
        what=f"responses of {policy_name} at prompts",
        row=lambda i: str(i + 1),
        consequence="(1-based, in file order). No result was written.",
        fix="the judge is broken (diverged training or damaged weights): retrain it with `rlhf rm`, or pass "
        "another --judge.",
        limit=8,
    )


def score_rollouts(
    rollouts: list[Rollout], texts: list[str], judge_factory, on_batch: Callable[[int], None] | None = None
) -> torch.Tensor:
    """The judge's scores of sampled rollouts (`texts` their decoded responses, in order), on the CPU;
    `judge_factory(start, end) -> Judge` for the prompt rows; `on_batch(n)` after each rollout."""
    scores, start = [], 0
    for rollout in rollouts:
        end = start + rollout.input_ids.shape[0]
        scores.append(judge_factory(start, end)(rollout, texts[start:end]).cpu())
        if on_batch is not None:
            on_batch(end - start)
        start = end
    return torch.cat(scores)


def score_policy(
    policy,
    tokenizer,
    prompt_ids,
    judge_factory,
    sampling,
    *,
    seed: int,
    batch_size: int = 32,
    precision: Precision | None = None,
    stop_ids: Sequence[int] | None = None,
):
    """Sample one response per prompt and score it (`sample_responses`, then `score_rollouts`)."""
    rollouts, texts = sample_responses(
        policy,
        tokenizer,
        prompt_ids,
        sampling,
        seed=seed,
        batch_size=batch_size,
        precision=precision,
        stop_ids=stop_ids,
    )
    return score_rollouts(rollouts, texts, judge_factory), texts, rollouts


def mean_with_ci(values: torch.Tensor, z: float = 1.96) -> dict:
    n = len(values)
    mean = float(values.mean()) if n else 0.0
    std = float(values.std()) if n > 1 else 0.0
    half = z * std / math.sqrt(n) if n > 1 else 0.0
    return {"mean": mean, "std": std, "ci95": [mean - half, mean + half], "n": n}


def wilson_interval(successes: float, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval of a proportion (stays inside [0, 1], sane for small n)."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes <= 0 else max(0.0, centre - half)  # exact ends (rounding leaves ~1e-17)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return [low, high]


TIE_TOLERANCE = 1e-6  # score differences this small are ties


def winners(a: torch.Tensor, b: torch.Tensor, tie_tolerance: float = TIE_TOLERANCE) -> list[str]:
    """Per prompt, "a", "b" or "tie", counted as `compare_scores` counts them."""
    diff = a - b
    return ["a" if d > tie_tolerance else "b" if d < -tie_tolerance else "tie" for d in diff.tolist()]


def compare_scores(a: torch.Tensor, b: torch.Tensor, tie_tolerance: float = TIE_TOLERANCE) -> dict:
    """Win/tie/loss of `a` against `b` on paired prompts, with Wilson intervals; win rate counts ties as half."""
    if a.shape != b.shape:
        raise ValueError(f"paired scores differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    n = len(a)
    diff = a - b
    wins = int((diff > tie_tolerance).sum())
    losses = int((diff < -tie_tolerance).sum())
    ties = n - wins - losses
    win_rate = (wins + 0.5 * ties) / n if n else 0.0
    return {
        "n": n,
        "win": wins / n if n else 0.0,
        "tie": ties / n if n else 0.0,
        "loss": losses / n if n else 0.0,
        "win_ci95": wilson_interval(wins, n),
        "loss_ci95": wilson_interval(losses, n),
        "win_rate": win_rate,
        "win_rate_ci95": wilson_interval(wins + 0.5 * ties, n),
    }


def paired_samples(prompts, sources, texts: dict, scores: dict | None) -> list[dict]:
    """One record per prompt: its source and text, both responses, both scores and the winner.
    `texts` and `scores` map "policy" and "baseline" to aligned lists / tensors (scores None: no
    scoring judge, the records without scores)."""
    samples = [
        {
            "source": str(sources[i]) if sources[i] is not None else None,
            "prompt": prompts[i],
            "policy_response": texts["policy"][i],
            "baseline_response": texts["baseline"][i],
        }
        for i in range(len(prompts))
    ]
    if scores is None:
        return samples
    won = winners(scores["policy"], scores["baseline"])
    names = {"a": "policy", "b": "baseline", "tie": "tie"}
    for i, sample in enumerate(samples):
        sample["policy_score"] = float(scores["policy"][i])
        sample["baseline_score"] = float(scores["baseline"][i])
        sample["winner"] = names[won[i]]
    return samples
