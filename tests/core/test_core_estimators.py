"""The advantage estimators of `estimate_advantages` against plain Python loops over hand-built
groups (docs/algorithms.md §27-30): groups of one, equal rewards, masked and truncated rows,
uneven response lengths; and what none of them may read (values at masked positions)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlhf.core import ESTIMATORS, estimate_advantages, estimator_params, gae, register_estimator

# Rows: (group id, valid length, token rewards over the valid tokens). Width 5; padding holds junk.
# group 0: three members of uneven lengths; group 1: one member; group 2: equal totals;
# group 3: two members and a fully masked row (a dropped response); group 4: a single-token row
# beside a full-width (truncated) row.
ROWS = [
    (0, 3, [0.1, -0.2, 1.5]),
    (0, 5, [0.0, 0.3, 0.0, -0.1, 0.4]),
    (0, 1, [-0.7]),
    (1, 2, [0.2, 0.9]),
    (2, 2, [0.5, 0.5]),
    (2, 4, [0.25, 0.25, 0.25, 0.25]),
    (3, 2, [1.0, 2.0]),
    (3, 0, []),
    (3, 3, [-1.0, 0.0, 0.5]),
    (4, 1, [3.0]),
    (4, 5, [0.1, 0.1, 0.1, 0.1, -2.0]),
]
WIDTH = 5
JUNK = 123.0


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rewards = torch.full((len(ROWS), WIDTH), JUNK, dtype=torch.float64)
    mask = torch.zeros(len(ROWS), WIDTH, dtype=torch.float64)
    for b, (_, length, values) in enumerate(ROWS):
        rewards[b, :length] = torch.tensor(values, dtype=torch.float64)
        mask[b, :length] = 1
    return rewards, mask, torch.tensor([g for g, _, _ in ROWS])


def members(b: int) -> list[int]:
    """Rows of row b's group that have a valid token."""
    return [j for j, (g, length, _) in enumerate(ROWS) if g == ROWS[b][0] and length > 0]


def totals() -> list[float]:
    return [sum(values) for _, _, values in ROWS]


def loop_broadcast(per_row: list[float]) -> torch.Tensor:
    out = torch.zeros(len(ROWS), WIDTH, dtype=torch.float64)
    for b, (_, length, _) in enumerate(ROWS):
        out[b, :length] = per_row[b]
    return out


def loop_grpo(eps: float, std_normalize: bool) -> torch.Tensor:
    R, per_row = totals(), []
    for b, (_, length, _) in enumerate(ROWS):
        group = [R[j] for j in members(b)]
        if length == 0 or len(group) < 2:
            per_row.append(0.0)
            continue
        centered = R[b] - statistics.fmean(group)
        per_row.append(centered / (statistics.stdev(group) + eps) if std_normalize else centered)
    return loop_broadcast(per_row)


def loop_rloo() -> torch.Tensor:
    R, per_row = totals(), []
    for b, (_, length, _) in enumerate(ROWS):
        others = [R[j] for j in members(b) if j != b]
        per_row.append(R[b] - statistics.fmean(others) if length > 0 and others else 0.0)
    return loop_broadcast(per_row)


def loop_reinforce_pp(gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    returns = torch.zeros(len(ROWS), WIDTH, dtype=torch.float64)
    for b, (_, length, values) in enumerate(ROWS):
        running = 0.0
        for t in reversed(range(length)):
            running = values[t] + gamma * running
            returns[b, t] = running
    flat = [float(returns[b, t]) for b, (_, length, _) in enumerate(ROWS) for t in range(length)]
    mean, var = statistics.fmean(flat), statistics.variance(flat)
    whitened = torch.zeros_like(returns)
    for b, (_, length, _) in enumerate(ROWS):
        for t in range(length):
            whitened[b, t] = (returns[b, t] - mean) / math.sqrt(var + 1e-8)
    return whitened, returns


@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_is_the_group_z_score_of_each_rows_summed_reward(std_normalize):
    rewards, mask, group = batch()
    advantages, returns = estimate_advantages(
        "grpo", rewards, mask, group=group, eps=1e-6, std_normalize=std_normalize
    )
    expected = loop_grpo(1e-6, std_normalize)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected)


def test_grpo_special_groups_get_no_signal():
    rewards, mask, group = batch()
    advantages, _ = estimate_advantages("grpo", rewards, mask, group=group)
    assert advantages[3].abs().sum() == 0  # a group of one
    assert advantages[4:6].abs().sum() == 0  # equal totals: std 0, and 0 / eps is 0
    assert advantages[7].abs().sum() == 0  # the fully masked row
    # the masked row is no member: group 3 is the two others, z-scores +-1/sqrt(2)
    assert float(advantages[6, 0]) == pytest.approx(1 / math.sqrt(2), rel=1e-5)
    assert float(advantages[8, 0]) == pytest.approx(-1 / math.sqrt(2), rel=1e-5)


