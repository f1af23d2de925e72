"""`rlhf train --agent module:function` in-process: a GRPO run on the agent's episodes, an agent
whose episodes all fail stopped with exit 2 naming it, and a broken name or a combination the
run cannot do refused before any model loads."""

from __future__ import annotations

import json

import pytest

from rlhf.cli import main
from tests.cli.test_cli import files  # noqa: F401 (the module's fixture of tiny files)
from tests.cli.test_cli_reward_fn import TINY_GRPO, sft  # noqa: F401 (its SFT model)

AGENTS = "tests.support.agents_testing:"


@pytest.mark.slow
def test_train_on_agent_episodes_from_the_command_line(sft, files, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    args = ["train", "--policy", sft, "--prompts", files["prompts"], "--out", str(out)]
    assert main([*args, "--agent", AGENTS + "chat_agent", "--agent.concurrency", "4", *TINY_GRPO]) == 0
    (record,) = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"iteration"' in line
    ]
    assert record["agent/turns_mean"] == 2 and record["agent/failed_fraction"] == 0
    assert "concurrency: 4" in (out / "config.yaml").read_text()
    failing = ["train", "--policy", sft, "--prompts", files["prompts"], "--out", str(tmp_path / "fails")]
    assert main([*failing, "--agent", AGENTS + "raising_agent", *TINY_GRPO]) == 2
    err = capsys.readouterr().err
    assert f"agent.name {AGENTS}raising_agent: 6 of 6 episodes failed" in err
    assert "raised RuntimeError: the tool crashed" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--agent", "no_colon"], "agent.name is 'no_colon': name the module and the function"),
        (["--agent", AGENTS + "not_called_with_three"], "cannot be called as not_called_with_three(row, base_url"),
        (["--agent", AGENTS + "chat_agent", "--env", "tests.support.envs_testing:Echo"], "pass one of --env and --agent"),
        (["--agent", AGENTS + "chat_agent", "--rollout.max_staleness", "1"], "--rollout.max_staleness 0 with --agent"),
        (["--agent", AGENTS + "chat_agent", "--agent.failure_reward", "nan"], "agent.failure_reward must be a finite"),
    ],
)  # fmt: skip
def test_a_broken_agent_exits_2_before_any_model_loads(tmp_path, capsys, extra, expected):
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
    assert main([*args, *extra, *TINY_GRPO]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhf train: ") and expected in err and "Fix:" in err and "Traceback" not in err
