"""The still-policy warning (rlhf/monitor/stillness.py) names what left a step nothing to learn from
before it blames the learning rate: `rollout.truncated drop` removing every response, DAPO's dynamic
sampling finding no group with two rewards, every group at one reward under a critic-free estimator;
the learning rate alone only when the rows carried a signal."""

from __future__ import annotations

import pytest

from rlhf.config import RLConfig, load_config
from rlhf.monitor.stillness import RunSettings, StillPolicyCheck

STILL = {"policy/ratio_mean": 1.0, "policy/approx_kl": 0.0, "kl/k3": 0.0}
GRPO = RunSettings(
    temperature=0.7, max_new_tokens=64, samples_per_prompt=4, truncated="drop", critic_free=True
)


def warning(settings: RunSettings, **logged: float) -> str:
    check = StillPolicyCheck(1e-6, iterations=3, run=settings)
    said = [check.update(i, {**STILL, **logged}) for i in range(3)]
    assert said[:2] == [None, None] and said[2] is not None
    return said[2]


@pytest.mark.parametrize(
    ("settings", "logged", "named", "not_named"),
    [
        (GRPO, {"rollout/kept_fraction": 0.0, "group/zero_std_fraction": 1.0},
         ["rollout.truncated drop removed every response", "rollout.max_new_tokens 64", "Fix: raise --rollout.max_new_tokens"],
         ["raise --policy_optim.lr"]),
        (GRPO, {"rollout/kept_fraction": 1.0, "dynamic_sampling/informative_fraction": 0.0, "group/zero_std_fraction": 1.0},
         ["dynamic sampling found no group", "--rollout.temperature 0.7", "--rollout.samples_per_prompt 4",
          "rollout.max_new_tokens from 64", "reward"], ["raise --policy_optim.lr"]),
        (GRPO, {"rollout/kept_fraction": 1.0, "group/zero_std_fraction": 1.0},
         ["every group scored one reward", "--rollout.temperature 0.7", "rollout.max_new_tokens from 64",
          "policy_optim.lr 1e-06"], ["most likely"]),
        (GRPO, {"rollout/kept_fraction": 1.0, "group/zero_std_fraction": 0.5},
         ["policy_optim.lr 1e-06 is too small", "raise --policy_optim.lr"], ["temperature"]),
        (RunSettings(critic_free=False), {"rollout/kept_fraction": 1.0, "group/zero_std_fraction": 1.0},
         ["policy_optim.lr 1e-06 is too small"], ["temperature"]),  # a critic's advantages need no group signal
    ],
    ids=["truncated-drop", "dynamic-sampling", "critic-free-one-reward", "signal-left", "with-a-critic"],
)  # fmt: skip
def test_the_warning_names_what_removed_the_signal(settings, logged, named, not_named):
    message = warning(settings, **logged)
    assert message.startswith("the policy has not moved in 3 iterations")
    assert all(word in message for word in named), message
    assert not any(word in message for word in not_named), message


def test_one_iteration_with_a_signal_keeps_the_learning_rate_in_the_message():
    check = StillPolicyCheck(1e-6, iterations=3, run=GRPO)
    kept = [0.0, 1.0, 0.0]  # one of the three kept its rows: the drop is not the whole story
    said = [check.update(i, {**STILL, "rollout/kept_fraction": k, "group/zero_std_fraction": 0.5})
            for i, k in enumerate(kept)]  # fmt: skip
    assert "raise --policy_optim.lr" in said[2]


def test_the_settings_are_the_runs():
    config = load_config(
        RLConfig, preset="dapo", overrides={"rollout": {"temperature": 0.9, "max_new_tokens": 32}}
    )
    settings = RunSettings.of(config)
    assert (settings.temperature, settings.max_new_tokens, settings.critic_free) == (0.9, 32, True)
    assert RunSettings.of(load_config(RLConfig, preset="vanilla_ppo")).critic_free is False
    assert StillPolicyCheck.of(config, start=2).start == 2
