"""DAPO's rollout-side switches against plain loops (Yu et al. 2025, arXiv 2503.14476):
dynamic sampling (DAPO paper §3.2, rollout.dynamic_sampling; docs/algorithms.md §36) and the soft
overlong punishment (§3.4, reward.overlong_buffer; §37), first on synthetic rollouts, then
through the trainer on the tiny models of tests/support/train_fixtures.py."""

from __future__ import annotations

import random

import pytest
import torch

from rlhf.config import ConfigError
from rlhf.models.rollout_rows import concat_rollouts, select_rollout
from rlhf.models.sampling import Rollout
from rlhf.rl.dapo import (
    Scored,
    fill_with_informative,
    overlong_buffer_tokens,
    shaped_scores,
)
from tests.support.train_testing import MAX_NEW_TOKENS, metric_rows, rl_config

FIRST_TOKEN = "tests.support.dapo_rewards:first_token_even"


# --------------------------------------------------------------------------------------------
# synthetic rollouts
# --------------------------------------------------------------------------------------------
def fake_rollout(rows: int, prompt_length: int, width: int, seed: int, logprobs: bool = True) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(1, prompt_length + 1, (rows,), generator=g)
    resp_len = torch.randint(1, width + 1, (rows,), generator=g)
    ids = torch.randint(4, 50, (rows, prompt_length + width), generator=g)
    attn = torch.zeros(rows, prompt_length + width, dtype=torch.long)
    resp = torch.zeros(rows, width)
    for i in range(rows):
        attn[i, prompt_length - int(prompt_len[i]) : prompt_length + int(resp_len[i])] = 1
        resp[i, : int(resp_len[i])] = 1
    ids = ids * attn  # padding id 0
    lp = -torch.rand(rows, width, generator=g) * resp if logprobs else None
    ended = torch.rand(rows, generator=g) < 0.5
    return Rollout(ids, attn, prompt_length, resp, ended, lp, decode_steps=width)


def real_tokens(rollout: Rollout) -> list[tuple[list[int], list[int], list[float] | None]]:
    """Each row's real prompt tokens, real response tokens and response log-probs."""
    out = []
    for i in range(rollout.input_ids.shape[0]):
        prompt = [int(t) for t, m in zip(rollout.prompt_ids[i], rollout.prompt_mask[i]) if m]
        n = int(rollout.response_mask[i].sum())
        response = rollout.response_ids[i, :n].tolist()
        lp = None if rollout.logprobs is None else rollout.logprobs[i, :n].tolist()
        out.append((prompt, response, lp, bool(rollout.ended_with_eos[i])))
    return out


def test_concat_rollouts_keeps_every_row_and_pads_in_the_layout() -> None:
    parts = [fake_rollout(3, 2, 4, 0), fake_rollout(2, 5, 1, 1), fake_rollout(1, 3, 6, 2)]
    joined = concat_rollouts(parts, pad_token_id=0)
    assert joined.prompt_length == 5 and joined.response_mask.shape == (6, 6)
    assert joined.decode_steps == 4 + 1 + 6
    assert real_tokens(joined) == [row for p in parts for row in real_tokens(p)]
    # left-padded prompt block, right-padded response block: masks say where the real tokens are
    assert torch.equal(joined.attention_mask[:, 5:].float(), joined.response_mask)
    no_lp = concat_rollouts([fake_rollout(2, 2, 2, 3), fake_rollout(2, 2, 2, 4, logprobs=False)])
    assert no_lp.logprobs is None


def test_select_rollout_picks_rows() -> None:
    r = fake_rollout(5, 3, 4, 0)
    picked = select_rollout(r, torch.tensor([4, 1]))
    assert real_tokens(picked) == [real_tokens(r)[4], real_tokens(r)[1]]


