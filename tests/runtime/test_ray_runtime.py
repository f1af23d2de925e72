"""`rlhf train --dist.runtime ray` on a CPU Ray (verl tests its worker groups the same way): the loop
on the driver, each role a group of actors; the local run's numbers and files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhf.cli import main
from tests.runtime import test_distributed_cli as dist_cli
from tests.runtime.test_distributed_cli import metric_rows, train_args

pytestmark = pytest.mark.slow  # a Ray cluster and its actors take seconds to start

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[dev]' installs it)")

# every role's actors take half a CPU: the four groups fit the test cluster's CPUs
models = dist_cli.models  # the tiny SFT policy, reward model and prompts (a module fixture)

HALF_A_CPU = [f"--ray.{group}.num_cpus=0.5" for group in ("policy", "critic", "reference", "reward_model")]

# and a rollout actor (ray.rollout), on half a CPU too
WITH_A_ROLLOUT_ACTOR = [
    "--dist.runtime",
    "ray",
    *HALF_A_CPU,
    "--ray.rollout.num_actors=1",
    "--ray.rollout.num_cpus=0.5",
]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module (the runtime joins it rather than starting its own)."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def local_run(models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local") / "run"
    assert main(train_args(models, out)) == 0
    return out


def assert_same_rows(expected: list[dict], got: list[dict], tolerance: float) -> None:
    assert len(expected) == len(got)
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key, value in want.items():
            assert have[key] == pytest.approx(value, abs=tolerance, rel=tolerance), key


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def test_colocated_actors_give_the_local_runs_numbers_and_files_bit_for_bit(
    models, local_run, cluster, tmp_path
):
    """One actor per role, colocated: every metric of 3 iterations (critic pre-training included)
    and the exported policy and critic equal the local run's exactly (CPU, one thread each)."""
    out = tmp_path / "ray"
    assert main(train_args(models, out, "--dist.runtime", "ray", *HALF_A_CPU)) == 0
    assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=0.0)
    for part in ("model.safetensors", "critic/model.safetensors", "critic/scalar_head.safetensors"):
        want, got = tensors(local_run / part), tensors(out / part)
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), part
    assert (out / "tokenizer.json").read_bytes() == (local_run / "tokenizer.json").read_bytes()


def test_two_actor_groups_run_data_parallel_inside_and_give_one_processs_numbers(
    models, local_run, cluster, tmp_path
):
    """Policy and critic groups of two actors each (a gloo group per role group, each actor a
    share of the rows), placed in a placement group per role: the one-process metrics to 1e-5
    (the summed gradients differ from one process's in float rounding only)."""
    out = tmp_path / "ray2"
    args = ["--dist.runtime", "ray", "--ray.placement", "separate", *HALF_A_CPU]
    args += [
        "--ray.policy.num_actors",
        "2",
        "--ray.critic.num_actors",
        "2",
        "--ray.reference.num_cpus",
        "0.25",
    ]
    args += ["--ray.reward_model.num_cpus", "0.25"]
    assert main(train_args(models, out, *args)) == 0
    assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=1e-5)


def test_a_rollout_group_samples_with_the_trainers_weights_synced_after_every_update(
    models, local_run, cluster, tmp_path, monkeypatch
):
    """A rollout group of its own (`ray.rollout.num_actors 1`): after each policy update the rollout
    actor's policy equals the policy group's bit for bit (a sha256 over every parameter's bytes),
    and the run's metrics equal the local run's exactly."""
    from rlhf.ray_runtime.runtime import RayRuntime

    sync, checked = RayRuntime.sync_rollout, []

    def checked_sync(self):
        sync(self)
        trainer = self._first("policy", "weights_digest")
        checked.append((self.policy_version, trainer, self._call("rollout", "weights_digest")))

    monkeypatch.setattr(RayRuntime, "sync_rollout", checked_sync)
    out = tmp_path / "rollout"
    assert main(train_args(models, out, *WITH_A_ROLLOUT_ACTOR)) == 0
    assert [version for version, *_ in checked] == [1, 2, 3]  # one sync per iteration's update
    assert all(rollout == [trainer] for _, trainer, rollout in checked)
    assert len({trainer for _, trainer, _ in checked}) == 3  # the weights changed at every update
    assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=0.0)


