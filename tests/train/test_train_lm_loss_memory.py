"""The chunked next-token loss (`hidden_token_nll`, `model_token_nll`) equals the plain one over
whole logits (`token_nll` on `model(...).logits`): loss, count and every parameter's gradient
(to float32 rounding: both reduce the head's output in float32),
with prompt masks, right padding, a batch of one, rows without a scored token, chunks smaller
than a row, and the reward model's LM term."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf.data.collate import collate_pairs, collate_sft
from rlhf.models.backbone import decoder_hidden_states, position_ids
from rlhf.models.logprobs import logprobs_from_hidden
from rlhf.models.scalar_head import ScalarHeadModel, last_token_index
from rlhf.models.tiny import tiny_causal_lm
from rlhf.stages.rm import EncodedPair, pair_forward
from rlhf.train import lm_loss
from rlhf.train.lm_loss import hidden_token_nll, model_token_nll, token_nll


def plain_nll(model, batch):
    """The reference: the model's own forward, whole [B, L, V] logits, cross-entropy on them."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=position_ids(batch["attention_mask"]),
        use_cache=False,
    ).logits
    return token_nll(logits, batch["input_ids"], batch["loss_mask"])


def grads_of(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


BATCHES = {
    "mixed lengths, right padded": ([[5, 6, 7], [8], [9, 10]], [[11, 12, 3], [13, 3], [14, 15, 16, 17, 3]]),
    "a batch of one": ([[5, 6]], [[7, 8, 9, 3]]),
    "one token responses": ([[5], [6, 7, 8, 9]], [[3], [3]]),
}


@pytest.mark.parametrize("name", list(BATCHES))
@pytest.mark.parametrize("chunk", [None, 2])
def test_model_token_nll_equals_the_whole_logits_cross_entropy_with_its_gradients(
    tok, name, chunk, monkeypatch
):
    if chunk is not None:  # chunks of `chunk` positions: several chunks, each recomputed in the backward
        monkeypatch.setattr(
            lm_loss, "logprobs_from_hidden", lambda *a, **k: logprobs_from_hidden(*a, chunk_size=chunk)
        )
    prompts, responses = BATCHES[name]
    batch = collate_sft(prompts, responses, pad_id=0)
    model = tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=2, num_heads=2)
    nll, count = model_token_nll(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
    want, want_count = plain_nll(model, batch)
    assert count == want_count == sum(len(r) for r in responses)
    assert float(nll.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    got_grads, want_grads = grads_of(model, nll), grads_of(model, want)
    assert got_grads.keys() == want_grads.keys() and got_grads
    for key in want_grads:
        torch.testing.assert_close(got_grads[key], want_grads[key], rtol=1e-5, atol=1e-7)


def test_hidden_token_nll_reads_nothing_at_unscored_positions(tok):
    """Changing the hidden states at prompt and padding positions changes neither loss nor count."""
    batch = collate_sft([[5, 6, 7], [8]], [[9, 3], [10, 11, 3]], pad_id=0)
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    with torch.no_grad():
        hidden = decoder_hidden_states(model, batch["input_ids"], batch["attention_mask"])
        nll, count = hidden_token_nll(model, hidden, batch["input_ids"], batch["loss_mask"])
        scored = torch.zeros_like(batch["loss_mask"], dtype=torch.bool)
        scored[:, :-1] = batch["loss_mask"][:, 1:].bool()  # the positions whose logits score a token
        noisy = torch.where(scored.unsqueeze(-1), hidden, torch.randn_like(hidden) * 100)
        assert hidden_token_nll(model, noisy, batch["input_ids"], batch["loss_mask"]) == (nll, count)
        assert count == 5


def test_hidden_token_nll_without_a_scored_token_is_a_zero_with_a_gradient_path(tok):
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    ids = torch.tensor([[5, 6, 7]])
    mask = torch.ones_like(ids)
    nll, count = model_token_nll(model, ids, mask, torch.tensor([[1, 0, 0]]))  # position 0 is never scored
    assert count == 0 and float(nll.detach()) == 0.0
    grads = grads_of(model, nll)
    assert grads and all(float(g.abs().max()) == 0.0 for g in grads.values())


def test_the_reward_models_lm_term_equals_the_whole_logits_one(tok):
    lm = tiny_causal_lm(tok, seed=2, hidden_size=16, num_layers=2, num_heads=2)
    model = ScalarHeadModel.from_causal_lm(lm)
    rows = [EncodedPair([5, 6], [7, 8, 3], [9, 3]), EncodedPair([10], [11, 3], [12, 13, 14, 3])]
    chosen, rejected, nll, count = pair_forward(model, rows, pad_id=0, with_lm=True)
    batch = collate_pairs(
        [r.prompt_ids for r in rows], [r.chosen_ids for r in rows], [r.rejected_ids for r in rows], 0
    )
    reference = copy.deepcopy(model)
    b = len(rows)
    logits = reference.lm_logits(batch["input_ids"][:b], batch["attention_mask"][:b])
    want, want_count = token_nll(logits, batch["input_ids"][:b], batch["response_mask"][:b])
    assert count == want_count == 5
    assert float(nll.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    got = grads_of(model, nll + chosen.sum() - rejected.sum())
    ref_hidden = reference.hidden_states(batch["input_ids"], batch["attention_mask"])
    rewards = (
        reference.values_from_hidden(ref_hidden)
        .gather(1, last_token_index(batch["attention_mask"]).unsqueeze(1))
        .squeeze(1)
    )
    want_grads = grads_of(reference, want + rewards[:b].sum() - rewards[b:].sum())
    assert got.keys() == want_grads.keys()
    for key in want_grads:
        torch.testing.assert_close(got[key], want_grads[key], rtol=1e-5, atol=1e-7)
