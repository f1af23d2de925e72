"""Sampling: logits filters against plain loops, the KV-cache loop against a no-cache loop and HF."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.models.backbone import position_ids
from rlhf.models.logprobs import response_logprobs
from rlhf.models.sampling import (
    SamplingConfig,
    apply_repetition_penalty,
    candidate_logits,
    generate,
    next_tokens,
    sample_categorical,
    top_k_filter,
    top_p_filter,
)
from tests.support.models_testing import fixed_logits_lm, left_pad

EOS, PAD = 3, 0
PROMPTS = [[5, 6, 7, 8, 9], [10], [11, 12, 13]]
GREEDY = SamplingConfig(max_new_tokens=12, do_sample=False)

logit_rows = st.lists(
    st.floats(-5, 5, allow_nan=False, width=32).map(lambda x: round(x, 2)), min_size=2, max_size=12
)


def reference_greedy(model, prompt, config, eos=EOS):
    """No KV cache, one row, a Python set of seen tokens: the full forward at every step."""
    ids = list(prompt)
    response = []
    for _ in range(config.max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        for token in set(ids):
            value = logits[token]
            logits[token] = (
                value / config.repetition_penalty if value > 0 else value * config.repetition_penalty
            )
        token = int(logits.argmax())
        ids.append(token)
        response.append(token)
        if token == eos:
            break
    return response


# -- config --------------------------------------------------------------------------------------


def test_ppo_paper_preset():
    config = SamplingConfig.ppo_paper(max_new_tokens=32)
    assert (config.temperature, config.top_p, config.repetition_penalty) == (0.8, 0.9, 1.1)
    assert config.do_sample and config.top_k == 0 and config.stop_at_eos and config.max_new_tokens == 32


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_new_tokens", 0),
        ("temperature", 0.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("repetition_penalty", 0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
        SamplingConfig(**{field: value})


# -- filters -------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    row=logit_rows, seen_bits=st.lists(st.booleans(), min_size=12, max_size=12), penalty=st.floats(0.5, 2.0)
)
def test_repetition_penalty_formula(row, seen_bits, penalty):
    logits = torch.tensor([row])
    seen = torch.tensor([seen_bits[: len(row)]])
    out = apply_repetition_penalty(logits, seen, penalty)[0].tolist()
    for i, x in enumerate(row):
        x = torch.tensor(x).item()
        want = (x / penalty if x > 0 else x * penalty) if seen_bits[i] else x
        assert out[i] == pytest.approx(want, rel=1e-6, abs=1e-7)


@settings(max_examples=60, deadline=None)
@given(row=st.lists(st.integers(-50, 50), min_size=2, max_size=12, unique=True), k=st.integers(0, 14))
def test_top_k_keeps_exactly_the_k_largest(row, k):
    logits = torch.tensor([row], dtype=torch.float32)
    kept = torch.isfinite(top_k_filter(logits, k))[0].tolist()
    if k == 0 or k >= len(row):
        assert all(kept)
    else:
        largest = sorted(row, reverse=True)[:k]
        assert kept == [x in largest for x in row]


def nucleus(probs: list[float], p: float) -> set[int]:
    """Plain loop: the most likely tokens, in order, until their mass reaches p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return kept


@settings(max_examples=60, deadline=None)
@given(row=st.lists(st.integers(-8, 8), min_size=2, max_size=10, unique=True), p=st.floats(0.05, 0.99))
def test_top_p_keeps_the_nucleus(row, p):
    logits = torch.tensor([row], dtype=torch.float32)
    probs = torch.softmax(logits, -1)[0].double().tolist()
    masses = sorted(probs, reverse=True)
    boundary = [sum(masses[: i + 1]) for i in range(len(masses))]
    if any(abs(b - p) < 1e-5 for b in boundary):
        return  # a float tie at the boundary: either answer is right
    kept = torch.isfinite(top_p_filter(logits, p))[0].tolist()
    assert {i for i, k in enumerate(kept) if k} == nucleus(probs, p)


