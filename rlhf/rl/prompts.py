"""An endless, seeded, resumable stream of prompt batches (shuffled each epoch)."""

from __future__ import annotations

from typing import Any

import torch


class PromptStream:
    def __init__(self, prompts: list[list[int]], seed: int):
        if not prompts:
            raise ValueError(
                "no prompts to sample from. Fix: check data.prompts (the file has no usable rows)."
            )
        self.prompts = prompts
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self.order = torch.randperm(len(prompts), generator=self.generator).tolist()
        self.last_indices: list[int] = []  # positions in `prompts` of the last batch

    def next_batch(self, size: int) -> list[list[int]]:
        batch: list[list[int]] = []
        self.last_indices = []
        while len(batch) < size:
            if self.position == len(self.order):
                self.epoch += 1
                self.position = 0
                self.order = torch.randperm(len(self.prompts), generator=self.generator).tolist()
            batch.append(self.prompts[self.order[self.position]])
            self.last_indices.append(self.order[self.position])
            self.position += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "order": self.order,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.position = state["position"]
        self.order = list(state["order"])
        self.generator.set_state(state["generator"])
