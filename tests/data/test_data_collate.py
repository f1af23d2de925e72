"""Padding and masks checked by hand (pad id equal to the EOS id included), and token-budget batching."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.data import collate_pairs, collate_sft, left_pad, right_pad, token_budget_batches
from rlhf.data.collate import IGNORE_INDEX

EOS = 3
PAD = 3  # pad == EOS: the masks must still count the real EOS


def test_left_pad_by_hand():
    ids, mask = left_pad([[5, 6, 7], [8], torch.tensor([9, 3])], pad_id=PAD)
    assert ids.tolist() == [[5, 6, 7], [3, 3, 8], [3, 9, 3]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]  # the real trailing 3 of row 2 is attended
    assert ids.dtype == mask.dtype == torch.long


def test_right_pad_by_hand():
    ids, mask = right_pad([[5, 3], [8, 9, 10]], pad_id=PAD)
    assert ids.tolist() == [[5, 3, 3], [8, 9, 10]]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]


def test_batch_of_one():
    ids, mask = left_pad([[5, 6]], pad_id=0)
    assert ids.tolist() == [[5, 6]] and mask.tolist() == [[1, 1]]
    batch = collate_sft([[5]], [[6, EOS]], pad_id=PAD)
    assert batch["input_ids"].tolist() == [[5, 6, EOS]]
    assert batch["loss_mask"].tolist() == [[0.0, 1.0, 1.0]]


def test_collate_sft_by_hand_with_pad_equal_to_eos():
    batch = collate_sft([[10, 11, 12], [13]], [[20, EOS], [21, EOS]], pad_id=PAD, eos_id=EOS)
    assert batch["input_ids"].tolist() == [[10, 11, 12, 20, 3], [13, 21, 3, 3, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["prompt_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [
        [0, 0, 0, 1, 1],
        [0, 1, 1, 0, 0],
    ]  # the EOS is learned, pads are not
    assert batch["response_mask"].tolist() == batch["loss_mask"].tolist()
    assert batch["labels"].tolist() == [[-100, -100, -100, 20, 3], [-100, 21, 3, -100, -100]]
    assert batch["last_index"].tolist() == [4, 2]
    assert batch["prompt_lengths"].tolist() == [3, 1] and batch["response_lengths"].tolist() == [2, 2]
    assert batch["loss_mask"].dtype == torch.float32


def test_collate_pairs_by_hand_with_pad_equal_to_eos():
    batch = collate_pairs(
        [[10, 11], [12]], [[20, EOS], [21, 22, 23, EOS]], [[EOS], [24, EOS]], pad_id=PAD, eos_id=EOS
    )
    # rows: chosen 0, chosen 1, rejected 0, rejected 1
    assert batch["input_ids"].tolist() == [
        [10, 11, 20, 3, 3],
        [12, 21, 22, 23, 3],
        [10, 11, 3, 3, 3],
        [12, 24, 3, 3, 3],
    ]
    assert batch["attention_mask"].tolist() == [
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0],
    ]
    assert batch["prompt_mask"].tolist() == [
        [1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0],
    ]
    assert batch["response_mask"].tolist() == [
        [0, 0, 1, 1, 0],
        [0, 1, 1, 1, 1],
        [0, 0, 1, 0, 0],
        [0, 1, 1, 0, 0],
    ]
    # the reward model reads each row at its EOS, not at a pad that happens to share its id
    assert batch["last_index"].tolist() == [3, 4, 2, 2]
    rows = torch.arange(4)
    assert (batch["input_ids"][rows, batch["last_index"]] == EOS).all()
    assert "labels" not in batch


def test_collators_reject_bad_input():
    with pytest.raises(ValueError, match="response 1 ends with token 22, not EOS 3"):
        collate_sft([[1], [2]], [[5, EOS], [22]], pad_id=0, eos_id=EOS)
    with pytest.raises(ValueError, match="one entry per example"):
        collate_pairs([[1]], [[2, EOS]], [[2, EOS], [4, EOS]], pad_id=0)
    with pytest.raises(ValueError, match="chosen response 0 is empty"):
        collate_pairs([[1]], [[]], [[2, EOS]], pad_id=0)
    with pytest.raises(ValueError, match="cannot batch zero"):
        left_pad([], pad_id=0)
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        right_pad([[1], []], pad_id=0)


token_lists = st.lists(st.integers(0, 6), min_size=1, max_size=6)  # ids include the pad/EOS id 3


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(token_lists, token_lists, token_lists), min_size=1, max_size=4))
def test_pair_masks_follow_lengths(triples):
    prompts, chosen, rejected = (list(x) for x in zip(*triples))
    batch = collate_pairs(prompts, chosen, rejected, pad_id=PAD)
    for row, (prompt, response) in enumerate(zip(prompts + prompts, chosen + rejected)):
        n_prompt, n = len(prompt), len(prompt) + len(response)
        assert batch["input_ids"][row, :n].tolist() == prompt + response
        assert batch["input_ids"][row, n:].eq(PAD).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
        assert (
            batch["prompt_mask"][row].sum() == n_prompt and batch["prompt_mask"][row, :n_prompt].eq(1).all()
        )
        assert batch["response_mask"][row, n_prompt:n].eq(1).all() and batch["response_mask"][
            row
        ].sum() == len(response)
        assert batch["last_index"][row] == n - 1
    assert torch.equal(batch["prompt_mask"] + batch["response_mask"], batch["attention_mask"].float())


def test_sft_labels_give_the_masked_next_token_loss():
    """The HF loss from `labels` equals the next-token loss on response tokens weighted by loss_mask."""
    from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

    tokenizer = word_tokenizer(["a b c d e f"])
    model = tiny_causal_lm(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    eos = tokenizer.eos_token_id
    batch = collate_sft(
        [[4, 5, 6], [7]], [[8, eos], [9, 5, 4, eos]], pad_id=tokenizer.pad_token_id, eos_id=eos
    )
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        )
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    token_logp = logp.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    weights = batch["loss_mask"][:, 1:]
    manual = -(token_logp * weights).sum() / weights.sum()
    assert weights.sum() == 6  # 2 + 4 response tokens, EOS included
    assert torch.allclose(out.loss, manual, atol=1e-6)
    assert (batch["labels"] == IGNORE_INDEX).sum() == batch["labels"].numel() - 6


# --- token-budget batches -------------------------------------------------------------------------


def test_token_budget_batches_by_hand():
    assert token_budget_batches([4, 1, 10, 3, 2], max_tokens=10, seed=None) == [[1, 4, 3], [0], [2]]
    assert token_budget_batches([2, 2, 2, 2, 2], max_tokens=10, max_batch=2, seed=None) == [
        [0, 1],
        [2, 3],
        [4],
    ]
    assert token_budget_batches([], max_tokens=5) == []


def test_token_budget_batches_minimum_rows_by_hand():
    # lengths 2, 3, 9, 9, 10 (indices 3, 0, 1, 4, 2) under 20 tokens: without a minimum the long ones
    # go one or two per batch; with min_batch 2 the budget gives way to reach 2 rows
    lengths = [3, 9, 10, 2, 9]
    assert token_budget_batches(lengths, max_tokens=20, seed=None) == [[3, 0], [1, 4], [2]]
    # the last batch (index 2) is short of 2 rows: it joins the batch before it
    assert token_budget_batches(lengths, max_tokens=20, seed=None, min_batch=2) == [[3, 0], [1, 4, 2]]
    # ... unless that batch would then exceed max_batch
    assert token_budget_batches(lengths, max_tokens=20, max_batch=2, seed=None, min_batch=2) == [
        [3, 0],
        [1, 4],
        [2],
    ]
    # a batch grows past the budget only up to min_batch rows: 3 x 10 = 30 > 20 tokens
    assert token_budget_batches([10, 10, 10, 10, 10, 10], max_tokens=20, seed=None, min_batch=3) == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    assert token_budget_batches([5], max_tokens=5, seed=None, min_batch=4) == [[0]]  # fewer rows than that


def test_token_budget_batches_errors():
    with pytest.raises(ValueError, match="example 1 has 11 tokens, which does not fit max_tokens=10"):
        token_budget_batches([3, 11], max_tokens=10)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        token_budget_batches([1], max_tokens=0)
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        token_budget_batches([1], max_tokens=4, max_batch=0)
    with pytest.raises(ValueError, match="min_batch must be in"):
        token_budget_batches([1], max_tokens=4, max_batch=2, min_batch=3)
    with pytest.raises(ValueError, match="min_batch must be in"):
        token_budget_batches([1], max_tokens=4, min_batch=0)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=60),
    extra=st.integers(0, 100),
    max_batch=st.one_of(st.none(), st.integers(1, 8)),
    seed=st.one_of(st.none(), st.integers(0, 5)),
)
def test_token_budget_batches_cover_each_index_once_within_budget(lengths, extra, max_batch, seed):
    max_tokens = max(lengths, default=1) + extra or 1
    batches = token_budget_batches(lengths, max_tokens, max_batch, seed)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert batch and len(batch) * max(lengths[i] for i in batch) <= max_tokens
        assert max_batch is None or len(batch) <= max_batch
    assert token_budget_batches(lengths, max_tokens, max_batch, seed) == batches  # deterministic
    # greedy packing: the next batch's shortest example would not have fit in the previous batch
    if seed is None:
        for first, second in zip(batches, batches[1:]):
            grown = len(first) + 1
            assert (max_batch is not None and len(first) == max_batch) or grown * min(
                lengths[i] for i in second
            ) > max_tokens


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=60),
    extra=st.integers(0, 100),
    min_batch=st.integers(1, 6),
    spare=st.one_of(st.none(), st.integers(0, 6)),
    seed=st.one_of(st.none(), st.integers(0, 5)),
)
def test_token_budget_batches_hold_at_least_min_batch_rows(lengths, extra, min_batch, spare, seed):
    max_tokens = max(lengths, default=1) + extra or 1
    max_batch = None if spare is None else min_batch + spare
    batches = token_budget_batches(lengths, max_tokens, max_batch, seed, min_batch=min_batch)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    short = [batch for batch in batches if len(batch) < min_batch]
    # only the longest examples' batch can be short: when there are too few rows, or max_batch forbade the merge
    assert len(short) <= 1
    if short and len(batches) > 1:
        assert max_batch is not None
    for batch in batches:
        assert max_batch is None or len(batch) <= max_batch
        within = len(batch) * max(lengths[i] for i in batch) <= max_tokens
        # over budget only to reach min_batch, or as the merged last batch (it holds the longest rows)
        longest_rows = max(lengths[i] for i in batch) == max(lengths)
        assert within or len(batch) <= min_batch or longest_rows