@pytest.mark.parametrize("scale", [0.1, 1.0, 6.0])
def test_top_p_on_a_large_vocabulary_candidates_or_full_sort(scale):
    """V = 5000: a peaked row's nucleus fits the first candidate set, a flat one needs the full sort."""
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(0)) * scale
    kept = torch.isfinite(top_p_filter(logits, 0.9))
    probs = torch.softmax(logits.double(), -1)
    for b in range(3):
        assert set(kept[b].nonzero().flatten().tolist()) == nucleus(probs[b].tolist(), 0.9)


@pytest.mark.parametrize("top_k", [0, 40])
def test_top_p_without_candidate_sets_as_off_the_cpu_keeps_the_same_nucleus(top_k):
    """Off the CPU the candidate sets are skipped: top-p alone then takes the full sort (without it a GPU
    would get no candidates and no sort), with the same survivors and logits."""
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(1)) * 2.0
    searched = candidate_logits(logits, top_k, 0.9, search_candidates=True)
    sorted_whole = candidate_logits(logits, top_k, 0.9, search_candidates=False)
    back = [torch.full_like(logits, float("-inf")).scatter(-1, ids, v) for v, ids in (searched, sorted_whole)]
    assert torch.equal(back[0], back[1])
    assert torch.isfinite(back[0]).sum() < logits.numel()  # the filter removed tokens


def test_categorical_draws_follow_the_weights_and_never_pick_a_zero():
    weights = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0], [2.0, 0.0, 0.0, 0.0, 2.0]]).repeat(2000, 1)
    draws = sample_categorical(weights, torch.Generator().manual_seed(0)).reshape(2000, 2)
    first = torch.bincount(draws[:, 0], minlength=5).float() / 2000
    second = torch.bincount(draws[:, 1], minlength=5).float() / 2000
    assert first[[0, 2, 4]].sum() == 0 and second[[1, 2, 3]].sum() == 0
    assert abs(first[3] - 0.75) < 0.03 and abs(second[0] - 0.5) < 0.03


