"""The registration example of docs/internals.md ("The loss and estimator registries") runs as written:
its loss and estimator give their formulas (float64 loops), its loss reads policy.clip_eps through its
`settings` function, and a policy setting it does not read is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from rlhf.config import ConfigError, RLConfig, load_config
from rlhf.core import (
    ESTIMATORS,
    POLICY_LOSSES,
    estimate_advantages,
    estimator_params,
    policy_loss,
    policy_loss_params,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "internals.md"


@pytest.fixture
def registered():
    section = DOC.read_text().split("### The loss and estimator registries", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the registration example is gone from docs/internals.md"
    exec(compile(block.group(1), str(DOC), "exec"), {})
    yield
    POLICY_LOSSES.pop("tis_pg")
    ESTIMATORS.pop("batch_mean")


def test_the_documented_registrations_work(registered):
    config = load_config(RLConfig, overrides={"policy": {"loss": "tis_pg", "clip_eps": 0.1}})
    params = policy_loss_params("tis_pg", config.policy)
    assert params == {"cap": pytest.approx(1.1)}
    logp = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 7.0, 7.0]], dtype=torch.float64)
    old_logp = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0, 5.0], [3.0, 5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    loss, _ = policy_loss("tis_pg", logp, old_logp, None, adv, mask, **params)
    valid = [(0, 0), (0, 1), (1, 0)]
    expected = sum(
        -min(float((logp[i, j] - old_logp[i, j]).exp()), 1.1) * adv[i, j] * logp[i, j] for i, j in valid
    ) / len(valid)
    assert loss.item() == pytest.approx(float(expected), rel=1e-12)

    config = load_config(RLConfig, overrides={"advantage": {"estimator": "batch_mean"}})
    assert estimator_params("batch_mean", config.advantage) == {}
    advantages, returns = estimate_advantages("batch_mean", adv, mask)
    scores = [adv[0, 0] + adv[0, 1], adv[1, 0]]
    mean = sum(scores) / 2
    expected_adv = torch.tensor(
        [[scores[0] - mean] * 2 + [0.0], [scores[1] - mean, 0.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(advantages, expected_adv)
    torch.testing.assert_close(returns, expected_adv)

    with pytest.raises(
        ConfigError, match=r"policy.apa_lam applies only when policy.loss is one that reads it \(apa\)"
    ):
        load_config(RLConfig, overrides={"policy": {"loss": "tis_pg", "apa_lam": 0.3}})