def test_dr_grpo_is_grpo_without_the_std_division():
    rewards, mask, group = batch()
    advantages, _ = estimate_advantages("dr_grpo", rewards, mask, group=group)
    torch.testing.assert_close(advantages, loop_grpo(0.0, std_normalize=False))


def test_rloo_subtracts_the_mean_of_the_other_rows():
    rewards, mask, group = batch()
    advantages, returns = estimate_advantages("rloo", rewards, mask, group=group)
    torch.testing.assert_close(advantages, loop_rloo())
    torch.testing.assert_close(returns, loop_rloo())
    # closed form: k / (k - 1) times the mean-centred reward (k = 3 in group 0)
    R = totals()
    assert float(advantages[0, 0]) == pytest.approx(1.5 * (R[0] - statistics.fmean(R[:3])))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_whitens_the_return_to_go_over_the_batch(gamma):
    rewards, mask, _ = batch()
    advantages, returns = estimate_advantages("reinforce_pp", rewards, mask, gamma=gamma)
    want_adv, want_ret = loop_reinforce_pp(gamma)
    torch.testing.assert_close(returns, want_ret)
    torch.testing.assert_close(advantages, want_adv)


def test_gae_through_the_registry_is_gae():
    rewards, mask, _ = batch()
    values = torch.randn(rewards.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = estimate_advantages("gae", rewards, mask, values=values, gamma=0.99, lam=0.9)
    want = gae(rewards, values, mask, 0.99, 0.9)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_no_estimator_reads_masked_positions(name):
    rewards, mask, group = batch()
    values = torch.randn(rewards.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    first = estimate_advantages(name, rewards, mask, values=values, group=group)
    junk = mask == 0
    rewards2, values2 = rewards.clone(), values.clone()
    rewards2[junk], values2[junk] = float("nan"), -1e6
    second = estimate_advantages(name, rewards2, mask, values=values2, group=group)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)
        assert bool((a[junk] == 0).all())


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_need_only_the_group_not_the_row_order(name):
    rewards, mask, group = batch()
    order = torch.randperm(len(ROWS), generator=torch.Generator().manual_seed(2))
    straight, _ = estimate_advantages(name, rewards, mask, group=group)
    shuffled, _ = estimate_advantages(name, rewards[order], mask[order], group=group[order] * 7 + 3)
    torch.testing.assert_close(shuffled, straight[order])


def test_a_batch_of_one_row():
    rewards = torch.tensor([[0.5, 1.0]])
    mask = torch.ones(1, 2)
    for name in ("grpo", "dr_grpo", "rloo"):
        advantages, _ = estimate_advantages(name, rewards, mask, group=torch.tensor([0]))
        assert advantages.abs().sum() == 0, name  # a group of one has no baseline
    advantages, returns = estimate_advantages("reinforce_pp", rewards, mask)
    torch.testing.assert_close(returns, torch.tensor([[1.5, 1.0]]))
    assert float(advantages.sum()) == pytest.approx(0.0, abs=1e-6)  # whitened: mean 0


def test_missing_inputs_and_unknown_names_say_what_is_needed():
    rewards, mask, group = batch()
    with pytest.raises(ValueError, match="needs values"):
        estimate_advantages("gae", rewards, mask)
    with pytest.raises(ValueError, match="needs group ids"):
        estimate_advantages("grpo", rewards, mask)
    with pytest.raises(ValueError, match="group must have shape"):
        estimate_advantages("rloo", rewards, mask, group=group[:3])
    with pytest.raises(ValueError, match="unknown advantage estimator 'gpro'.*grpo"):
        estimate_advantages("gpro", rewards, mask, group=group)
    with pytest.raises(ValueError, match="'rloo' got a parameter it does not take: .*keyword argument 'lam'"):
        estimate_advantages("rloo", rewards, mask, group=group, lam=0.9)


def test_params_come_from_the_config_attributes_the_registry_names():
    class Advantage:
        gamma, lam, group_eps, std_normalize = 0.9, 0.8, 1e-3, False

    assert estimator_params("gae", Advantage) == {"gamma": 0.9, "lam": 0.8}
    assert estimator_params("grpo", Advantage) == {"eps": 1e-3, "std_normalize": False}
    assert estimator_params("rloo", Advantage) == {}
    assert estimator_params("reinforce_pp", Advantage) == {"gamma": 0.9}


def test_a_registered_estimator_is_reachable_and_names_clash():
    @register_estimator("test_zero", needs_values=False, needs_group=False)
    def zero(token_rewards, mask, values, group):
        return torch.zeros_like(token_rewards), torch.zeros_like(token_rewards)

    try:
        rewards, mask, _ = batch()
        assert estimate_advantages("test_zero", rewards, mask)[0].abs().sum() == 0
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test_zero", needs_values=False, needs_group=False)(zero)
    finally:
        del ESTIMATORS["test_zero"]
