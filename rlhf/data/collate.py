"""Batch token ids into padded tensors, and group examples into token-budget batches.

Padding sides (PEERS point 7): generation pads prompts on the left (`left_pad`), so every prompt
ends at the same column and new tokens follow it; training pads whole sequences on the right
(`right_pad`, `collate_sft`, `collate_pairs`). Every mask is built from sequence lengths, never by
comparing ids with `pad_id`: the pad id may equal the EOS id (PEERS point 8), and the EOS is a
real token that the losses and the reward model must see.

Mask dtypes: `attention_mask` is int64 (the Hugging Face convention); the masks that weight
losses or select tokens (`loss_mask`, `prompt_mask`, `response_mask`) are float32 0/1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100  # the label Hugging Face causal LMs skip in their loss

TokenIds = Sequence[int] | torch.Tensor


def _as_lists(seqs: Sequence[TokenIds], what: str) -> list[list[int]]:
    if len(seqs) == 0:
        raise ValueError(f"cannot batch zero {what}")
    rows = [s.tolist() if isinstance(s, torch.Tensor) else list(s) for s in seqs]
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"{what} {i} is empty; every sequence needs at least one token")
    return rows


def left_pad(seqs: Sequence[TokenIds], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, P], attention_mask [B, P]) with each sequence flush right (padding on the left)."""
    return _padded(seqs, pad_id, left=True)


def right_pad(seqs: Sequence[TokenIds], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, L], attention_mask [B, L]) with each sequence flush left (padding on the right)."""
    return _padded(seqs, pad_id, left=False)


def _padded(seqs: Sequence[TokenIds], pad_id: int, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows = _as_lists(seqs, "sequence")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        start = width - len(row) if left else 0
        ids[i, start : start + len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, start : start + len(row)] = 1
    return ids, mask


def _prompt_response_batch(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int, eos_id: int | None
) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response rows with attention, prompt and response masks from lengths."""
    if eos_id is not None:
        for i, response in enumerate(responses):
            if response[-1] != eos_id:
                raise ValueError(
                    f"response {i} ends with token {response[-1]}, not EOS {eos_id}; "
                    "encode responses with rlhf.data.tokenize.encode_response"
                )
    input_ids, attention_mask = right_pad([p + r for p, r in zip(prompts, responses)], pad_id)
    prompt_mask = torch.zeros(input_ids.shape, dtype=torch.float32)
    response_mask = torch.zeros(input_ids.shape, dtype=torch.float32)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        prompt_mask[i, : len(prompt)] = 1.0
        response_mask[i, len(prompt) : len(prompt) + len(response)] = 1.0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "prompt_mask": prompt_mask,
        "response_mask": response_mask,
        "prompt_lengths": torch.tensor([len(p) for p in prompts], dtype=torch.long),
        "response_lengths": torch.tensor([len(r) for r in responses], dtype=torch.long),
        "last_index": torch.tensor(
            [len(p) + len(r) - 1 for p, r in zip(prompts, responses)], dtype=torch.long
        ),
    }


def collate_sft(
    prompt_ids_list: Sequence[TokenIds],
    response_ids_list: Sequence[TokenIds],
    pad_id: int,
    eos_id: int | None = None,
) -> dict[str, torch.Tensor]:
    """A right-padded SFT batch of prompt+response rows.

    Keys: `input_ids`, `attention_mask` [B, L]; `loss_mask` [B, L] float, 1 exactly on response
    tokens (EOS included): the SFT loss is the next-token loss of the tokens under `loss_mask`,
    i.e. logits[:, :-1] against input_ids[:, 1:] weighted by loss_mask[:, 1:]; `labels` [B, L],
    the same selection for Hugging Face models (`input_ids` under loss_mask, -100 elsewhere);
    `prompt_mask`, `response_mask` (= loss_mask), `prompt_lengths`, `response_lengths`,
    `last_index` (column of each row's last real token). `eos_id` given: every response must
    end with it (ValueError otherwise).
    """
    prompts, responses = _check_counts(("prompt", prompt_ids_list), ("response", response_ids_list))
    batch = _prompt_response_batch(prompts, responses, pad_id, eos_id)
    batch["loss_mask"] = batch["response_mask"]
    batch["labels"] = torch.where(batch["response_mask"] > 0, batch["input_ids"], IGNORE_INDEX)
    return batch