def scored_batch(scores: list[float], groups: int, seed: int, keep: list[bool] | None = None) -> Scored:
    n = len(scores)
    rollout = fake_rollout(n, 3, 4, seed)
    group = torch.arange(groups).repeat_interleave(n // groups)
    keep_t = torch.ones(n, dtype=torch.bool) if keep is None else torch.tensor(keep)
    raw = torch.tensor(scores) + 100.0  # raw scores differ from the shaped ones: both carried along
    return Scored(group, rollout, raw, torch.tensor(scores), keep_t)


def selection_loop(batches: list[Scored], groups: int, max_rounds: int):
    """The plain loop: per round, per group in order, a group whose kept scores are not all equal
    is kept while fewer than `groups` are; stop when full or after max_rounds."""
    kept, rounds = [], 0
    for batch in batches[:max_rounds]:
        rounds += 1
        ids = batch.group.tolist()
        for g in sorted(set(ids)):
            rows = [i for i in range(len(ids)) if ids[i] == g]
            values = [float(batch.scores[i]) for i in rows if bool(batch.keep[i])]
            if len(values) >= 2 and max(values) != min(values) and len(kept) < groups:
                kept.append([(real_tokens(batch.rollout)[i], float(batch.scores[i]), float(batch.raw_scores[i]),
                              bool(batch.keep[i])) for i in rows])  # fmt: skip
        if len(kept) >= groups:
            break
    return kept, rounds


@pytest.mark.parametrize("seed", range(12))
def test_fill_with_informative_matches_a_plain_loop(seed: int) -> None:
    rng = random.Random(seed)
    per_group, groups, max_rounds = rng.choice([2, 3, 4]), rng.randint(1, 4), rng.randint(1, 4)
    batches = []
    for r in range(max_rounds):
        n = per_group * groups
        scores = [float(rng.random() < rng.choice([0.1, 0.5, 0.9])) for _ in range(n)]
        keep = [rng.random() < 0.85 for _ in range(n)] if seed % 3 == 0 else None
        batches.append(scored_batch(scores, groups, seed * 10 + r, keep))
    drawn = iter(batches[1:])
    joined, metrics = fill_with_informative(batches[0], lambda: next(drawn), groups, max_rounds)
    expected, rounds = selection_loop(batches, groups, max_rounds)
    assert metrics["dynamic_sampling/rounds"] == rounds
    assert metrics["dynamic_sampling/fill"] == pytest.approx(len(expected) / groups)
    informative = sum(
        len(g) for g in (selection_loop([b], 10**6, 1)[0] for b in batches[:rounds])
    )  # every informative group of the rounds drawn, not only those kept
    assert metrics["dynamic_sampling/informative_fraction"] == pytest.approx(informative / (groups * rounds))
    if not expected:  # nothing informative: the last rollout as it is
        assert joined is batches[rounds - 1]
        return
    tokens = real_tokens(joined.rollout)
    got, row = [], 0
    for g in range(len(expected)):
        members = (joined.group == g).nonzero().squeeze(1).tolist()
        assert members == list(range(row, row + len(members)))  # renumbered 0..k-1, contiguous
        got.append([(tokens[i], float(joined.scores[i]), float(joined.raw_scores[i]), bool(joined.keep[i]))
                    for i in members])  # fmt: skip
        row += len(members)
    assert row == len(joined.group)
    assert got == expected


def test_fill_with_informative_stops_at_the_cap_with_a_partial_batch() -> None:
    flat = scored_batch([1.0, 1.0, 0.0, 0.0], 2, 0)
    one = scored_batch([1.0, 0.0, 1.0, 1.0], 2, 1)
    calls = []

    def draw():
        calls.append(1)
        return one if len(calls) == 1 else flat

    joined, metrics = fill_with_informative(flat, draw, groups=2, max_rounds=3)
    assert len(calls) == 2  # the cap: 3 rounds, the first included
    assert metrics["dynamic_sampling/rounds"] == 3 and metrics["dynamic_sampling/fill"] == 0.5
    assert joined.scores.tolist() == [1.0, 0.0] and joined.group.tolist() == [0, 0]


def test_fill_with_informative_draws_nothing_when_the_first_batch_is_informative() -> None:
    batch = scored_batch([1.0, 0.0, 0.5, 0.0], 2, 0)
    joined, metrics = fill_with_informative(batch, lambda: pytest.fail("drew again"), 2, 4)
    assert metrics["dynamic_sampling/rounds"] == 1 and metrics["dynamic_sampling/fill"] == 1.0
    assert real_tokens(joined.rollout) == real_tokens(batch.rollout)


def test_overlong_buffer_tokens_is_the_rounded_share_of_the_budget() -> None:
    assert overlong_buffer_tokens(0.2, 20480) == 4096  # DAPO paper §4.1
    assert overlong_buffer_tokens(0.2, 64) == 13 and overlong_buffer_tokens(0.2, 4) == 1
    assert overlong_buffer_tokens(0.01, 5) == 1 and overlong_buffer_tokens(1.0, 5) == 5


def test_shaped_scores_add_the_factor_times_the_penalty() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 2.0])
    lengths = torch.tensor([2, 4, 5, 6])
    shaped, penalty = shaped_scores(scores, lengths, max_length=5, buffer=2, factor=0.5)
    # 0 up to 3 tokens, -1/2 at 4, -1 at 5 and beyond; times 0.5
    assert penalty.tolist() == pytest.approx([0.0, -0.25, -0.5, -0.5])
    assert shaped.tolist() == pytest.approx([1.0, 0.75, -0.5, 1.5])


# --------------------------------------------------------------------------------------------
# through the trainer
# --------------------------------------------------------------------------------------------
GROUPED = {
    "rollout": {"samples_per_prompt": 2, "batch_size": 4},
    "reward": {"functions": [FIRST_TOKEN], "model_weight": 0.0},
    "train": {"minibatches": 1},
}


