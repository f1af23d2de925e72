"""response_logprobs against a manual computation: full forward, log_softmax, a gather loop."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.models.backbone import head_logits, output_head, position_ids
from rlhf.models.logprobs import default_chunk_size, response_logprobs
from rlhf.models.sampling import SamplingConfig, generate
from tests.support.models_testing import fixed_logits_lm, rollout_batch

PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
RESPONSES = [[14, 15, 3], [16, 17, 18, 19, 3], [20]]


def manual_logprobs(model, input_ids, attention_mask, prompt_length, temperature=1.0):
    """Plain loop: the full model forward, then log_softmax per (row, response token)."""
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
        ).logits
    batch, total = input_ids.shape
    logp = torch.zeros(batch, total - prompt_length)
    entropy = torch.zeros(batch, total - prompt_length)
    for b in range(batch):
        for t in range(total - prompt_length):
            if attention_mask[b, prompt_length + t] == 0:
                continue
            dist = torch.log_softmax(logits[b, prompt_length - 1 + t] / temperature, dim=-1)
            logp[b, t] = dist[input_ids[b, prompt_length + t]]
            entropy[b, t] = -sum(math.exp(v) * v for v in dist.tolist())
    return logp, entropy


def test_position_ids_count_real_tokens_from_zero():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    expected = torch.tensor([[0, 0, 0, 1, 2, 2], [0, 1, 1, 2, 3, 4], [0, 0, 0, 0, 0, 0]])
    assert torch.equal(position_ids(mask), expected)


def test_head_logits_equal_the_models_own_logits(lm):
    ids, mask, _ = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    with torch.no_grad():
        expected = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        hidden = lm.model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask))[0]
        assert torch.allclose(head_logits(lm, hidden), expected, atol=1e-6)


def test_output_head_applies_softcapping_and_scaling(lm):
    hidden = torch.randn(2, 3, lm.config.hidden_size)
    raw = lm.lm_head(hidden)
    lm.config.final_logit_softcapping = 0.5
    lm.config.logit_scale = 2.0
    with torch.no_grad():
        assert torch.allclose(output_head(lm)(hidden), torch.tanh(raw * 2.0 / 0.5) * 0.5, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_match_manual_loop(lm, temperature):
    ids, mask, prompt_length = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    logp, entropy = response_logprobs(lm, ids, mask, prompt_length, temperature, with_entropy=True)
    want_logp, want_entropy = manual_logprobs(lm, ids, mask, prompt_length, temperature)
    assert logp.shape == entropy.shape == (3, 5)
    assert torch.allclose(logp, want_logp, atol=1e-5)
    assert torch.allclose(entropy, want_entropy, atol=1e-5)


def test_the_decoder_skips_the_last_column_and_no_response_is_empty(lm):
    ids, mask, prompt_length = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    widths = []
    hook = lm.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        response_logprobs(lm, ids, mask, prompt_length)
        logp, entropy = response_logprobs(
            lm, ids[:, :prompt_length], mask[:, :prompt_length], prompt_length, with_entropy=True
        )
    finally:
        hook.remove()
    assert widths == [ids.shape[1] - 1]  # the last token is only ever a target
    assert logp.shape == entropy.shape == (3, 0)


def test_temperature_divides_the_logits(lm):
    ids, mask, prompt_length = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    cold, _ = response_logprobs(lm, ids, mask, prompt_length, temperature=0.5)
    plain, _ = response_logprobs(lm, ids, mask, prompt_length)
    assert not torch.allclose(cold, plain)
    # T -> small sharpens the distribution: the argmax token's log-prob rises towards 0.
    want, _ = manual_logprobs(lm, ids, mask, prompt_length, temperature=0.5)
    assert torch.allclose(cold, want, atol=1e-5)


def test_padded_positions_are_zero_and_finite(lm):
    ids, mask, prompt_length = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    logp, entropy = response_logprobs(lm, ids, mask, prompt_length, with_entropy=True)
    pad = mask[:, prompt_length:] == 0
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    assert (logp[pad] == 0).all() and (entropy[pad] == 0).all()
    assert (logp[~pad] < 0).all() and (entropy[~pad] > 0).all()


def test_fully_padded_prompt_and_response_rows_stay_finite(lm):
    ids, mask, prompt_length = rollout_batch([[5, 6], [7]], [[8, 3], [9]], pad_id=0)
    mask[1] = 0  # a row with no real token at all
    logp, entropy = response_logprobs(lm, ids, mask, prompt_length, with_entropy=True)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    assert (logp[1] == 0).all() and (entropy[1] == 0).all()


def test_banned_tokens_with_minus_inf_logits_keep_entropy_and_gradients_finite(lm):
    logits = torch.zeros(44)
    logits[:20] = float("-inf")
    model = fixed_logits_lm(lm, logits)
    ids, mask, prompt_length = rollout_batch([[5, 6]], [[30, 31, 3]], pad_id=0)
    logp, entropy = response_logprobs(model, ids, mask, prompt_length, with_entropy=True)
    assert torch.allclose(entropy[0, :2], torch.full((2,), math.log(24)), atol=1e-5)  # uniform over 24
    assert torch.allclose(logp[0, :2], torch.full((2,), -math.log(24)), atol=1e-5)
    assert logp[0, 2] == float("-inf")  # EOS (id 3) is banned: probability 0
    entropy.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("chunk_size", [1, 2, 3])
def test_chunking_changes_nothing_values_or_gradients(lm, chunk_size):
    ids, mask, prompt_length = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    weights = torch.linspace(-1, 1, 15).reshape(3, 5)

    def loss_and_grads(chunk):
        lm.zero_grad()
        logp, entropy = response_logprobs(lm, ids, mask, prompt_length, 0.9, True, chunk_size=chunk)
        ((logp + 0.1 * entropy) * weights).sum().backward()
        return logp.detach(), entropy.detach(), [p.grad.clone() for p in lm.parameters()]

    whole = loss_and_grads(None)
    chunked = loss_and_grads(chunk_size)
    assert torch.allclose(whole[0], chunked[0], atol=1e-6)
    assert torch.allclose(whole[1], chunked[1], atol=1e-6)
    for a, b in zip(whole[2], chunked[2]):
        assert torch.allclose(a, b, atol=1e-6)


def test_default_chunk_size_bounds_the_logits_block():
    assert default_chunk_size(batch_size=16, vocab_size=50_000) * 16 * 50_000 <= 1 << 24
    assert default_chunk_size(batch_size=1, vocab_size=10) >= 1_000_000
    assert default_chunk_size(batch_size=64, vocab_size=10**7) == 1


def test_first_ratio_is_exactly_one_after_sampling(lm):
    """old_logp and new_logp come from the same function on the batch just sampled: ratio == 1."""
    config = SamplingConfig(max_new_tokens=8, temperature=0.8, top_p=0.9)
    prompt_ids, prompt_mask, _ = rollout_batch([[5, 6, 7], [8]], [[], []], pad_id=0)
    rollout = generate(lm, prompt_ids, prompt_mask, config, 3, 0, torch.Generator().manual_seed(1))
    args = (lm, rollout.input_ids, rollout.attention_mask, rollout.prompt_length, config.temperature)
    with torch.no_grad():
        old_logp, _ = response_logprobs(*args)
    new_logp, _ = response_logprobs(*args)  # with autograd, as in the update
    assert torch.equal(old_logp, new_logp.detach())
    assert torch.equal(torch.exp(new_logp - old_logp), torch.ones_like(old_logp))


def test_bad_layout_is_reported(lm):
    ids, mask, prompt_length = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    with pytest.raises(ValueError, match="prompt_length"):
        response_logprobs(lm, ids, mask, 0)
    with pytest.raises(ValueError, match="temperature"):
        response_logprobs(lm, ids, mask, prompt_length, temperature=0.0)
    with pytest.raises(ValueError, match=r"\[B, P \+ T\]"):
        response_logprobs(lm, ids, mask[:, :-1], prompt_length)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    prompt=st.lists(st.integers(4, 43), min_size=1, max_size=4),
    response=st.lists(st.integers(3, 43), min_size=1, max_size=4),
    extra_left=st.integers(0, 3),
    extra_right=st.integers(0, 3),
)
def test_padding_does_not_change_logprobs(_base_lm, prompt, response, extra_left, extra_right):
    """The same sequence surrounded by any amount of padding gets the same log-probs."""
    alone_ids, alone_mask, p = rollout_batch([prompt], [response], pad_id=0)
    padded_ids, padded_mask, p_padded = rollout_batch(
        [prompt, [5] * (len(prompt) + extra_left)], [response, [6] * (len(response) + extra_right)], pad_id=0
    )
    alone, _ = response_logprobs(_base_lm, alone_ids, alone_mask, p)
    padded, _ = response_logprobs(_base_lm, padded_ids, padded_mask, p_padded)
    assert torch.allclose(padded[0, : len(response)], alone[0], atol=1e-5)
    assert (padded[0, len(response) :] == 0).all()


def test_entropy_without_grad_is_the_same_value_and_leaves_logp_gradients_alone(lm):
    ids, mask, prompt_length = rollout_batch(PROMPTS, RESPONSES, pad_id=0)
    logp, entropy = response_logprobs(lm, ids, mask, prompt_length, with_entropy=True)
    logp_ng, entropy_ng = response_logprobs(
        lm, ids, mask, prompt_length, with_entropy=True, entropy_grad=False
    )
    assert entropy.requires_grad and not entropy_ng.requires_grad
    assert torch.equal(entropy.detach(), entropy_ng) and torch.equal(logp.detach(), logp_ng.detach())
    grads = torch.autograd.grad(logp.sum(), list(lm.parameters()), allow_unused=True)
    grads_ng = torch.autograd.grad(logp_ng.sum(), list(lm.parameters()), allow_unused=True)
    for g, h in zip(grads, grads_ng):
        assert (g is None and h is None) or torch.equal(g, h)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy, entropy_grad", [(False, False), (True, False), (True, True)])
def test_hand_written_backward_passes_gradcheck(temperature, with_entropy, entropy_grad):
    """The fused log-prob/entropy function's backward against finite differences (float64)."""
    from rlhf.models.logprobs import _TokenLogprobEntropy

    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (2, 3))

    def outputs(z):
        logp, entropy = _TokenLogprobEntropy.apply(z, targets, temperature, with_entropy, entropy_grad)
        return (logp, entropy) if with_entropy and entropy_grad else logp

    assert torch.autograd.gradcheck(outputs, (logits,))


