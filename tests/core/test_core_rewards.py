"""ScoreProcessor switches and order, token rewards, advantage whitening."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from rlhf.core import ScoreProcessor, token_rewards


def np_std(values: list[float]) -> float:
    return float(np.std(np.asarray(values, dtype=np.float64), ddof=1))


# --- token_rewards -----------------------------------------------------------------------------


def test_token_rewards_hand_made() -> None:
    scores = torch.tensor([2.0, -1.0, 5.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, float("nan"), float("inf")], [float("nan")] * 3])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    expected = torch.tensor([[-0.01, -0.02, -0.03 + 2.0], [-0.05 - 1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(token_rewards(scores, kl, mask, beta=0.1), expected)


@pytest.mark.parametrize("seed", range(5))
def test_token_rewards_match_loop(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, width, beta = 5, 7, 0.05
    kl = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    scores = torch.randn(batch, generator=gen, dtype=torch.float64)
    lengths = torch.randint(0, width + 1, (batch,), generator=gen).tolist()
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).double()
    out = token_rewards(scores, kl, mask, torch.tensor(beta, dtype=torch.float64))
    for b in range(batch):
        for t in range(width):
            expected = 0.0
            if t < lengths[b]:
                expected = -beta * kl[b, t].item() + (scores[b].item() if t == lengths[b] - 1 else 0.0)
            assert out[b, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_token_rewards_finds_last_valid_token_from_the_mask() -> None:
    """No padding side is guessed: the score goes to the last position where mask == 1."""
    out = token_rewards(torch.tensor([3.0]), torch.zeros(1, 5), torch.tensor([[0, 1, 1, 0, 0]]), beta=0.0)
    assert out.tolist() == [[0.0, 0.0, 3.0, 0.0, 0.0]]


def test_token_rewards_shape_errors() -> None:
    with pytest.raises(ValueError, match=r"scores must have shape \[B\] = \[2\]"):
        token_rewards(torch.zeros(3), torch.zeros(2, 4), torch.ones(2, 4), beta=0.1)


# --- ScoreProcessor ---------------------------------------------------------------------------

BATCHES = [[1.0, 2.0, 3.0, 4.0], [10.0, -2.0], [0.5, 0.25, 8.0]]


def run(processor: ScoreProcessor, batches: list[list[float]]) -> list[list[float]]:
    return [processor(torch.tensor(b, dtype=torch.float64)).tolist() for b in batches]


def test_all_switches_off_is_identity_but_tracks_moments() -> None:
    processor = ScoreProcessor()
    assert run(processor, BATCHES) == BATCHES
    seen = sum(BATCHES, [])
    assert processor.moments.count == len(seen)
    assert processor.moments.mean == pytest.approx(float(np.mean(seen)))


@pytest.mark.parametrize("scale", [False, True])
def test_normalize_uses_moments_updated_with_this_batch(scale: bool) -> None:
    """normalize works without scale; with scale too the result is the same."""
    outputs = run(ScoreProcessor(scale=scale, normalize=True), BATCHES)
    seen: list[float] = []
    for batch, out in zip(BATCHES, outputs):
        seen += batch  # moments updated before use
        mean, std = float(np.mean(seen)), np_std(seen)
        assert out == pytest.approx([(r - mean) / std for r in batch], rel=1e-12)
    assert outputs[0] == pytest.approx(
        [-1.5 / math.sqrt(5 / 3), -0.5 / math.sqrt(5 / 3), 0.5 / math.sqrt(5 / 3), 1.5 / math.sqrt(5 / 3)]
    )


def test_scale_divides_by_running_std_without_shifting() -> None:
    outputs = run(ScoreProcessor(scale=True), BATCHES)
    seen: list[float] = []
    for batch, out in zip(BATCHES, outputs):
        seen += batch
        assert out == pytest.approx([r / np_std(seen) for r in batch], rel=1e-12)


def test_clip_alone_and_after_normalization() -> None:
    assert run(ScoreProcessor(clip=2.5), [[-10.0, 1.0, 3.0]]) == [[-2.5, 1.0, 2.5]]
    batch = [0.0, 0.0, 0.0, 0.0, 10.0]  # mean 2, std sqrt(20): normalized 10 -> 1.789
    out = run(ScoreProcessor(normalize=True, clip=1.0), [batch])[0]
    normalized = [(r - 2.0) / math.sqrt(20.0) for r in batch]
    assert out == pytest.approx([max(-1.0, min(1.0, s)) for s in normalized])
    assert out[-1] == 1.0 and out[0] == pytest.approx(-2.0 / math.sqrt(20.0))  # clipped after, not before


def test_undefined_or_zero_std_leaves_scores_unscaled() -> None:
    assert run(ScoreProcessor(scale=True), [[3.0]]) == [[3.0]]  # one score: std undefined
    assert run(ScoreProcessor(scale=True), [[2.0, 2.0]]) == [[2.0, 2.0]]  # constant: std 0
    assert run(ScoreProcessor(normalize=True), [[2.0, 2.0]]) == [[0.0, 0.0]]
    processor = ScoreProcessor(normalize=True)
    assert run(processor, [[]]) == [[]] and processor.moments.count == 0


def test_discounted_scaling_matches_loop() -> None:
    gamma = 0.9
    outputs = run(ScoreProcessor(scale=True, discounted=True, gamma=gamma), BATCHES)
    running_return, returns = 0.0, []
    for batch, out in zip(BATCHES, outputs):
        for r in batch:
            running_return = gamma * running_return + r
            returns.append(running_return)
        std = np_std(returns) if len(returns) >= 2 else 1.0
        assert out == pytest.approx([r / std for r in batch], rel=1e-12)


def test_discounted_with_gamma_zero_is_plain_scaling() -> None:
    discounted = sum(run(ScoreProcessor(scale=True, discounted=True, gamma=0.0), BATCHES), [])
    assert discounted == pytest.approx(sum(run(ScoreProcessor(scale=True), BATCHES), []), rel=1e-12)


@pytest.mark.parametrize(
    "options",
    [{"scale": True}, {"normalize": True, "clip": 1.0}, {"scale": True, "discounted": True, "gamma": 0.99}],
)
def test_state_dict_resume_equals_uninterrupted(options: dict) -> None:
    uninterrupted = run(ScoreProcessor(**options), BATCHES)
    first = ScoreProcessor(**options)
    head = run(first, BATCHES[:1])
    resumed = ScoreProcessor(**options)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + run(resumed, BATCHES[1:]) == uninterrupted


def test_score_processor_config_errors() -> None:
    with pytest.raises(ValueError, match="set scale=True and normalize=False"):
        ScoreProcessor(discounted=True, gamma=0.9)
    with pytest.raises(ValueError, match="set scale=True and normalize=False"):
        ScoreProcessor(scale=True, normalize=True, discounted=True, gamma=0.9)
    with pytest.raises(ValueError, match="0 <= gamma < 1"):
        ScoreProcessor(scale=True, discounted=True, gamma=1.0)
    with pytest.raises(ValueError, match="reward clip must be > 0"):
        ScoreProcessor(clip=0.0)
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        ScoreProcessor()(torch.zeros(2, 3))
