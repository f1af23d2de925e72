"""Each registered loss reads its keyword parameters from the typed config group with its `settings`
function; `policy_loss_params` calls it on any object with those attributes (rlhf.core knows no
config class)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhf.core import POLICY_LOSSES, policy_loss, policy_loss_params, register_policy_loss

# Every attribute a built-in loss may read, each with a value no other attribute has, so a loss that
# read the wrong attribute would get a wrong value.
SOURCE = SimpleNamespace(
    clip_eps=0.11,
    clip_eps_high=0.27,
    dual_clip=3.3,
    ratio_against="ref",
    apa_lam=0.44,
    awr_lam=5.5,
    awr_max_weight=66.0,
    cispo_clip_eps_low=0.66,
)


def test_each_built_in_loss_reads_its_own_settings():
    assert policy_loss_params("ppo", SOURCE) == {
        "clip_eps": 0.11,
        "clip_eps_high": 0.27,
        "dual_clip": 3.3,
        "ratio_against": "ref",
    }
    assert policy_loss_params("apa", SOURCE) == {"lam": 0.44}
    assert policy_loss_params("awr", SOURCE) == {"lam": 5.5, "max_weight": 66.0}
    assert policy_loss_params("gspo", SOURCE) == {"clip_eps": 0.11, "clip_eps_high": 0.27}
    assert policy_loss_params("cispo", SOURCE) == {"clip_eps_high": 0.27, "clip_eps": 0.66}
    assert policy_loss_params("online_dpo", SOURCE) == {}


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_takes_the_parameters_its_settings_give(name):
    gen = torch.Generator().manual_seed(0)
    logp, old_logp, ref_logp, adv = (torch.randn(2, 3, generator=gen, dtype=torch.float64) for _ in range(4))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    loss, _ = policy_loss(name, logp, old_logp, ref_logp, adv, mask, **policy_loss_params(name, SOURCE))
    assert loss.isfinite()


def test_the_parameters_reach_the_loss():
    gen = torch.Generator().manual_seed(0)
    logp, ref_logp, adv = (torch.randn(2, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    loss, _ = policy_loss("apa", logp, None, ref_logp, adv, mask, **policy_loss_params("apa", SOURCE))
    valid = [(0, 0), (0, 1), (1, 0)]
    expected = sum((logp[i, j] - ref_logp[i, j] - adv[i, j] / 0.44) ** 2 for i, j in valid) / len(valid)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)


def test_a_registered_loss_reads_its_settings_and_errors_name_the_fix():
    @register_policy_loss("test_scaled", settings=lambda c: {"scale": c.test_scale})  # type: ignore[attr-defined]
    def scaled(logp, old_logp, ref_logp, advantages, mask, *, scale: float = 1.0, other: float = 0.0):  # type: ignore[no-untyped-def]
        return -(scale * advantages * logp * mask).sum(), {}

    try:
        assert policy_loss_params("test_scaled", SimpleNamespace(test_scale=2.0)) == {"scale": 2.0}
        with pytest.raises(AttributeError, match="test_scale"):
            policy_loss_params("test_scaled", SimpleNamespace(scale=2.0))
        with pytest.raises(ValueError, match="already registered; pass replace=True"):
            register_policy_loss("test_scaled", settings=lambda c: {"lam": c.apa_lam})(scaled)
        register_policy_loss("test_scaled", settings=lambda c: {"lam": c.apa_lam}, replace=True)(scaled)
        one = torch.ones(1, 1)
        with pytest.raises(
            ValueError,
            match="policy loss 'test_scaled' got a parameter it does not take: .*keyword argument 'lam'",
        ):
            policy_loss("test_scaled", one, None, None, one, one, **policy_loss_params("test_scaled", SOURCE))
    finally:
        POLICY_LOSSES.pop("test_scaled")
    with pytest.raises(
        ValueError, match="unknown policy loss 'grpo': choose one of apa, awr, cispo, gspo, online_dpo, ppo"
    ):
        policy_loss_params("grpo", SOURCE)


def test_a_loss_without_settings_gets_no_parameters():
    @register_policy_loss("test_plain")
    def plain(logp, old_logp, ref_logp, advantages, mask):  # type: ignore[no-untyped-def]
        return logp.sum(), {}

    try:
        assert policy_loss_params("test_plain", SOURCE) == {}
    finally:
        POLICY_LOSSES.pop("test_plain")
