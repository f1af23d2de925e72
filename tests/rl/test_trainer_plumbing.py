"""The trainer's plumbing: checkpoints without pickle, experience slicing and joining, the
learning-rate schedule, the prompt stream and distinct-n."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.config import OptimConfig
from rlhf.models.logprobs import response_logprobs
from rlhf.models.tiny import tiny_causal_lm
from rlhf.rl.experience import Experience, concat_experiences, forward_in_chunks
from rlhf.rl.metrics import distinct_n
from rlhf.rl.prompts import PromptStream
from rlhf.rundir import checkpoint as ckpt
from rlhf.train.optimizer import build_optimizer, clip_and_step, lr_multiplier


# -- checkpoints -------------------------------------------------------------------------------
def assert_same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_state_round_trips_without_pickle(tmp_path):
    state = {
        "iteration": 3,
        "ratio": 0.25,
        "flag": True,
        "none": None,
        "name": "ppo",
        "tensor": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "half": torch.tensor([1.5], dtype=torch.float16),
        "tuple": (0.9, 0.95),
        "by_index": {0: {"step": torch.tensor(4.0)}, 1: {"step": torch.tensor(5.0)}},
        "list": [torch.zeros(2), {"inner": [1, 2]}],
    }
    ckpt.save_state(state, tmp_path, "trainer")
    assert not any(p.suffix in (".pt", ".pkl", ".bin") for p in tmp_path.iterdir())
    assert_same(ckpt.load_state(tmp_path, "trainer"), state)


def test_state_refuses_what_it_cannot_store_without_pickle(tmp_path):
    with pytest.raises(TypeError, match=r"checkpoint state at '.model': cannot store object"):
        ckpt.save_state({"model": object()}, tmp_path, "x")
    with pytest.raises(TypeError, match="dict keys must be all str or all int"):
        ckpt.save_state({"mixed": {1: 0, "a": 1}}, tmp_path, "x")


def test_optimizer_state_round_trip_continues_identically(tmp_path):
    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.9, 0.95))

    def train_step(model, optimizer, x):
        model(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    model_a, opt_a = make()
    train_step(model_a, opt_a, x)
    ckpt.save_state({"opt": opt_a.state_dict(), "model": model_a.state_dict()}, tmp_path, "s")
    model_b, opt_b = make()
    loaded = ckpt.load_state(tmp_path, "s")
    model_b.load_state_dict(loaded["model"])
    opt_b.load_state_dict(loaded["opt"])
    for model, opt in ((model_a, opt_a), (model_b, opt_b)):
        train_step(model, opt, x)
    assert all(torch.equal(p, q) for p, q in zip(model_a.parameters(), model_b.parameters()))


def test_rng_state_restores_every_generator(tmp_path):
    generator = torch.Generator().manual_seed(5)
    saved = ckpt.rng_state({"g": generator})
    ckpt.save_state(saved, tmp_path, "rng")
    first = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=generator))
    for _ in range(3):
        random.random(), np.random.rand(), torch.rand(1), torch.rand(1, generator=generator)
    ckpt.set_rng_state(ckpt.load_state(tmp_path, "rng"), {"g": generator})
    again = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=generator))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2]) and torch.equal(first[3], again[3])


def test_atomic_directory_keeps_the_old_checkpoint_when_a_save_fails(tmp_path):
    final = tmp_path / "checkpoints" / "iter_000002"
    with ckpt.atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(RuntimeError), ckpt.atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("killed while saving")
    assert (final / "a.txt").read_text() == "one"
    assert sorted(p.name for p in final.parent.iterdir()) == ["iter_000002"]  # no temporary left
    with ckpt.atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("two")
    assert (final / "a.txt").read_text() == "two"


def test_list_and_prune_checkpoints(tmp_path):
    for i in (2, 10, 9):
        (tmp_path / "checkpoints" / f"iter_{i:06d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"iter_{i:06d}" / "DONE").write_text(str(i))
    (tmp_path / "checkpoints" / "iter_000011").mkdir()  # incomplete: no DONE
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["iter_000002", "iter_000009", "iter_000010"]
    ckpt.prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["iter_000009", "iter_000010"]
    assert ckpt.list_checkpoints(tmp_path / "nowhere") == []


# -- experience --------------------------------------------------------------------------------
def toy_experience(prompt_lengths, response_lengths, seed=0) -> Experience:
    """A rollout layout: left-padded prompts of P columns, right-padded responses of T columns."""
    generator = torch.Generator().manual_seed(seed)
    P, T, B = max(prompt_lengths), max(response_lengths), len(prompt_lengths)
    ids = torch.zeros(B, P + T, dtype=torch.long)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    mask = torch.zeros(B, T)
    for b, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        ids[b, P - p : P + r] = torch.randint(4, 20, (p + r,), generator=generator)
        attn[b, P - p : P + r] = 1
        mask[b, :r] = 1
    per_token = {k: torch.randn(B, T, generator=generator) * mask for k in
                 ("old_logp", "ref_logp", "old_values", "advantages", "returns")}  # fmt: skip
    return Experience(
        input_ids=ids,
        attention_mask=attn,
        prompt_length=P,
        response_mask=mask,
        group=torch.arange(B),
        **per_token,
    )


def test_select_trims_all_padding_columns():
    exp = toy_experience([1, 3, 2], [4, 1, 2])
    picked = exp.select(torch.tensor([1, 2]))
    assert picked.prompt_length == 3 and picked.response_mask.shape == (2, 2)  # response width 2, prompt 3
    assert torch.equal(picked.input_ids, exp.input_ids[[1, 2], :5])
    assert torch.equal(picked.advantages, exp.advantages[[1, 2], :2])
    short = exp.select(torch.tensor([0]))
    assert short.prompt_length == 1 and short.input_ids.shape == (1, 5)
    assert torch.equal(short.input_ids, exp.input_ids[0, 2:][None])


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 9), count=st.integers(1, 9), seed=st.integers(0, 100))
def test_minibatches_cover_every_row_once(batch, count, seed):
    lengths = [1 + (seed + i) % 3 for i in range(batch)]
    exp = toy_experience(lengths, [1 + (seed * i) % 4 for i in range(batch)], seed)
    sizes, tokens = [], 0.0
    for minibatch in exp.minibatches(count, torch.Generator().manual_seed(seed)):
        sizes.append(minibatch.batch_size)
        tokens += minibatch.num_tokens
    assert sum(sizes) == batch and max(sizes) - min(sizes) <= 1 and len(sizes) == min(count, batch)
    assert tokens == exp.num_tokens


def test_concat_aligns_prompt_and_response_blocks():
    a, b = toy_experience([2, 1], [3, 1], seed=1), toy_experience([4], [1], seed=2)
    joined = concat_experiences([a, b])
    assert joined.prompt_length == 4 and joined.response_mask.shape == (3, 3)
    assert torch.equal(joined.input_ids[:2, 2:], a.input_ids) and joined.attention_mask[:2, :2].sum() == 0
    assert torch.equal(joined.input_ids[2, :5], b.input_ids[0]) and joined.attention_mask[2, 5:].sum() == 0
    assert torch.equal(joined.returns[:2], a.returns) and torch.equal(joined.returns[2, :1], b.returns[0])
    assert joined.num_tokens == a.num_tokens + b.num_tokens
    assert concat_experiences([a]) is a


def test_forward_in_chunks_equals_one_forward(tok):
    model = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    exp = toy_experience([3, 1, 2, 2, 1], [2, 4, 1, 3, 1], seed=3)
    with torch.no_grad():
        whole = response_logprobs(model, exp.input_ids, exp.attention_mask, exp.prompt_length)[0]
        chunked = forward_in_chunks(
            lambda i, a, p: response_logprobs(model, i, a, p)[0],
            exp.input_ids, exp.attention_mask, exp.prompt_length, exp.response_mask.shape[1], rows=2,
        )  # fmt: skip
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)
    assert chunked[exp.response_mask == 0].abs().sum() == 0


# -- optimization --------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_lr_multiplier_by_hand(schedule):
    config = OptimConfig(warmup_steps=4, schedule=schedule, min_lr_ratio=0.1)
    f = lr_multiplier(config, total_steps=14)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    for step in (4, 9, 14, 20):
        progress = min(1.0, (step - 4) / 10)
        expected = {
            "constant": 1.0,
            "cosine": 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)),
            "linear": 0.1 + 0.9 * (1 - progress),
        }[schedule]
        assert f(step) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("warmup_steps", "fraction", "total", "expected_warmup"),
    [(0, 0.1, 20, 2), (0, 0.1, 25, 3), (5, 0.1, 20, 5), (0, 0.0, 20, 0)],  # ceil(0.1 * 25) = 3
)
def test_warmup_fraction_warms_up_over_that_share_of_the_steps(
    warmup_steps, fraction, total, expected_warmup
):
    """PPO paper §5.1: warmup over the first 10% of the steps; a fixed count, when longer, wins."""
    f = lr_multiplier(OptimConfig(warmup_steps=warmup_steps, warmup_fraction=fraction), total_steps=total)
    ramp = [(s + 1) / expected_warmup for s in range(expected_warmup)]
    assert [f(s) for s in range(expected_warmup + 3)] == pytest.approx(ramp + [1.0, 1.0, 1.0])


def test_clip_and_step_returns_the_pre_clip_norm_and_clips():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer, scheduler = build_optimizer([param], OptimConfig(lr=1.0, betas=(0.0, 0.0)), 10)
    param.grad = torch.tensor([3.0, 4.0])
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(param.grad.clone()))
    assert clip_and_step(optimizer, scheduler, [param], max_grad_norm=1.0) == pytest.approx(5.0)
    torch.testing.assert_close(seen[0], torch.tensor([0.6, 0.8]))
    assert param.grad is None  # zeroed for the next step


@pytest.mark.parametrize("norm", [0.0, 0.5, 1.0 - 1e-7, 1.0, 1.0 + 1e-7, 3.0, float("inf"), float("nan")])
def test_clip_and_step_rescales_exactly_as_clip_grad_norm(norm):
    """The gradients the optimizer sees equal torch's clip_grad_norm_ result bit for bit: below the
    limit (rescaling skipped), within 1e-6 of it (torch's epsilon still clips), above it, not finite."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(3, 2))]
    grads = [torch.randn(5), torch.randn(3, 2)]
    total = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    grads = [g * (norm / total) for g in grads]  # this total norm (inf, nan: every entry)
    expected = [g.clone() for g in grads]
    reference = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for q, g in zip(reference, expected):
        q.grad = g
    torch.nn.utils.clip_grad_norm_(reference, 1.0)
    optimizer, scheduler = build_optimizer(params, OptimConfig(lr=1.0), 10)
    for q, g in zip(params, grads):
        q.grad = g.clone()
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.extend(q.grad.clone() for q in params))
    returned = clip_and_step(optimizer, scheduler, params, max_grad_norm=1.0)
    for got, want in zip(seen, [q.grad for q in reference]):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    if norm == norm:
        assert returned == pytest.approx(norm, rel=1e-6)


def test_build_optimizer_needs_a_trainable_parameter():
    frozen = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer([frozen], OptimConfig(), 10)


# -- prompts and diversity -----------------------------------------------------------------------
def test_prompt_stream_visits_every_prompt_each_epoch_and_resumes():
    prompts = [[i] for i in range(5)]
    stream = PromptStream(prompts, seed=0)
    first_epoch = stream.next_batch(3) + stream.next_batch(2)
    assert sorted(first_epoch) == prompts
    saved = stream.state_dict()
    ahead = [stream.next_batch(4) for _ in range(3)]
    stream.load_state_dict(saved)
    assert [stream.next_batch(4) for _ in range(3)] == ahead
    with pytest.raises(ValueError, match="no prompts to sample from"):
        PromptStream([], seed=0)


def test_distinct_n_by_hand():
    ids = torch.tensor([[1, 2, 1, 2], [1, 2, 0, 0], [7, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    # bigrams: (1,2) (2,1) (1,2) | (1,2) | none -> 2 distinct of 4
    assert distinct_n(ids, mask, n=2) == 0.5
    assert distinct_n(ids, mask, n=1) == pytest.approx(3 / 7)
    assert distinct_n(ids[2:], mask[2:], n=2) == 0.0
