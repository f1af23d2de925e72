"""Experience slicing and the chunked forward, against plain loops over the rollout layout.

Layout (docs/internals.md): `input_ids [B, P+T]` = left-padded prompts then right-padded responses.
"""

from __future__ import annotations

import pytest
import torch

from rlhf.models.sequences import Sequences
from rlhf.rl.experience import Experience, concat_experiences, forward_in_chunks, in_row_chunks

PER_TOKEN = ("old_logp", "ref_logp", "old_values", "advantages", "returns")


def layout(prompt_lengths: list[int], response_lengths: list[int], P: int, T: int):
    """(input_ids, attention_mask, response_mask) with token ids 100*row + column (0 at padding)."""
    B = len(prompt_lengths)
    ids = torch.zeros(B, P + T, dtype=torch.long)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        attn[b, P - p : P + r] = 1
    columns = torch.arange(P + T)[None, :] + 100 * torch.arange(1, B + 1)[:, None]
    ids = torch.where(attn.bool(), columns, ids)
    return ids, attn, attn[:, P:].float()


def experience(prompt_lengths, response_lengths, P, T) -> Experience:
    ids, attn, mask = layout(prompt_lengths, response_lengths, P, T)
    per_token = {k: (torch.arange(T * len(mask)).reshape(-1, T).float() + i * 1000) * mask
                 for i, k in enumerate(PER_TOKEN)}  # fmt: skip
    group = torch.arange(len(mask))  # a prompt per row
    return Experience(
        input_ids=ids, attention_mask=attn, prompt_length=P, response_mask=mask, group=group, **per_token
    )


def expected_trim(attn: torch.Tensor, P: int) -> tuple[int, int]:
    """(all-padding prompt columns on the left, response columns up to the last used one; >= 1)."""
    lead = 0
    while lead < P and not attn[:, lead].any():
        lead += 1
    width = 1
    for t in range(attn.shape[1] - P):
        if attn[:, P + t].any():
            width = t + 1
    return lead, width


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_forward_in_chunks_trims_each_chunk_and_pads_back(rows: int) -> None:
    P, T = 4, 5
    ids, attn, mask = layout([2, 4, 1, 1, 3], [1, 5, 0, 2, 3], P, T)
    calls = []

    def response_ids(chunk_ids, chunk_mask, prompt_length):
        calls.append((tuple(chunk_ids.shape), prompt_length, chunk_ids.clone(), chunk_mask.clone()))
        return chunk_ids[:, prompt_length:].float() + 0.5 * chunk_mask[:, prompt_length:]

    out = forward_in_chunks(response_ids, ids, attn, P, T, rows)
    assert torch.equal(out, (ids[:, P:].float() + 0.5 * mask))  # padding columns come back as 0
    assert len(calls) == -(-5 // rows)
    for k, (shape, prompt_length, chunk_ids, chunk_mask) in enumerate(calls):
        chunk = slice(k * rows, (k + 1) * rows)
        lead, width = expected_trim(attn[chunk], P)
        assert shape == (len(attn[chunk]), P - lead + width) and prompt_length == P - lead
        assert torch.equal(chunk_ids, ids[chunk, lead : P + width])
        assert torch.equal(chunk_mask, attn[chunk, lead : P + width])


def test_forward_in_chunks_keeps_one_column_for_empty_responses() -> None:
    ids, attn, _ = layout([1, 2], [0, 0], 3, 4)
    shapes = []

    def fn(i, a, p):
        shapes.append((tuple(i.shape), p))
        return torch.ones(i.shape[0], i.shape[1] - p)

    out = forward_in_chunks(fn, ids, attn, 3, 4, rows=2)
    assert shapes == [((2, 3), 2)]  # lead 1 prompt column trimmed, one response column kept
    assert out.tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2


def test_in_row_chunks_passes_trimmed_sequences() -> None:
    ids, attn, mask = layout([1, 3, 2], [2, 1, 3], 3, 4)
    seen = []

    def fn(seqs: Sequences):
        seen.append((seqs.prompt_length, seqs.response_width))
        return seqs.attention_mask[:, seqs.prompt_length :].float() * 2

    out = in_row_chunks(fn, Sequences(ids, attn, 3), rows=2)
    assert torch.equal(out, mask * 2)
    assert seen == [(3, 2), (2, 3)]  # rows 0-1: no trim left, responses 2 wide; row 2: lead 1


def test_select_matches_a_plain_trim() -> None:
    P, T = 3, 4
    exp = experience([1, 3, 2, 1], [4, 1, 2, 0], P, T)
    for rows in ([0], [1], [2, 3], [3], [1, 2], [3, 0]):
        index = torch.tensor(rows)
        picked = exp.select(index)
        lead, width = expected_trim(exp.attention_mask[index], P)
        assert picked.prompt_length == P - lead
        assert torch.equal(picked.input_ids, exp.input_ids[index, lead : P + width])
        assert torch.equal(picked.attention_mask, exp.attention_mask[index, lead : P + width])
        for name in ("response_mask", *PER_TOKEN):
            assert torch.equal(getattr(picked, name), getattr(exp, name)[index, :width]), name


def test_counts_and_sequences() -> None:
    exp = experience([1, 2], [3, 1], 2, 3)
    assert exp.batch_size == 2 and exp.num_tokens == 4.0
    seqs = exp.sequences
    assert seqs.prompt_length == 2 and torch.equal(seqs.input_ids, exp.input_ids)
    assert torch.equal(seqs.attention_mask, exp.attention_mask)


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_micro_batches_are_consecutive_rows(size: int) -> None:
    exp = experience([1, 2, 1, 3, 2], [2, 1, 3, 1, 2], 3, 3)
    micro = list(exp.micro_batches(size))
    assert [m.batch_size for m in micro] == [min(size, 5 - s) for s in range(0, 5, size)]
    firsts = torch.cat([m.old_logp[:, 0] for m in micro])
    assert torch.equal(firsts, exp.old_logp[:, 0])


def test_minibatches_follow_the_generator_permutation() -> None:
    exp = experience([1, 2, 1, 3, 2], [2, 1, 3, 1, 2], 3, 3)
    order = torch.randperm(5, generator=torch.Generator().manual_seed(7))
    chunks = torch.tensor_split(order, 2)
    got = [m.old_logp[:, 0] for m in exp.minibatches(2, torch.Generator().manual_seed(7))]
    assert [g.tolist() for g in got] == [exp.old_logp[c, 0].tolist() for c in chunks]
    assert len(list(exp.minibatches(9, torch.Generator().manual_seed(0)))) == 5  # no empty minibatch


def test_concat_pads_prompts_left_and_responses_right() -> None:
    a = experience([1, 2], [2, 1], 2, 2)
    b = experience([3], [3], 3, 3)
    joined = concat_experiences([a, b])
    assert joined.prompt_length == 3 and joined.input_ids.shape == (3, 6)
    pad = torch.zeros(2, 1, dtype=torch.long)
    assert torch.equal(joined.input_ids[:2], torch.cat([pad, a.input_ids, pad], dim=1))
    assert torch.equal(joined.attention_mask[:2], torch.cat([pad, a.attention_mask, pad], dim=1))
    assert torch.equal(joined.input_ids[2:], b.input_ids)
    for name in ("response_mask", *PER_TOKEN):
        expected_a = torch.cat([getattr(a, name), torch.zeros(2, 1)], dim=1)
        assert torch.equal(getattr(joined, name), torch.cat([expected_a, getattr(b, name)])), name
    assert concat_experiences([b]) is b