def test_hand_written_backward_equals_autograd_with_banned_tokens():
    """Against autograd of the plain formula, with -inf logits (banned tokens) in every row."""
    from rlhf.models.logprobs import _TokenLogprobEntropy

    torch.manual_seed(1)
    base = torch.randn(3, 4, 11)
    base[..., :3] = float("-inf")
    targets = torch.randint(3, 11, (3, 4))
    weights_logp, weights_entropy = torch.randn(3, 4), torch.randn(3, 4)

    def plain(z):
        s = z / 0.7
        log_norm = torch.logsumexp(s, -1)
        logp = s.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
        # -1e4 instead of the lowest float: p is 0 there all the same, and autograd's own backward
        # (p * z with z huge) cannot overflow into NaN, as it does at the lowest float
        finite = s.clamp(min=-1e4)
        return logp, log_norm - (torch.softmax(finite, -1) * finite).sum(-1)

    results = []
    for fn in (plain, lambda z: _TokenLogprobEntropy.apply(z, targets, 0.7, True, True)):
        z = base.clone().requires_grad_(True)
        logp, entropy = fn(z)
        ((logp * weights_logp).sum() + (entropy * weights_entropy).sum()).backward()
        results.append((logp.detach(), entropy.detach(), z.grad))
    for ours, want in zip(results[1], results[0]):
        assert torch.isfinite(ours).all()
        assert torch.allclose(ours, want, atol=1e-5)
