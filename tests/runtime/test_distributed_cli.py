"""`torchrun --nproc-per-node 2 -m rlhf train ...` on tiny models: the one-process run's metrics,
written once; a rank that dies ends the job with a message naming it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlhf.cli import main
from tests.support.cli_runs import metric_rows, train_args

pytestmark = pytest.mark.slow  # every test here takes over 2 s (`make test-fast` leaves them out)

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # seconds for a whole torchrun job


@pytest.fixture(scope="module")
def models(cli_models) -> dict[str, str]:
    """The tiny SFT policy and reward model trained by the CLI, and the prompts file (once a session)."""
    return cli_models


def torchrun(args: list[str], **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.Popen(
        [*command, "-m", "rlhf", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_torchrun_two_ranks_give_the_one_process_metrics(strategy, models, one_process_run, tmp_path):
    job = torchrun(train_args(models, tmp_path / "two", "--dist.strategy", strategy))
    out, err = job.communicate(timeout=TIMEOUT)
    assert job.returncode == 0, err[-3000:]
    one, two = metric_rows(one_process_run), metric_rows(tmp_path / "two")
    assert [r.get("iteration", r.get("pretrain")) for r in two] == [0, 0, 1, 2]  # each record once
    for expected, got in zip(one, two):
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-5, rel=1e-5), key
    assert out.count("RL run finished") == 1  # rank 0 alone prints the summary
    assert (tmp_path / "two" / "model.safetensors").is_file()  # and exports
    if strategy == "fsdp2":  # the export is gathered whole; the checkpoint holds each rank's shards
        from safetensors.torch import load_file

        exported, reference = (
            load_file(str(run / "model.safetensors")) for run in (tmp_path / "two", one_process_run)
        )
        assert exported.keys() == reference.keys()
        for name, tensor in reference.items():
            torch.testing.assert_close(exported[name], tensor, atol=1e-5, rtol=0, msg=name)
        shards = tmp_path / "two" / "checkpoints" / "iter_000003" / "shards"
        assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_a_sharded_run_loads_on_rank_0_and_resumes_there(models, one_process_run, tmp_path):
    """fsdp2 under torchrun: rank 1 builds its models on the meta device and receives its shards
    from rank 0, which alone reads the weights and, on --resume, the checkpoint's shards (DCP): the
    resumed 2-rank run gives the uninterrupted one-process run's metrics."""
    first = train_args(models, tmp_path / "two", "--dist.strategy", "fsdp2")
    first[first.index("--train.iterations") + 1] = "1"
    job = torchrun(first)
    assert job.communicate(timeout=TIMEOUT)[0] is not None and job.returncode == 0
    job = torchrun(["train", "--resume", str(tmp_path / "two"), "--train.iterations", "3"])
    out, err = job.communicate(timeout=TIMEOUT)
    assert job.returncode == 0, err[-3000:]
    one, two = metric_rows(one_process_run), metric_rows(tmp_path / "two")
    assert [r.get("iteration", r.get("pretrain")) for r in two] == [0, 0, 1, 2]
    for expected, got in zip(one, two):
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-5, rel=1e-5), key


# one critic-free preset per strategy: the CLI's path (no critic to shard or save, the checkpoint's
# files) depends on the strategy, not on the estimator (reinforce_pp's, against a plain loop in tests/core)
CRITIC_FREE = {"grpo": "ddp", "rloo": "fsdp2"}


@pytest.mark.slow
@pytest.mark.parametrize("preset", CRITIC_FREE)
def test_critic_free_presets_run_under_torchrun_and_save_their_checkpoints(preset, models, tmp_path):
    """The policy is the only learner: no critic to broadcast, shard or write into the checkpoint."""
    args = train_args(models, tmp_path / "two", "--dist.strategy", CRITIC_FREE[preset])
    args[args.index("ppo_max")] = preset
    at = args.index("--critic.pretrain_iterations")  # critic settings are errors without a critic
    del args[at : at + 2]
    args += ["--rollout.batch_size", "8", "--rollout.samples_per_prompt", "4", "--checkpoint.every", "1"]
    job = torchrun(args)
    out, err = job.communicate(timeout=TIMEOUT)
    assert job.returncode == 0, err[-3000:]
    rows = metric_rows(tmp_path / "two")
    assert [r["iteration"] for r in rows] == [0, 1, 2] and not any("value/loss" in r for r in rows)
    assert (tmp_path / "two" / "model.safetensors").is_file() and not (tmp_path / "two" / "critic").exists()
    assert (tmp_path / "two" / "checkpoints" / "iter_000003" / "DONE").is_file()


def test_a_killed_rank_ends_the_job_naming_the_rank(models, tmp_path):
    job = torchrun(
        train_args(models, tmp_path / "run", "--dist.strategy", "ddp", "--dist.timeout", "30",
                   "--train.iterations", "1000", "--critic.pretrain_iterations", "0"),
        start_new_session=True,
    )  # fmt: skip
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + TIMEOUT
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
            assert job.poll() is None and time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.5)
        victim = rank_pid(job.pid, rank=1)
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=120)  # well within the 30 s collective timeout + teardown
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # our own torchrun and its ranks only
    assert job.returncode != 0
    assert "rank      : 1" in err, err[-3000:]  # torchrun's "Root Cause" names the killed rank
    assert "This is a bug" not in err  # a survivor that saw the loss says so, not "internal error"


def rank_pid(torchrun_pid: int, rank: int) -> int:
    """The pid of the worker process of `rank` started by the torchrun process `torchrun_pid`."""
    children = Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no worker of rank {rank} among {children}")


def test_a_resume_rank_0_refuses_stops_every_rank_with_its_message(models, tmp_path):
    """The reward model changed since the run started: rank 0 checks the recorded hashes on --resume
    and refuses; rank 1 stops with the same message at once instead of waiting for rank 0 at its
    first collective (dist.timeout) or running on alone."""
    reward_model = tmp_path / "rm"
    shutil.copytree(models["rm"], reward_model)
    first = train_args(
        {**models, "rm": str(reward_model)},
        tmp_path / "run",
        "--dist.strategy",
        "ddp",
        "--dist.timeout",
        "600",
    )
    first[first.index("--train.iterations") + 1] = "1"
    assert main(first) == 0
    (reward_model / "config.json").write_text((reward_model / "config.json").read_text() + "\n")
    started = time.monotonic()
    job = torchrun(["train", "--resume", str(tmp_path / "run"), "--train.iterations", "2"])
    _, err = job.communicate(timeout=TIMEOUT)
    assert job.returncode != 0
    assert time.monotonic() - started < 300  # not the 600 s collective timeout: no rank waited for it
    for rank in ("rank 0 of 2", "rank 1 of 2"):
        line = next((x for x in err.splitlines() if x.startswith(f"rlhf train ({rank}): ")), None)
        assert line is not None and "config.json" in line and "--resume-allow-changed-models" in line, err[
            -3000:
        ]
    assert "lost contact" not in err and "This is a bug" not in err, err[-3000:]
