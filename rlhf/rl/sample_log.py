"""The sample responses of an RL run: the first `log.samples_to_log` rows of each logged iteration's
rollout (prompt, response, score, whether it ended with EOS, and the gold reward when the prompts
come from a built-in world whose `world.json` sits beside them) go to `samples.jsonl`, where
`rlhf report RUN` shows those of the first and the last iteration.

    samples = SampleLog(config, tokenizer)
    samples.keep(rollout, raw_scores)          # every rollout; costs nothing until written
    samples.write(logger, iteration)           # on the iterations written to metrics.jsonl"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlhf.config import RLConfig
from rlhf.models.sampling import Rollout
from rlhf.monitor import MetricsLogger
from rlhf.rundir.directory import SilentLogger
from rlhf.worlds import World


class SampleLog:
    def __init__(self, config: RLConfig, tokenizer: Any) -> None:
        self.n = config.log.samples_to_log
        self.tokenizer = tokenizer
        self.world = world_of_prompts(config.data.prompts) if self.n else None
        self._kept: tuple[torch.Tensor, ...] | None = None

    def keep(self, rollout: Rollout, raw_scores: torch.Tensor) -> None:
        """Remember the first rows of this rollout (tensors only; decoding waits for `write`)."""
        if self.n:
            n = self.n
            self._kept = (
                rollout.prompt_ids[:n],
                rollout.prompt_mask[:n],
                rollout.response_ids[:n],
                rollout.attention_mask[:n, rollout.prompt_length :],  # env replies too (multi-turn)
                rollout.ended_with_eos[:n],
                raw_scores[:n],
            )

    def rows(self) -> list[dict[str, Any]]:
        """The kept rows as {"prompt", "response", "score", "ended_with_eos"[, "gold"]} (empty before
        any `keep`); `score` is the raw reward-model score, before any truncation penalty."""
        if self._kept is None:
            return []
        prompt_ids, prompt_mask, response_ids, response_mask, ended, scores = (t.cpu() for t in self._kept)
        prompts = [self._decode(ids[m.bool()]) for ids, m in zip(prompt_ids, prompt_mask)]
        responses = [self._decode(ids[m.bool()]) for ids, m in zip(response_ids, response_mask)]
        rows = [
            {"prompt": p, "response": r, "score": round(float(s), 4), "ended_with_eos": bool(e)}
            for p, r, s, e in zip(prompts, responses, scores, ended)
        ]
        if self.world is not None:
            gold = self.world.gold_rewards(prompts, responses, ended.tolist())
            for row, g in zip(rows, gold):
                row["gold"] = round(float(g), 4)
        return rows

    def write(self, logger: MetricsLogger | SilentLogger, iteration: int) -> None:
        if self.n and self._kept is not None:
            logger.log_samples(iteration, self.rows())

    def _decode(self, ids: torch.Tensor) -> str:
        text: str = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        return text


def world_of_prompts(prompts_path: str) -> World | None:
    """The built-in world that wrote the prompts file (its world.json beside it), else None."""
    if not prompts_path:
        return None
    world_file = Path(prompts_path).parent / "world.json"
    if not world_file.is_file():
        return None
    from rlhf.worlds import WorldConfigError, load_world

    try:
        return load_world(world_file)
    except (WorldConfigError, ValueError, OSError):
        return None  # a world.json of something else: no gold column, the run goes on