@dataclass
class PtxBatches:
    """PPO-ptx's SFT rows, encoded ((prompt ids, response ids) each), and the size of a batch of
    them: plain data, so it reaches a policy in another process (a Ray actor) as it is; the policy
    draws its batches with `draw` from a generator of its own."""

    rows: list[tuple[list[int], list[int]]]
    batch_size: int
    pad_token_id: int

    def draw(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """A right-padded batch of `batch_size` rows drawn uniformly with replacement (`collate_sft`)."""
        index = torch.randint(0, len(self.rows), (self.batch_size,), generator=generator).tolist()
        return collate_sft(
            [self.rows[i][0] for i in index], [self.rows[i][1] for i in index], self.pad_token_id
        )


def collate_pairs(
    prompt_ids_list: Sequence[TokenIds],
    chosen_ids_list: Sequence[TokenIds],
    rejected_ids_list: Sequence[TokenIds],
    pad_id: int,
    eos_id: int | None = None,
) -> dict[str, torch.Tensor]:
    """One right-padded batch of 2B rows for a reward model: rows 0..B-1 are prompt+chosen,
    rows B..2B-1 are prompt+rejected (pair i is rows i and B + i).

    Keys as `collate_sft` minus the SFT labels: `input_ids`, `attention_mask`, `prompt_mask`,
    `response_mask` (1 on response tokens, EOS included), `prompt_lengths`, `response_lengths`,
    and `last_index` [2B], the column of each row's EOS, where the reward model reads its score.
    """
    prompts, chosen, rejected = _check_counts(
        ("prompt", prompt_ids_list),
        ("chosen response", chosen_ids_list),
        ("rejected response", rejected_ids_list),
    )
    return _prompt_response_batch(prompts + prompts, chosen + rejected, pad_id, eos_id)


def _check_counts(*named: tuple[str, Sequence[TokenIds]]) -> list[list[list[int]]]:
    counts = {name: len(seqs) for name, seqs in named}
    if len(set(counts.values())) != 1:
        raise ValueError(f"every list must hold one entry per example, got counts {counts}")
    return [_as_lists(seqs, name) for name, seqs in named]


def token_budget_batches(
    lengths: Sequence[int],
    max_tokens: int,
    max_batch: int | None = None,
    seed: int | None = 0,
    min_batch: int = 1,
) -> list[list[int]]:
    """Group example indices into batches whose padded size (rows x longest row) is at most
    `max_tokens`, with at most `max_batch` rows; every index appears in exactly one batch.

    Examples are sorted by length (ties broken by a seeded shuffle) and packed greedily, so a
    batch holds examples of similar length and about `max_tokens` tokens: the PPO paper's reward
    model batches by token count, between 4 and 128 pairs (PPO paper §4.2). A batch holds at least
    `min_batch` rows: below that the token budget gives way (long examples), and a last batch
    left shorter joins the one before it when `max_batch` allows. The batch order is shuffled
    with `seed` (`seed=None`: neither shuffle; batches come shortest first). An example longer
    than `max_tokens` is an error.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    if min_batch < 1 or (max_batch is not None and min_batch > max_batch):
        raise ValueError(f"min_batch must be in [1, max_batch={max_batch}], got {min_batch}")
    for index, length in enumerate(lengths):
        if length < 0 or length > max_tokens:
            raise ValueError(
                f"example {index} has {length} tokens, which does not fit max_tokens={max_tokens}; "
                "truncate the examples or raise max_tokens"
            )
    order = list(range(len(lengths)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: equal lengths keep the shuffled order
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = lengths[index]  # ascending order: the new example is the longest so far
        full = max_batch is not None and len(current) >= max_batch
        over_budget = (len(current) + 1) * longest > max_tokens and len(current) >= min_batch
        if current and (full or over_budget):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        short_tail = len(current) < min_batch and batches
        if short_tail and (max_batch is None or len(batches[-1]) + len(current) <= max_batch):
            batches[-1].extend(current)
        else:
            batches.append(current)
    if seed is not None:
        random.Random(seed + 1).shuffle(batches)
    return batches
