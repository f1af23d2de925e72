"""The tiny models the CLI trains and the one-process PPO-max run on them, built once per session (a
plugin of tests/conftest.py): tests/runtime/test_distributed_cli.py compares torchrun's ranks and
tests/ray_runtime/test_ray_runtime.py Ray's actors with that run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli_data import pair_rows, save_tiny_base, sft_rows, write_jsonl

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()


def train_args(models: dict, out: Path, *extra: str) -> list[str]:
    """`rlhf train` of PPO-max on `models` for 3 iterations (a critic pre-training one first)."""
    return [
        "train", "--preset", "ppo_max", "--policy", models["sft"], "--reward-model", models["rm"],
        "--prompts", models["prompts"], "--out", str(out), "--train.iterations", "3",
        "--rollout.batch_size", "6", "--rollout.max_new_tokens", "4", "--train.micro_batch_size", "2",
        "--train.minibatches", "2", "--critic.pretrain_iterations", "1", "--policy_optim.lr", "0.001",
        "--log.sinks", "jsonl", *extra,
    ]  # fmt: skip


def metric_rows(run: Path) -> list[dict]:
    """The records of `run/metrics.jsonl` but events, without the timings (which differ run to run)."""
    rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
        for r in rows
        if "event" not in r
    ]


@pytest.fixture(scope="session")
def cli_models(tmp_path_factory) -> dict[str, str]:
    """A tiny SFT policy and reward model trained by the CLI, and the prompts file."""
    from rlhf.cli import main

    root = tmp_path_factory.mktemp("cli_models")
    save_tiny_base(root / "base", WORDS)
    pairs = pair_rows(WORDS)
    sft, pairs_file = (
        write_jsonl(root / "sft.jsonl", sft_rows(WORDS)),
        write_jsonl(root / "pairs.jsonl", pairs),
    )
    short = ["--train.max_steps", "3", "--train.batch_size", "4", "--sinks", "jsonl"]
    assert (
        main(["sft", "--model", str(root / "base"), "--data", sft, "--out", str(root / "sft"), *short]) == 0
    )
    assert (
        main(["rm", "--model", str(root / "sft"), "--data", pairs_file, "--out", str(root / "rm"), *short])
        == 0
    )
    prompts = write_jsonl(root / "prompts.jsonl", [{"prompt": r["prompt"]} for r in pairs[:12]])
    return {"sft": str(root / "sft"), "rm": str(root / "rm"), "prompts": prompts}


@pytest.fixture(scope="session")
def one_process_run(cli_models, tmp_path_factory) -> Path:
    """`train_args`' run in this process (the reference every multi-process run must equal); read only."""
    from rlhf.cli import main

    out = tmp_path_factory.mktemp("one_process") / "run"
    assert main(train_args(cli_models, out)) == 0
    return out