def test_asynchronous_rollouts_stay_one_update_behind_and_resume_with_the_rollout_in_flight(
    models, cluster, tmp_path, monkeypatch, capsys
):
    """rollout.max_staleness 1: each iteration after the first trains on a rollout the previous
    policy sampled during the previous update (staleness 1, recorded), corrected by decoupled PPO
    (its weights logged); a run interrupted after a checkpoint, whose next rollout was in flight,
    resumes to the uninterrupted run's metrics exactly (the rollout is kept in the checkpoint)."""
    from rlhf.ray_runtime.runtime import RayRuntime

    ahead = [*WITH_A_ROLLOUT_ACTOR, "--rollout.max_staleness", "1", "--checkpoint.every", "1"]
    whole = tmp_path / "whole"
    assert main(train_args(models, whole, *ahead)) == 0
    rows = [r for r in metric_rows(whole) if "iteration" in r]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert all(0 < r["async/is_weight_mean"] <= r["async/is_weight_max"] <= 2.0 for r in rows)
    assert rows[0]["async/is_weight_max"] == pytest.approx(1.0, abs=1e-4)  # no update yet: pi_prox = pi_behav

    calls, train = {"n": 0}, RayRuntime.train

    def interrupting(self, roles, minibatches):
        calls["n"] += 1
        if calls["n"] == 3:  # pre-training, iteration 0, then iteration 1's update: stop there
            raise KeyboardInterrupt
        return train(self, roles, minibatches)

    monkeypatch.setattr(RayRuntime, "train", interrupting)
    split = tmp_path / "split"
    assert main(train_args(models, split, *ahead)) == 130, capsys.readouterr().err
    monkeypatch.setattr(RayRuntime, "train", train)
    assert main(["train", "--resume", str(split)]) == 0
    assert_same_rows(metric_rows(whole), metric_rows(split), tolerance=0.0)


def test_asking_for_more_cpus_than_the_cluster_has_stops_before_loading_naming_the_keys(
    models, cluster, tmp_path, capsys
):
    out = tmp_path / "big"
    code = main(train_args(models, out, "--dist.runtime", "ray", "--ray.policy.num_cpus", "16"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "ask for" in err and "the cluster has 4" in err and "Fix:" in err and "Traceback" not in err
    assert not ray.util.placement_group_table() or all(
        p["state"] == "REMOVED" for p in ray.util.placement_group_table().values()
    )


def test_an_actor_that_dies_ends_the_run_naming_it_and_the_run_resumes_under_ray(
    models,
    local_run,
    cluster,
    tmp_path,
    monkeypatch,
    capsys,
):
    """The critic's actor killed before the second iteration's update: the run ends (exit 1, no
    traceback) with a message naming the role group and the resume command. The resumed Ray run
    (each learner group loading its weights and optimizer state from the checkpoint the groups
    wrote) gives the uninterrupted local run's metrics exactly."""
    from rlhf.ray_runtime.runtime import RayRuntime

    calls = {"n": 0}
    train = RayRuntime.train

    def killing(self, roles, minibatches):
        calls["n"] += 1
        if calls["n"] == 3:  # critic pre-training, the first iteration, then the second's update
            ray.kill(self.actors["critic"][0])
        return train(self, roles, minibatches)

    monkeypatch.setattr(RayRuntime, "train", killing)
    out = tmp_path / "dies"
    code = main(train_args(models, out, "--dist.runtime", "ray", "--checkpoint.every", "1", *HALF_A_CPU))
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Ray role group 'critic'" in err and f"rlhf train --resume {out}" in err and "Traceback" not in err
    assert (out / "checkpoints" / "iter_000001" / "DONE").is_file()
    monkeypatch.setattr(RayRuntime, "train", train)
    assert main(["train", "--resume", str(out)]) == 0
    assert [r.get("iteration", r.get("pretrain")) for r in metric_rows(out)] == [0, 0, 1, 2]
    assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=0.0)