def response_rows(rollout_like) -> list[list[int]]:
    ids = rollout_like.input_ids[:, rollout_like.prompt_length :]
    mask = rollout_like.response_mask
    return [[int(t) for t, m in zip(r, k) if m] for r, k in zip(ids, mask)]


def test_trainer_dynamic_sampling_trains_on_the_plain_loops_groups(make_trainer) -> None:
    rounds = 4
    on = make_trainer(
        rl_config("grpo", GROUPED, rollout={"dynamic_sampling": True, "max_sampling_rounds": rounds})
    )
    exp, metrics = on.make_experience()
    # the same draws by a trainer without the switch, selected by the plain loop
    off = make_trainer(rl_config("grpo", GROUPED))
    batches = [off.rollouts.next_batch(0) for _ in range(int(metrics["dynamic_sampling/rounds"]))]
    expected, n_rounds = selection_loop(batches, 4, rounds)
    assert n_rounds == metrics["dynamic_sampling/rounds"]
    assert metrics["dynamic_sampling/fill"] == pytest.approx(len(expected) / 4)
    assert 0 < len(expected)
    assert response_rows(exp) == [tokens[1] for group in expected for tokens, *_ in group]
    scores = exp.advantages.sum(1) != 0
    assert bool(scores.any())  # every kept group has a nonzero advantage somewhere
    for g in torch.unique(exp.group):
        assert bool(exp.advantages[exp.group == g].abs().sum() > 0)
    assert metrics["group/zero_std_fraction"] == 0.0


def test_trainer_overlong_penalty_matches_the_closed_form(make_trainer) -> None:
    monte_carlo = {"advantage": {"gamma": 1.0, "lam": 1.0, "whiten": False}}
    buffer, factor = 2, 0.5
    base = make_trainer(rl_config("vanilla_ppo", monte_carlo))
    plain, _ = base.make_experience()
    shaped = make_trainer(
        rl_config(
            "vanilla_ppo",
            monte_carlo,
            reward={"overlong_buffer": buffer / MAX_NEW_TOKENS, "overlong_penalty_factor": factor},
        )
    )
    exp, metrics = shaped.make_experience()
    lengths = exp.response_mask.sum(1).tolist()
    assert max(lengths) == MAX_NEW_TOKENS  # some responses hit the limit
    start = MAX_NEW_TOKENS - buffer
    expected = [0.0 if n <= start else factor * (start - n) / buffer for n in lengths]
    torch.testing.assert_close(
        exp.returns[:, 0] - plain.returns[:, 0], torch.tensor(expected), rtol=0, atol=1e-5
    )
    assert metrics["reward/overlong_penalty"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)


def test_dapo_switches_refuse_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match="samples_per_prompt"):
        rl_config("vanilla_ppo", rollout={"dynamic_sampling": True})
    with pytest.raises(ConfigError, match="overlong_buffer"):
        rl_config("vanilla_ppo", reward={"overlong_buffer": 1.5})
    with pytest.raises(ConfigError, match="max_sampling_rounds"):
        rl_config("grpo", rollout={"dynamic_sampling": True, "max_sampling_rounds": 0})
    with pytest.raises(ConfigError, match="clip_eps_high"):
        rl_config("grpo", policy={"clip_eps_high": 0.0})


@pytest.mark.slow
def test_dapo_run_resumes_to_identical_metrics(make_trainer, tmp_path) -> None:
    """Extra sampling rounds draw prompts and random numbers: a resumed run draws the same ones."""
    layers = (
        GROUPED,
        {
            "reward": {"overlong_buffer": 0.4},
            "train": {"iterations": 3},
            "checkpoint": {"every": 1, "keep": 1},
        },
    )
    whole, split = tmp_path / "whole", tmp_path / "split"
    make_trainer(rl_config("dapo", *layers, out=whole), run_dir=whole).train()
    first = make_trainer(rl_config("dapo", *layers, out=split), run_dir=split)
    original = first.step

    def step():  # dies as it starts iteration 2 (a killed process), after checkpoint iter_000002
        if first.iteration == 2:
            raise KeyboardInterrupt
        return original()

    first.step = step
    with pytest.raises(KeyboardInterrupt):
        first.train()
    make_trainer(rl_config("dapo", *layers, out=split), run_dir=split, resume=True).train()
    expected, got = metric_rows(whole), metric_rows(split)
    assert [r["iteration"] for r in got] == [0, 1, 2] and got == expected
    assert any(r["dynamic_sampling/rounds"] > 1 for r in expected)  # extra rounds happened
    assert all("policy/clip_fraction_high" in r and "reward/overlong_penalty" in r for r in expected)