def test_categorical_draw_at_the_top_of_the_range_takes_the_last_positive_weight(monkeypatch):
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, dtype=kw.get("dtype")))
    weights = torch.tensor([[1.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    assert sample_categorical(weights).tolist() == [1, 2]


def test_top_p_known_case():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    assert torch.isfinite(top_p_filter(logits, 0.7)).tolist() == [[False, True, False, True]]
    assert torch.isfinite(top_p_filter(logits, 0.9)).tolist() == [[False, True, True, True]]
    assert torch.isfinite(top_p_filter(logits, 0.4)).tolist() == [[False, True, False, False]]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_sampling_never_leaves_the_nucleus_and_follows_its_renormalized_probabilities(lm):
    probs = torch.zeros(44)
    probs[[20, 21, 22, 23, 24, 25]] = torch.tensor([0.5, 0.25, 0.1, 0.05, 0.05, 0.05])
    model = fixed_logits_lm(lm, torch.log(probs.clamp(min=1e-12)))
    ids, mask = left_pad([[5]] * 200, PAD)
    config = SamplingConfig(max_new_tokens=10, top_p=0.8)
    rollout = generate(model, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(0))
    counts = torch.bincount(rollout.response_ids.flatten(), minlength=44).float()
    # Nucleus of 0.8: 0.5 + 0.25 = 0.75 < 0.8, so the 0.1 token that crosses it is in; nothing else.
    assert set(counts.nonzero().flatten().tolist()) == {20, 21, 22}
    want = torch.tensor([0.5, 0.25, 0.1]) / 0.85
    assert torch.allclose(counts[20:23] / counts.sum(), want, atol=0.03)


def test_top_k_sampling_statistics(lm):
    probs = torch.softmax(torch.linspace(0, 3, 44), -1)
    model = fixed_logits_lm(lm, torch.log(probs))
    ids, mask = left_pad([[5]] * 200, PAD)
    config = SamplingConfig(max_new_tokens=10, top_k=3, stop_at_eos=False)
    rollout = generate(model, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(0))
    counts = torch.bincount(rollout.response_ids.flatten(), minlength=44).float()
    assert set(counts.nonzero().flatten().tolist()) == {41, 42, 43}
    want = probs[41:] / probs[41:].sum()
    assert torch.allclose(counts[41:] / counts.sum(), want, atol=0.03)


# -- the loop ------------------------------------------------------------------------------------


def test_greedy_matches_a_loop_without_cache_with_repetition_penalty(lm):
    config = SamplingConfig(max_new_tokens=10, do_sample=False, repetition_penalty=1.5)
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(lm, ids, mask, config, EOS, PAD)
    for b, prompt in enumerate(PROMPTS):
        length = int(rollout.response_lengths[b])
        assert rollout.response_ids[b, :length].tolist() == reference_greedy(lm, prompt, config)


def test_greedy_generation_is_padding_invariant(lm):
    """A batch of mixed prompt lengths gives each prompt the tokens it gets alone."""
    ids, mask = left_pad(PROMPTS, PAD)
    batch = generate(lm, ids, mask, GREEDY, EOS, PAD)
    for b, prompt in enumerate(PROMPTS):
        alone = generate(
            lm, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long), GREEDY, EOS, PAD
        )
        n = int(alone.response_lengths[0])
        assert int(batch.response_lengths[b]) == n
        assert batch.response_ids[b, :n].tolist() == alone.response_ids[0, :n].tolist()


@settings(max_examples=5, deadline=None, derandomize=True)
@given(prompts=st.lists(st.lists(st.integers(4, 43), min_size=1, max_size=6), min_size=2, max_size=3))
def test_greedy_padding_invariance_property(_base_lm, prompts):
    ids, mask = left_pad(prompts, PAD)
    config = SamplingConfig(max_new_tokens=6, do_sample=False)
    batch = generate(_base_lm, ids, mask, config, EOS, PAD)
    for b, prompt in enumerate(prompts):
        alone = generate(
            _base_lm, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long), config, EOS, PAD
        )
        n = int(alone.response_lengths[0])
        assert batch.response_ids[b, :n].tolist() == alone.response_ids[0].tolist()
        assert int(batch.response_lengths[b]) == n


def test_greedy_equals_hugging_face_generate(lm):
    ids, mask = left_pad(PROMPTS, PAD)
    config = SamplingConfig(max_new_tokens=8, do_sample=False, stop_at_eos=False)
    ours = generate(lm, ids, mask, config, EOS, PAD)
    with torch.no_grad():
        theirs = lm.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=PAD,
            eos_token_id=None,
        )
    assert torch.equal(ours.input_ids, theirs)


def test_layout_of_a_sampled_rollout(lm):
    ids, mask = left_pad(PROMPTS, PAD)
    config = SamplingConfig(max_new_tokens=6)
    probs = torch.full((44,), 1.0)
    probs[EOS] = 6.0  # EOS likely but not certain: rows end at different steps
    model = fixed_logits_lm(lm, probs.log())
    rollout = generate(model, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(3))
    batch, total = rollout.input_ids.shape
    prompt_length = rollout.prompt_length
    assert prompt_length == ids.shape[1] and torch.equal(rollout.prompt_ids, ids)
    assert torch.equal(rollout.prompt_mask, mask)
    assert rollout.response_mask.dtype == torch.float32
    assert torch.equal(rollout.response_mask, rollout.attention_mask[:, prompt_length:].float())
    lengths = rollout.response_lengths.tolist()
    assert max(lengths) == total - prompt_length  # trimmed to the longest response
    assert len(set(lengths)) > 1
    for b in range(batch):
        n = lengths[b]
        row = rollout.response_ids[b].tolist()
        assert rollout.response_mask[b].tolist() == [1.0] * n + [0.0] * (len(row) - n)
        assert all(t == PAD for t in row[n:])
        assert EOS not in row[: n - 1]
        assert bool(rollout.ended_with_eos[b]) == (row[n - 1] == EOS)


