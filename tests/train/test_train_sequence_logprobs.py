"""sequence_logprobs (DPO's summed response log-probs) against a plain loop over rows with the
whole logits: right padding, rows of different lengths, a batch of one, a row with no response."""

from __future__ import annotations

import torch

from rlhf.data.collate import collate_pairs
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from rlhf.train.lm_loss import sequence_logprobs

WORDS = "a b c d e f g h i j".split()


def plain_sums(model, input_ids, attention_mask, response_mask) -> list[float]:
    out = []
    for row in range(input_ids.shape[0]):
        n = int(attention_mask[row].sum())  # right-padded: the row's tokens come first
        ids = input_ids[row : row + 1, :n]
        logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        out.append(sum(float(logp[j - 1, ids[0, j]]) for j in range(1, n) if response_mask[row, j] == 1))
    return out


def test_sums_equal_a_plain_loop_with_padding_and_an_empty_response():
    tok = word_tokenizer([" ".join(WORDS)])
    model = tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2).eval()
    prompts = [[4, 5], [6], [7, 8, 9]]
    chosen = [[10, 11, 3], [12, 3], [4, 3]]
    rejected = [[13, 3], [5, 6, 7, 8, 3], [9, 3]]
    batch = collate_pairs(prompts, chosen, rejected, tok.pad_token_id)
    batch["response_mask"][2] = 0  # the last pair's chosen side scores no token
    with torch.no_grad():
        got = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["response_mask"])
        expected = plain_sums(model, batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    assert got.dtype == torch.float32 and got.shape == (6,)
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=1e-5)
    assert got[2].item() == 0.0  # no response token: 0, not NaN


def test_a_batch_of_one_and_gradients_reach_the_model():
    tok = word_tokenizer([" ".join(WORDS)])
    model = tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=1, num_heads=2)
    batch = collate_pairs([[4, 5]], [[6, 3]], [[7, 8, 3]], tok.pad_token_id)
    ids, attn, resp = batch["input_ids"][:1], batch["attention_mask"][:1], batch["response_mask"][:1]
    got = sequence_logprobs(model, ids, attn, resp)
    with torch.no_grad():
        expected = plain_sums(model, ids, attn, resp)
    torch.testing.assert_close(got.detach(), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    got.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_no_response_token_anywhere_is_a_zero_that_still_backpropagates():
    tok = word_tokenizer([" ".join(WORDS)])
    model = tiny_causal_lm(tok, seed=2, hidden_size=32, num_layers=1, num_heads=2)
    ids = torch.tensor([[4, 5, 6]])
    got = sequence_logprobs(model, ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert got.tolist() == [0.0]
    got.sum().backward()  # every parameter in the graph (a rank with nothing to score still steps)
    assert model.lm_head.weight.grad is not None
