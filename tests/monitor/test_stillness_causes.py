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
         ["in all 3 iterations, rollout.truncated drop removed every response", "rollout.max_new_tokens 64",
          "Fix, in this order: raise --rollout.max_new_tokens (now 64)", "the learning rate is not the cause"],
         ["raise --policy_optim.lr"]),
        (GRPO, {"rollout/kept_fraction": 1.0, "dynamic_sampling/informative_fraction": 0.0, "group/zero_std_fraction": 1.0},
         ["dynamic sampling found no group", "--rollout.temperature (now 0.7)", "--rollout.samples_per_prompt (now 4)",
          "--rollout.max_new_tokens (now 64)", "reward"], ["raise --policy_optim.lr", "only then"]),
        (GRPO, {"rollout/kept_fraction": 1.0, "group/zero_std_fraction": 1.0},
         ["every group scored one reward", "--rollout.temperature (now 0.7)", "--rollout.max_new_tokens (now 64)",
          "only then the learning rate (policy_optim.lr 1e-06)"], ["most likely"]),
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


@pytest.mark.parametrize(
    ("informative", "said"),
    [([0.0, 0.25, 0.0], "in 2 of the 3 iterations, DAPO's dynamic sampling found no group"),
     ([0.0, 0.25, 0.5], "policy_optim.lr 1e-06 is too small")],
)  # fmt: skip
def test_a_cause_of_most_iterations_is_named_before_the_learning_rate(informative, said):
    check = StillPolicyCheck(1e-6, iterations=3, run=GRPO)
    out = [check.update(i, {**STILL, "rollout/kept_fraction": 1.0, "dynamic_sampling/informative_fraction": f})
           for i, f in enumerate(informative)]  # fmt: skip
    assert said in out[2] and "policy_optim.lr 1e-06" in out[2]


def test_the_settings_are_the_runs():
    config = load_config(
        RLConfig, preset="dapo", overrides={"rollout": {"temperature": 0.9, "max_new_tokens": 32}}
    )
    settings = RunSettings.of(config)
    assert (settings.temperature, settings.max_new_tokens, settings.critic_free) == (0.9, 32, True)
    assert RunSettings.of(load_config(RLConfig, preset="vanilla_ppo")).critic_free is False
    assert StillPolicyCheck.of(config, start=2).start == 2