def test_truncated_rows_did_not_end_with_eos(lm):
    probs = torch.full((44,), 1.0)
    probs[EOS] = 0.0  # EOS never sampled
    model = fixed_logits_lm(lm, probs.log())
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(
        model, ids, mask, SamplingConfig(max_new_tokens=4), EOS, PAD, torch.Generator().manual_seed(0)
    )
    assert rollout.response_ids.shape == (3, 4)
    assert not rollout.ended_with_eos.any()
    assert (rollout.response_mask == 1).all()


def test_early_exit_when_every_row_has_ended(lm):
    probs = torch.full((44,), 1.0)
    probs[EOS] = 100.0
    model = fixed_logits_lm(lm, probs.log())
    calls = []
    model.model.register_forward_hook(lambda *_: calls.append(1))
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(model, ids, mask, SamplingConfig(max_new_tokens=50, do_sample=False), EOS, PAD)
    assert rollout.response_ids.shape == (3, 1)
    assert len(calls) == 1  # the prefill only: no step after every row chose EOS


def test_stop_at_eos_off_runs_to_the_limit(lm):
    probs = torch.full((44,), 1.0)
    probs[EOS] = 100.0
    model = fixed_logits_lm(lm, probs.log())
    ids, mask = left_pad(PROMPTS, PAD)
    config = SamplingConfig(max_new_tokens=5, do_sample=False, stop_at_eos=False)
    rollout = generate(model, ids, mask, config, EOS, PAD)
    assert rollout.response_ids.tolist() == [[EOS] * 5] * 3
    assert (rollout.response_mask == 1).all()


def test_seeded_generation_is_reproducible(lm):
    ids, mask = left_pad(PROMPTS, PAD)
    config = SamplingConfig.ppo_paper(max_new_tokens=10)
    first = generate(lm, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(7))
    again = generate(lm, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(7))
    other = generate(lm, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(8))
    assert torch.equal(first.input_ids, again.input_ids)
    assert torch.equal(first.attention_mask, again.attention_mask)
    assert not torch.equal(first.input_ids, other.input_ids)


def test_pad_equal_to_eos_keeps_the_eos_in_the_response_mask(lm):
    """pad id == EOS id is allowed because masks come from lengths, never from comparing ids."""
    probs = torch.full((44,), 1.0)
    probs[EOS] = 5.0
    model = fixed_logits_lm(lm, probs.log())
    ids, mask = left_pad(PROMPTS, EOS)
    rollout = generate(
        model, ids, mask, SamplingConfig(max_new_tokens=8), EOS, EOS, torch.Generator().manual_seed(0)
    )
    lengths = rollout.response_lengths
    assert lengths.min() < lengths.max()  # some rows are padded with the EOS id
    for b in range(len(PROMPTS)):
        n = int(lengths[b])
        if rollout.ended_with_eos[b]:
            assert rollout.response_ids[b, n - 1] == EOS and rollout.response_mask[b, n - 1] == 1
    logp, _ = response_logprobs(model, rollout.input_ids, rollout.attention_mask, rollout.prompt_length)
    ended = rollout.ended_with_eos.nonzero().flatten()
    assert len(ended) > 0
    for b in ended.tolist():
        assert logp[b, int(lengths[b]) - 1] < 0  # the EOS is scored as a real token


def test_rollout_tensors_work_in_autograd(lm):
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(
        lm, ids, mask, SamplingConfig(max_new_tokens=4), EOS, PAD, torch.Generator().manual_seed(0)
    )
    assert not rollout.input_ids.is_inference() and not rollout.attention_mask.is_inference()
    logp, _ = response_logprobs(lm, rollout.input_ids, rollout.attention_mask, rollout.prompt_length)
    (logp * rollout.response_mask).sum().backward()
    assert lm.lm_head.weight.grad is not None


def test_model_mode_is_restored_and_prompts_are_checked(lm):
    lm.train()
    ids, mask = left_pad(PROMPTS, PAD)
    generate(lm, ids, mask, GREEDY, EOS, PAD)
    assert lm.training
    right_ids = torch.flip(ids, [1])
    with pytest.raises(ValueError, match=r"rows \[1, 2\].*left-padded"):
        generate(lm, right_ids, torch.flip(mask, [1]), GREEDY, EOS, PAD)
    with pytest.raises(ValueError, match="eos_token_id"):
        generate(lm, ids, mask, GREEDY, None, PAD)
    with pytest.raises(ValueError, match="pad_token_id"):
        generate(lm, ids, mask, GREEDY, EOS, None)


