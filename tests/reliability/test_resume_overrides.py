"""`rlhf train --resume DIR`: changes to the algorithm, models or data are refused with the keys
listed, and nothing of the run changes; the fix (drop them) resumes, and config.yaml records the
changes a resume may make."""

from __future__ import annotations

import pytest
import yaml

from tests.support.reliability_testing import (
    InProcess,
    assert_ok,
    assert_user_error,
    iterations,
    rlhf,
    train_args,
)

pytestmark = pytest.mark.slow  # every test here takes over 2 s (`make test-fast` leaves them out)


@pytest.fixture(scope="module")
def run(files, tmp_path_factory):
    from rlhf.cli import main

    out = tmp_path_factory.mktemp("resume") / "run"  # set up in-process: no interpreter start-up
    assert (
        main([str(a) for a in train_args(files, out, "--train.iterations", "2", "--checkpoint.every", "1")])
        == 0
    )
    return out


def snapshot(run) -> dict:
    return {name: (run / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}


def test_changes_to_the_algorithm_are_refused_with_every_key(run, files, capsys):
    before = snapshot(run)
    result = InProcess(capsys, "train", "--resume", run, "--kl.beta", "0.5", "--policy_optim.lr", "0.01",
                  "--model.critic_mode", "shared", "--reward-model", files["policy"])  # fmt: skip
    message = assert_user_error(
        result, "kl.beta", "policy_optim.lr", "model.critic_mode", "model.reward_model"
    )
    assert "train.iterations" in message  # what a resume may change
    assert "rlhf train: " in message and message.count("\n") == 1  # one message
    preset = InProcess(capsys, "train", "--resume", run, "--preset", "apa")
    assert_user_error(preset, "policy.loss ('ppo' -> 'apa')", "preset")
    assert snapshot(run) == before


def test_a_config_with_a_yaml_error_is_refused(run, tmp_path):  # a subprocess: the user's view
    bad = tmp_path / "bad.yaml"
    bad.write_text("kl:\n  beta: [0.1\n")
    before = snapshot(run)
    assert_user_error(rlhf("train", "--resume", run, "--config", bad), str(bad), "not valid YAML")
    assert snapshot(run) == before


def test_the_fix_resumes_and_config_yaml_tells_the_truth(run, tmp_path, capsys):
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    same_beta = str(recorded["kl"]["beta"])  # an override equal to the recorded value is no change
    assert_ok(InProcess(capsys, "train", "--resume", run, "--kl.beta", same_beta, "--train.iterations", "3"))
    assert iterations(run) == [0, 1, 2]
    now = yaml.safe_load((run / "config.yaml").read_text())
    assert now["train"]["iterations"] == 3
    assert {k: v for k, v in now.items() if k != "train"} == {
        k: v for k, v in recorded.items() if k != "train"
    }


def test_every_resumable_key_may_change_and_no_other(run):
    from rlhf.config import ConfigError
    from rlhf.rundir.resume import RESUMABLE_KEYS, resume_config

    allowed = {"train": {"iterations": 9}, "checkpoint": {"every": 3, "keep": 4},
               "log": {"every": 2, "sinks": ["jsonl", "console"], "eval_every": 5, "samples_to_log": 1,
                       "mismatch": {"every": 3}},  # a monitor
               "runtime": {"overlap_critic": False, "split_forwards": False, "keep_freed_memory": False,
                           "pack_weights": False},
               # where the roles run: local or Ray, any ray.* key (the same numbers either way)
               "dist": {"runtime": "ray"}, "ray": {"placement": "separate", "policy": {"num_actors": 2}}}  # fmt: skip
    # reward.remote.* (where the reward server runs and how it is asked) applies only to a run scored
    # by --reward-url; this run has a reward model, so setting one is refused as doing nothing
    config = resume_config(run, overrides=allowed)
    assert (config.train.iterations, config.checkpoint.keep, config.log.sinks) == (9, 4, ["jsonl", "console"])
    assert config.runtime.overlap_critic is False and config.runtime.pack_weights is False
    assert (config.dist.runtime, config.ray.placement, config.ray.policy.num_actors) == ("ray", "separate", 2)
    assert config.log.mismatch.every == 3
    assert len(RESUMABLE_KEYS) == 15
    refusals = ({"seed": 5}, {"train": {"ppo_epochs": 3}}, {"log": {"collapse": {"window": 9}}},
                {"dist": {"strategy": "fsdp2"}}, {"rollout": {"max_staleness": 1}})  # fmt: skip
    for refused in refusals:
        with pytest.raises(ConfigError, match="were changed"):
            resume_config(run, overrides=refused)
