"""The scorer of a sampled batch: raw scores from the reward model (or a reward server, `--reward-url`),
an LLM judge (`--judge-url`), the reward functions and the environment, then the shaping every raw
score gets: the truncation policy and DAPO's overlong penalty (docs/algorithms.md §5, §31, §37).

    raw       weighted sum of the sources (reward model | reward server, LLM judge, reward functions;
              `reward.weights`), + the environment's rewards; a response the judge gave no score is dropped
    hook      `raw_scores_hook(raw, iteration)`: the scores RL sees instead (the demo's worlds distort them)
    shaping   truncation policy (keep / penalize / drop), then the overlong penalty (DAPO §3.4)
Every layer reads one EpisodeRecord (rlhf/rl/episode_record.py): a multi-turn episode is scored on its
whole token sequence and measured on its own budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from rlhf.config import RLConfig
from rlhf.config.reward_sources import check_reward_weights, function_weights, source_weights
from rlhf.models.truncation import apply_truncation_policy
from rlhf.rl.dapo import overlong_buffer_tokens, shaped_scores
from rlhf.rl.episode_record import EpisodeRecord
from rlhf.rl.llm_judge import LLMJudge
from rlhf.rl.remote_reward import remote_reward
from rlhf.rl.reward_functions import load_reward_functions, part_metrics, rollout_texts, weighted_reward
from rlhf.runtime.protocol import Runtime
from rlhf.train.guards import require_finite_scores

RawScoresHook = Callable[[torch.Tensor, int], torch.Tensor]  # (raw scores [B], iteration) -> scores RL sees


class Scorer:
    """`score(record, rows, iteration)` -> (raw scores, scores after shaping, rows kept); `parts`: the
    last batch's reward parts (`reward/part/<source>` weighted, `reward/source/<source>` raw,
    `judge/unparsable`, `reward/overlong_penalty`) for the metrics."""

    def __init__(
        self,
        config: RLConfig,
        runtime: Runtime,
        prompt_rows: list[dict[str, Any]] | None = None,
        raw_scores_hook: RawScoresHook | None = None,
        status: Callable[[str], None] | None = None,
    ) -> None:
        self.config, self.runtime = config, runtime
        self.prompt_rows = prompt_rows  # the prompt file's records, for reward functions
        check_reward_weights(config)  # again: --reward-fn adds functions after the config's checks
        self.reward_functions = load_reward_functions(config.reward.functions)  # only those named
        weights = function_weights(config)  # reward.weights, when given, instead of each function's own
        if weights is not None:
            self.reward_functions = [
                dataclasses.replace(f, weight=w) for f, w in zip(self.reward_functions, weights)
            ]
        self.weights = source_weights(config)  # the reward model's and the judge's
        self.remote = remote_reward(config.reward.remote, runtime.tokenizer)  # None: no --reward-url
        judge = config.reward.llm_judge
        self.judge = LLMJudge(judge, "pointwise") if judge.url else None  # None: no --judge-url
        self.judged = torch.ones(0, dtype=torch.bool)  # the last batch's rows the judge scored
        self.raw_scores_hook = raw_scores_hook
        self.status = status  # shows "scoring" on the console line while it scores
        self.parts: dict[str, float] = {}

    def score(
        self, record: EpisodeRecord, rows: list[int], iteration: int, env_rewards: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(raw scores [B] as RL sees them, scores after the truncation policy and the overlong
        penalty [B], rows kept [B]); `rows`: the prompt file's rows of the batch's prompts;
        `env_rewards`: each episode's summed turn rewards."""
        c, rollout = self.config, record.rollout
        if self.status is not None:
            self.status("scoring")
        raw_scores = self.raw_scores(record, rows, iteration, env_rewards)
        if self.raw_scores_hook is not None:
            raw_scores = self.raw_scores_hook(raw_scores, iteration)
        # responses that hit max_new_tokens: keep, penalize or drop (docs/algorithms.md#5-truncated-responses)
        scores, keep = apply_truncation_policy(
            raw_scores,
            rollout.ended_with_eos,
            policy=c.rollout.truncated,
            penalty=c.rollout.truncation_penalty,
        )
        if self.judge is not None:  # a response the judge gave no score trains nothing
            keep = keep & self.judged.to(keep.device)
        if c.reward.overlong_buffer > 0:  # soft overlong punishment (DAPO §3.4; docs/algorithms.md §37)
            buffer = overlong_buffer_tokens(c.reward.overlong_buffer, record.budget)
            scores, penalty = shaped_scores(scores, record.policy_lengths, record.budget,
                                            buffer, c.reward.overlong_penalty_factor)  # fmt: skip
            self.parts["reward/overlong_penalty"] = float(penalty.mean())
        return raw_scores, scores, keep

    def raw_scores(
        self, record: EpisodeRecord, rows: list[int], iteration: int, env_rewards: torch.Tensor | None
    ) -> torch.Tensor:
        """The reward model's (or the server's) scores, the reward functions' and the environment's, summed [B]."""
        run, rollout = self.runtime, record.rollout
        raw_scores = run.forward("reward_model", rollout.sequences) if run.has_role("reward_model") else None
        if raw_scores is not None and not bool(torch.isfinite(raw_scores).all()):  # a broken RM stops the run
            texts = run.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
            require_finite_scores(
                raw_scores,
                model=f"the reward model {self.config.model.reward_model or '(given in code)'}",
                what=f"responses at iteration {iteration}:",
                row=lambda i: f"row {i} {texts[i][:60]!r}",
                consequence="Nothing of this iteration was used or saved; the last checkpoint is intact.",
                fix="the reward model is broken (diverged training or damaged weights): retrain it with "
                "`rlhf rm` (check its metrics.jsonl for a NaN loss) and start a new run.",
            )
        if self.remote is not None:  # a reward server's scores, checked (docs/reward_server.md)
            raw_scores = self.remote.score(rollout).to(rollout.response_mask.device)
        # the sources weighted and summed (docs/algorithms.md §31); a reward model alone: its score
        if self.reward_functions or self.judge is not None or self.config.reward.weights:
            raw_scores = self.weighted_sources(record, rows, iteration, raw_scores)
        if env_rewards is not None:  # the environment's rewards, summed over the turns, added
            env = env_rewards.to(rollout.response_mask.device)
            raw_scores = env if raw_scores is None else raw_scores + env
        assert raw_scores is not None
        return raw_scores

    def weighted_sources(
        self, record: EpisodeRecord, rows: list[int], iteration: int, model_scores: torch.Tensor | None
    ) -> torch.Tensor:
        """``w_RM * RM + w_judge * judge + sum_k w_k * fn_k`` [B]; each part's mean (weighted) and each
        source's (raw) kept for the metrics."""
        n = self.config.rollout.samples_per_prompt
        records = [dict(self.prompt_rows[i]) if self.prompt_rows else {} for i in rows for _ in range(n)]
        prompts, responses, token_ids = rollout_texts(self.runtime.tokenizer, record.rollout)
        sources: dict[str, torch.Tensor] = {}
        others: dict[str, tuple[torch.Tensor, float]] = {}
        if model_scores is not None:
            sources["reward_model"] = model_scores.detach().float().cpu()
        if self.judge is not None:
            found = self.judge.scores(prompts, responses, where=f"iteration {iteration}: ")
            self.judged = torch.tensor([v is not None for v in found], dtype=torch.bool)
            judged = torch.tensor([0.0 if v is None else v for v in found])  # 0: a dropped row's part
            sources["llm_judge"] = judged
            others["llm_judge"] = (judged, self.weights["llm_judge"])
        raw: dict[str, torch.Tensor] = {}
        total, parts = weighted_reward(
            self.reward_functions,
            model_scores,
            self.weights.get("reward_model", self.config.reward.model_weight),  # an RM given in code: its own
            prompts,
            responses,
            token_ids,
            records,
            where=f"iteration {iteration}, ",
            raw=raw,
            others=others,
        )
        self.parts = part_metrics(parts)
        for name, values in {**sources, **raw}.items():
            if name == "llm_judge":  # over the rows the judge scored
                values = values[self.judged]
            self.parts[f"reward/source/{name}"] = float(values.mean()) if len(values) else 0.0
        if self.judge is not None:
            self.parts["judge/unparsable"] = float((~self.judged).sum())
        return total.to(record.rollout.response_mask.device)