def test_several_eos_ids(lm):
    probs = torch.full((44,), 1.0)
    probs[7] = 100.0
    model = fixed_logits_lm(lm, probs.log())
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(model, ids, mask, GREEDY, [EOS, 7], PAD)
    assert rollout.response_ids.tolist() == [[7]] * 3 and rollout.ended_with_eos.all()


def test_next_tokens_greedy_ignores_temperature_and_filters():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    config = SamplingConfig(do_sample=False, temperature=5.0, top_k=1, top_p=0.1)
    assert next_tokens(logits, config).tolist() == [1, 0]
    seen = torch.tensor([[False, True, False], [True, False, False]])
    penalized = SamplingConfig(do_sample=False, repetition_penalty=4.0)
    assert next_tokens(logits, penalized, seen).tolist() == [2, 2]


def test_position_ids_in_the_prefill_match_the_layout(lm):
    """The loop's first step sees the same logits as a plain forward with mask-derived positions."""
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(lm, ids, mask, SamplingConfig(max_new_tokens=1, do_sample=False), EOS, PAD)
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[:, -1]
    assert rollout.response_ids[:, 0].tolist() == logits.argmax(-1).tolist()


# -- the sampler's own log-probs (rollout.logprobs_from_sampler) ------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(max_new_tokens=8, temperature=0.7),
        SamplingConfig(max_new_tokens=8, temperature=1.3, top_p=0.8, top_k=5, repetition_penalty=1.2),
        SamplingConfig(max_new_tokens=6, do_sample=False),
    ],
    ids=["t0.7", "filters-and-penalty", "greedy"],
)
def test_sampler_logprobs_equal_a_full_forward(lm, config):
    """Rollout.logprobs is log softmax(raw logits / T) at the drawn token, the quantity
    response_logprobs scores (filters and penalty only choose the token), 0 on padding."""
    with torch.no_grad():
        lm.lm_head.weight[EOS] += 0.5  # some rows end early: padding inside the batch
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(
        lm, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(3), return_logprobs=True
    )
    assert rollout.logprobs.shape == rollout.response_mask.shape
    assert (rollout.response_mask == 0).any() and (rollout.response_mask == 1).any()
    with torch.no_grad():
        full, _ = response_logprobs(
            lm,
            rollout.input_ids,
            rollout.attention_mask,
            rollout.prompt_length,
            temperature=config.temperature,
        )
    torch.testing.assert_close(rollout.logprobs, full, rtol=0, atol=1e-5)
    assert rollout.logprobs[rollout.response_mask == 0].eq(0).all()
    assert (rollout.logprobs[rollout.response_mask == 1] < 0).all()


def test_sampler_logprobs_of_a_batch_of_one_and_off_by_default(lm):
    ids, mask = left_pad(PROMPTS[1:2], PAD)
    config = SamplingConfig(max_new_tokens=5, stop_at_eos=False)
    plain = generate(lm, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(0))
    assert plain.logprobs is None
    with_logp = generate(
        lm, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(0), return_logprobs=True
    )
    assert torch.equal(plain.input_ids, with_logp.input_ids)  # asking for log-probs changes no draw
    assert with_logp.logprobs.shape == (1, 5) and not with_logp.logprobs.is_inference()


# -- finished rows leave the decoder's batch ---------------------------------------------------------

