"""`rlhf train --env module:Class [--env.max_turns N]` in-process: a GRPO run on episodes, and a
broken environment stopped before any model loads with one message and exit code 2."""

from __future__ import annotations

import json

import pytest

from rlhf.cli import main
from tests.cli.test_cli import files  # noqa: F401 (the module's fixture of tiny files)
from tests.cli.test_cli_reward_fn import TINY_GRPO, sft  # noqa: F401 (its SFT model)


@pytest.mark.slow
def test_train_on_episodes_from_the_command_line(sft, files, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    args = ["train", "--policy", sft, "--prompts", files["prompts"], "--out", str(out)]
    args += ["--env", "tests.support.envs_testing:Echo", "--env.max_turns", "2", "--log.samples_to_log", "2"]
    assert main([*args, *TINY_GRPO]) == 0
    (record,) = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"iteration"' in line
    ]
    # a turn of at most 4 tokens and Echo's 3-token reply fit the budget (2 x 4): two turns each
    assert record["env/turns_mean"] == 2 and record["env/reward_mean"] > 0
    config = (out / "config.yaml").read_text()
    assert "tests.support.envs_testing:Echo" in config and "max_turns: 2" in config
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all("k l m" in s["response"] for s in samples)  # the transcripts


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            "tests.support.envs_testing:NoStep",
            "env.name 'tests.support.envs_testing:NoStep': class NoStep has no step",
        ),
        ("no_colon", "env.name is 'no_colon': name the module and the class"),
        ("tests.support.envs_testing:TwoArguments", "TwoArguments(row) cannot be called with one prompt row"),
    ],
)
def test_a_broken_environment_exits_2_before_any_model_loads(tmp_path, capsys, env, expected):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a b"}\n')
    args = [
        "train",
        "--policy",
        str(tmp_path / "no_model"),
        "--prompts",
        str(prompts),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main([*args, "--env", env, *TINY_GRPO]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhf train: ") and expected in err and "Fix:" in err and "Traceback" not in err


def test_env_with_asynchronous_rollouts_is_refused(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a b"}\n')
    args = ["train", "--policy", str(tmp_path / "m"), "--prompts", str(prompts), "--out", str(tmp_path / "r")]
    assert (
        main([*args, "--env", "tests.support.envs_testing:Echo", "--rollout.max_staleness", "1", *TINY_GRPO])
        == 2
    )
    assert "--rollout.max_staleness 0 with --env" in capsys.readouterr().err
