"""`rlhf train --dist.runtime ray` on a CPU Ray (verl tests its worker groups the same way): the loop
on the driver, each role a group of actors; the local run's numbers and files."""

from __future__ import annotations

import shutil
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


# the reward from a function on the driver, the critic from the policy: no reward model's actor
REWARD_FN_ONLY = ["--reward-fn", "tests.support.reward_fns_testing:length", "--model.critic_init", "policy"]


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


def test_colocated_actors_and_a_rollout_actor_give_the_local_runs_numbers_and_files_bit_for_bit(
    models, local_run, cluster, tmp_path, monkeypatch
):
    """One actor per role, colocated, and a rollout actor sampling with a copy of the policy: after
    each policy update the copy equals the policy group's bit for bit (a sha256 over every
    parameter's bytes); every metric of 3 iterations (critic pre-training included) and the exported
    policy and critic equal the local run's exactly (CPU, one thread each)."""
    from rlhf.ray_runtime.runtime import RayRuntime

    sync, checked = RayRuntime.sync_rollout, []

    def checked_sync(self):
        sync(self)
        trainer = self._first("policy", "weights_digest")
        checked.append((self.policy_version, trainer, self._call("rollout", "weights_digest")))

    monkeypatch.setattr(RayRuntime, "sync_rollout", checked_sync)
    out = tmp_path / "ray"
    assert main(train_args(models, out, *WITH_A_ROLLOUT_ACTOR)) == 0
    assert [version for version, *_ in checked] == [1, 2, 3]  # one sync per iteration's update
    assert all(rollout == [trainer] for _, trainer, rollout in checked)
    assert len({trainer for _, trainer, _ in checked}) == 3  # the weights changed at every update
    assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=0.0)
    for part in ("model.safetensors", "critic/model.safetensors", "critic/scalar_head.safetensors"):
        want, got = tensors(local_run / part), tensors(out / part)
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), part
    assert (out / "tokenizer.json").read_bytes() == (local_run / "tokenizer.json").read_bytes()


def test_asynchronous_two_actor_groups_a_dead_actor_and_a_resume_under_one_actor_each(
    models, cluster, tmp_path, monkeypatch, capsys
):
    """rollout.max_staleness 1 with a LoRA policy (its reference on the policy's own actors), the
    reward from a function (no reward model's actor), and policy and critic groups of two actors
    each (a gloo group per role group, each actor a share of the rows), a placement group per role. Each iteration after the first trains on a rollout the
    previous policy sampled during the previous update (staleness 1, recorded), corrected by
    decoupled PPO (its weights logged). The critic's actor killed in the fourth iteration's update
    ends the run (exit 1, no traceback) with a message naming the role group and the resume
    command. Resumed from the second iteration's checkpoint (which holds the rollout in flight),
    under one colocated actor per role, it gives the killed run's metrics of the iterations both ran
    to 1e-5 (the summed gradients of two actors differ from one's in float rounding only)."""
    from rlhf.ray_runtime.runtime import RayRuntime

    ahead = ["--rollout.max_staleness", "1", "--checkpoint.every", "1", "--checkpoint.keep", "4"]
    ahead += ["--model.lora.enabled", "true", "--train.iterations", "4"]
    two = ["--ray.placement", "separate", "--ray.policy.num_actors", "2", "--ray.critic.num_actors", "2"]
    calls, train = {"n": 0}, RayRuntime.train

    def killing(self, roles, minibatches):
        calls["n"] += 1
        if calls["n"] == 5:  # critic pre-training, iterations 0, 1 and 2, then iteration 3's update
            ray.kill(self.actors["critic"][0])
        return train(self, roles, minibatches)

    monkeypatch.setattr(RayRuntime, "train", killing)
    split = tmp_path / "split"
    args = train_args(models, split, *WITH_A_ROLLOUT_ACTOR, *ahead, *two, *REWARD_FN_ONLY)
    del args[args.index("--reward-model") : args.index("--reward-model") + 2]  # one actor fewer to start
    code = main(args)
    err = capsys.readouterr().err
    assert code == 1, err
    assert (
        "Ray role group 'critic'" in err and f"rlhf train --resume {split}" in err and "Traceback" not in err
    )
    killed = [r for r in metric_rows(split) if "iteration" in r]
    assert [r["iteration"] for r in killed] == [0, 1, 2]
    assert [r["async/staleness"] for r in killed] == [0, 1, 1]
    assert all(0 < r["async/is_weight_mean"] <= r["async/is_weight_max"] <= 2.0 for r in killed)
    assert killed[0]["async/is_weight_max"] == pytest.approx(
        1.0, abs=1e-4
    )  # no update yet: pi_prox = pi_behav
    checkpoints = split / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"iter_00000{i}" for i in (1, 2, 3)]
    for later in ("iter_000002", "iter_000003"):  # resume from the second iteration's checkpoint
        shutil.rmtree(checkpoints / later)
    monkeypatch.setattr(RayRuntime, "train", train)
    one = [f"--ray.{group}.num_actors=1" for group in ("policy", "critic")]
    assert main(["train", "--resume", str(split), "--ray.placement", "colocate", *one]) == 0
    resumed = [r for r in metric_rows(split) if "iteration" in r]
    assert [r["iteration"] for r in resumed] == [0, 1, 2, 3]
    assert [r["async/staleness"] for r in resumed] == [0, 1, 1, 1]
    assert_same_rows(killed, resumed[:3], tolerance=1e-5)


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