MIXED_PROMPTS = [[4 + (3 * i + j) % 40 for j in range(1 + i % 5)] for i in range(12)]


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(max_new_tokens=30, temperature=1.0),
        SamplingConfig(max_new_tokens=30, temperature=1.3, top_p=0.8, top_k=9, repetition_penalty=1.2),
        SamplingConfig(max_new_tokens=30, do_sample=False, repetition_penalty=1.3),
    ],
    ids=["sample", "filters-and-penalty", "greedy"],
)
def test_dropping_finished_rows_changes_no_token(lm, config, monkeypatch):
    """Rows that ended leave the decoder's batch (their KV-cache rows dropped), and the rollout is
    the one of a loop that keeps every row: same tokens, masks and log-probs for the same seed."""
    from dataclasses import replace

    from transformers import DynamicCache

    with torch.no_grad():
        lm.lm_head.weight[EOS] += 0.6  # rows end at different steps
    batch_sizes: list[int] = []
    lm.model.register_forward_hook(
        lambda _m, args, kwargs, _out: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    reorders: list[list[int]] = []
    original = DynamicCache.reorder_cache
    monkeypatch.setattr(
        DynamicCache,
        "reorder_cache",
        lambda self, keep: reorders.append(keep.tolist()) or original(self, keep),
    )
    ids, mask = left_pad(MIXED_PROMPTS, PAD)

    def run(drop: bool):
        batch_sizes.clear()
        rollout = generate(
            lm,
            ids,
            mask,
            replace(config, drop_finished_rows=drop),
            EOS,
            PAD,
            torch.Generator().manual_seed(11),
            return_logprobs=True,
        )
        return rollout, list(batch_sizes)

    kept, kept_sizes = run(False)
    assert reorders == [] and set(kept_sizes) == {len(MIXED_PROMPTS)}
    dropped, dropped_sizes = run(True)
    assert reorders, "no row left the batch: the case does not exercise the drop"
    assert dropped_sizes == sorted(dropped_sizes, reverse=True) and dropped_sizes[-1] < len(MIXED_PROMPTS)
    lengths = kept.response_mask.sum(1)
    assert lengths.min() < lengths.max()  # mixed lengths
    assert torch.equal(dropped.input_ids, kept.input_ids)
    assert torch.equal(dropped.attention_mask, kept.attention_mask)
    assert torch.equal(dropped.ended_with_eos, kept.ended_with_eos)
    torch.testing.assert_close(dropped.logprobs, kept.logprobs, rtol=0, atol=1e-6)
    # a row leaves only after it ended, and the batch shrinks by a quarter or more at a time
    for before, after in zip(dropped_sizes, dropped_sizes[1:]):
        assert after == before or 4 * after <= 3 * before


def test_a_batch_of_one_never_reorders_the_cache(lm, monkeypatch):
    from transformers import DynamicCache

    monkeypatch.setattr(DynamicCache, "reorder_cache", lambda *_: pytest.fail("reordered"))
    with torch.no_grad():
        lm.lm_head.weight[EOS] += 2.0
    ids, mask = left_pad(PROMPTS[:1], PAD)
    rollout = generate(
        lm, ids, mask, SamplingConfig(max_new_tokens=20), EOS, PAD, torch.Generator().manual_seed(0)
    )
    assert rollout.response_ids.shape[0] == 1


# -- reading finished rows every few steps (accelerators) ------------------------------------------


def decode_steps_run(lm, run) -> int:
    """Decoder calls made by `run()` after the prefill: the decode steps the loop took."""
    calls: list[int] = []
    hook = lm.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        run()
    finally:
        hook.remove()
    return len(calls) - 1


@pytest.mark.parametrize("eos_boost", [0.6, 3.0], ids=["mixed-lengths", "all-end-early"])
@pytest.mark.parametrize("drop", [True, False], ids=["drop", "keep"])
@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(max_new_tokens=30, temperature=1.2, top_p=0.9, repetition_penalty=1.2),
        SamplingConfig(max_new_tokens=30, do_sample=False, repetition_penalty=1.3),
    ],
    ids=["sample", "greedy"],
)
def test_checking_finished_rows_every_few_steps_draws_the_same_rollout(lm, config, drop, eos_boost):
    """finished_check_every=4 (what an accelerator does) against 1: finished rows keep emitting pads
    until the next check, and the rollout (tokens, masks, T, log-probs) is the same; the loop only
    exits on a check step."""
    from dataclasses import replace

    with torch.no_grad():
        lm.lm_head.weight[EOS] += eos_boost
    ids, mask = left_pad(MIXED_PROMPTS, PAD)
    rollouts, steps = {}, {}
    for every in (1, 4):
        cfg = replace(config, drop_finished_rows=drop, finished_check_every=every)

        def run(cfg=cfg, every=every):
            generator = torch.Generator().manual_seed(5)
            rollouts[every] = generate(lm, ids, mask, cfg, EOS, PAD, generator, return_logprobs=True)

        steps[every] = decode_steps_run(lm, run)
    every_step, every_4 = rollouts[1], rollouts[4]
    lengths = every_step.response_lengths
    assert bool(every_step.ended_with_eos.all()) and int(lengths.max()) < config.max_new_tokens
    if eos_boost < 1:
        assert lengths.min() < lengths.max()
    assert torch.equal(every_4.input_ids, every_step.input_ids)  # T trimmed to the longest response
    assert torch.equal(every_4.attention_mask, every_step.attention_mask)
    assert torch.equal(every_4.ended_with_eos, every_step.ended_with_eos)
    # float rounding only: dropping finished rows at other steps changes the batch shapes of the
    # matmuls, so a log-prob may differ in its last float32 bits (1.2e-6 seen on this machine)
    torch.testing.assert_close(every_4.logprobs, every_step.logprobs, rtol=1e-6, atol=1e-6)
    longest = int(lengths.max())
    assert steps[1] == longest - 1  # every step checks: it exits right after the last EOS
    assert (steps[4] + 1) % 4 == 0 and longest <= steps[4] + 1 < longest + 4  # the next check step


@pytest.mark.parametrize("drop", [True, False], ids=["drop", "keep"])
@pytest.mark.parametrize(
    "config,prompts",
    [
        (SamplingConfig(max_new_tokens=30, temperature=1.2, repetition_penalty=1.2), MIXED_PROMPTS),
        # every row the same: they all end at one step, when the decoder's batch still holds them all
        (SamplingConfig(max_new_tokens=30, do_sample=False), [MIXED_PROMPTS[3]] * 6),
    ],
    ids=["sample-mixed", "greedy-ending-together"],
)
def test_in_lockstep_the_loop_steps_on_until_every_rank_has_ended_with_the_same_rollout(
    lm, config, prompts, drop
):
    """`all_ranks_done` (fsdp2's per-layer rollout: every rank runs the same forwards): this
    process's rows have all ended at step L, the other ranks' (simulated) at step L + 5. The loop
    decodes on to L + 5 with one ended row in the decoder's batch (drop_finished_rows) or all of
    them, and the rollout is the one of the loop alone; the generator has drawn the 5 steps more
    that `skip_draws` would have drawn for a rank that stopped at L."""
    from dataclasses import replace

    from rlhf.models.sampling import skip_draws

    with torch.no_grad():
        lm.lm_head.weight[EOS] += 3.0  # every row ends well before max_new_tokens
    ids, mask = left_pad(prompts, PAD)
    config = replace(config, drop_finished_rows=drop)
    behind = torch.Generator().manual_seed(5)
    alone = generate(lm, ids, mask, config, EOS, PAD, behind, return_logprobs=True)
    longest = int(alone.response_lengths.max())
    assert bool(alone.ended_with_eos.all()) and longest + 5 < config.max_new_tokens
    asked: list[bool] = []

    def all_ranks_done(mine: bool) -> bool:
        asked.append(mine)
        return len(asked) == longest + 5

    batch_sizes: list[int] = []
    lm.model.register_forward_hook(
        lambda _m, args, kwargs, _out: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    generator = torch.Generator().manual_seed(5)
    stepped = generate(
        lm, ids, mask, config, EOS, PAD, generator, return_logprobs=True, all_ranks_done=all_ranks_done
    )
    assert asked == [False] * (longest - 1) + [True] * 6  # asked at every step (a CPU checks each)
    assert (alone.decode_steps, stepped.decode_steps) == (longest, longest + 5)
    assert len(batch_sizes) == longest + 5  # the prefill, then a forward per step but the last
    rows = len(prompts)
    if not drop:
        assert set(batch_sizes) == {rows}
    elif not config.do_sample:  # the whole batch ended at once: one of its rows steps along
        assert alone.response_lengths.min() == longest and batch_sizes == [rows] * longest + [1] * 5
    else:
        assert batch_sizes[-5:] == [1] * 5
    assert torch.equal(stepped.input_ids, alone.input_ids)  # T trimmed to the longest response
    assert torch.equal(stepped.attention_mask, alone.attention_mask)
    assert torch.equal(stepped.ended_with_eos, alone.ended_with_eos)
    torch.testing.assert_close(stepped.logprobs, alone.logprobs, rtol=0, atol=0)
    if config.do_sample:
        skip_draws(behind, rows, 5, torch.device("cpu"))
    assert torch.equal(generator.get_state(), behind.get_state())


def test_finished_check_every_defaults_per_device_and_is_validated():
    config = SamplingConfig()
    assert config.check_every(torch.device("cpu")) == 1
    assert config.check_every(torch.device("cuda")) == 8
    assert SamplingConfig(finished_check_every=3).check_every(torch.device("cpu")) == 3
    with pytest.raises(ValueError, match="SamplingConfig.finished_check_every"):
        SamplingConfig(finished_check_every=0)


def test_without_stop_at_eos_the_check_changes_nothing(lm):
    ids, mask = left_pad(PROMPTS, PAD)
    out = [
        generate(
            lm,
            ids,
            mask,
            SamplingConfig(max_new_tokens=7, stop_at_eos=False, finished_check_every=every),
            EOS,
            PAD,
            torch.Generator().manual_seed(1),
        )
        for every in (1, 3)
    ]
    assert out[0].response_ids.shape[1] == 7 and torch.equal(out[0].input_ids, out[1].input_ids)


def reference_paper_sample(model, prompts, seed: int, max_new: int) -> list[list[int]]:
    """The sampling of PPO paper §6.1 as a plain loop over a batch: a full forward per step
    (no cache), the CTRL repetition penalty 1.1 on the tokens of the prompt and the response so far,
    temperature 0.8, the nucleus of mass 0.9 (the token that crosses it kept), renormalized, and
    one uniform per row per step inverted through the nucleus' cumulative probabilities in
    descending order. A row stops after its EOS; every row draws a uniform at every step."""
    generator = torch.Generator().manual_seed(seed)
    rows = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    running = [True] * len(prompts)
    for _ in range(max_new):
        uniforms = torch.rand(len(prompts), 1, generator=generator)
        for b, row in enumerate(rows):
            if not running[b]:
                continue
            with torch.no_grad():
                logits = model(torch.tensor([row])).logits[0, -1].double()
            for token in set(row):  # previous tokens, prompt included
                logits[token] = logits[token] / 1.1 if logits[token] > 0 else logits[token] * 1.1
            probs = torch.softmax(logits / 0.8, -1)
            order = torch.argsort(probs, descending=True)
            kept, mass = [], 0.0
            for token in order.tolist():
                kept.append(token)
                mass += float(probs[token])
                if mass >= 0.9:
                    break
            weights = probs[kept] / probs[kept].sum()
            cumulative = torch.cumsum(weights, 0)
            pick = kept[min(int((cumulative <= float(uniforms[b])).sum()), len(kept) - 1)]
            row.append(pick)
            out[b].append(pick)
            running[b] = pick != EOS
        if not any(running):
            break
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paper_sampling_matches_a_plain_loop(lm, seed):
    """SamplingConfig.ppo_paper() draws the tokens the reference loop draws from the same seed."""
    config = SamplingConfig.ppo_paper(max_new_tokens=12)
    ids, mask = left_pad(PROMPTS, PAD)
    rollout = generate(lm, ids, mask, config, EOS, PAD, torch.Generator().manual_seed(seed))
    expected = reference_paper_sample(lm, PROMPTS, seed, 12)
    got = [rollout.response_ids[b, : int(rollout.response_lengths[b])].tolist() for b in range(len(PROMPTS))]
    assert got == expected
    assert any(len(set(r)) < len(r) for r in got) or any(len(r) > 3 for r in got)  # long enough to repeat
