"""`rlhf train --dist.runtime ray` on a CPU Ray (verl tests its worker groups the same way): the loop
on the driver, each role a group of actors; the local run's numbers and files."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rlhf.cli import main
from tests.runtime import test_distributed_cli as dist_cli
from tests.support.cli_runs import metric_rows, train_args

pytestmark = pytest.mark.slow  # a Ray cluster and its actors take seconds to start

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[dev]' installs it)")

# every role's actors take half a CPU: the four groups fit the test cluster's CPUs
models = dist_cli.models  # the tiny SFT policy, reward model and prompts (built once a session)

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
REWARD_FN_ONLY = ["--reward-fn", "tests.support.reward_fns_testing:letters", "--model.critic_init", "policy"]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module (the runtime joins it rather than starting its own)."""
    # Ray's memory monitor off: on a shared machine it kills the actors when others fill the memory.
    # Actors at the test's own priority: Ray starts its workers at niceness 15 by default, and on a
    # busy machine (the other pytest worker, other jobs) such actors get a few percent of a core
    # while the driver waits on them.
    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False,
        _system_config={"memory_monitor_refresh_ms": 0, "worker_niceness": 0},
    )  # fmt: skip
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def local_run(one_process_run) -> Path:
    """`train_args`' run in this process (torchrun's ranks are held to it too: built once a session)."""
    return one_process_run


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


FSDP2_GROUPS = ["--dist.strategy", "fsdp2", "--ray.placement", "separate"]
FSDP2_GROUPS += ["--ray.policy.num_actors", "2", "--ray.critic.num_actors", "2", "--checkpoint.every", "1"]
FSDP2_GROUPS += ["--checkpoint.keep", "3"]


def assert_same_export(want: Path, got: Path, tolerance: float) -> None:
    for part in ("model.safetensors", "critic/model.safetensors", "critic/scalar_head.safetensors"):
        a, b = tensors(want / part), tensors(got / part)
        assert a.keys() == b.keys(), part
        assert all(torch.allclose(a[k], b[k], rtol=0, atol=tolerance) for k in a), part


def test_fsdp2_groups_of_two_actors_shard_give_the_local_runs_numbers_export_and_resume(
    models, local_run, cluster, tmp_path, monkeypatch
):
    """`dist.strategy fsdp2` with policy, critic and reference groups of two actors each and two
    rollout actors (whole copies of the policy): every actor holds half of its learner's parameter
    bytes (its rows: the two add up to the whole); after each update both rollout copies equal the
    policy gathered from its shards bit for bit (sha256 of every parameter's bytes); every metric of
    the 3 iterations (critic pre-training included) and the exported policy and critic equal the
    local run's to 1e-5 (the two actors' reduce-scattered gradient sums differ from one process's
    in float rounding only). Resumed from the first iteration's checkpoint (each group's DCP shards),
    the policy again on two actors and the critic on one (which reads both actors' shards whole),
    and then in one process (`dist.runtime local`), the run continues with the same metrics and
    export."""
    from rlhf.ray_runtime.runtime import RayRuntime

    train, sync, held, synced = RayRuntime.train, RayRuntime.sync_rollout, {}, []

    def measuring(self, roles, minibatches):
        result = train(self, roles, minibatches)
        held.update({group: self._call(group, "parameter_bytes") for group in ("policy", "critic")})
        return result

    def checked_sync(self):  # every policy actor gathers the whole policy; rank 0's is sent
        sync(self)
        synced.append((self._call("policy", "weights_digest"), self._call("rollout", "weights_digest")))

    monkeypatch.setattr(RayRuntime, "train", measuring)
    monkeypatch.setattr(RayRuntime, "sync_rollout", checked_sync)
    out = tmp_path / "fsdp2"
    args = [*WITH_A_ROLLOUT_ACTOR, *FSDP2_GROUPS, "--ray.reference.num_actors", "2"]
    args += ["--ray.rollout.num_actors=2", "--ray.rollout.num_cpus=0.25"]  # whole copies (ddp)
    assert main(train_args(models, out, *args)) == 0
    assert len(synced) == 3 and all(trainer == rollout == [trainer[0]] * 2 for trainer, rollout in synced)
    assert len({trainer[0] for trainer, _ in synced}) == 3  # the weights changed at every update
    for group, actors in held.items():
        whole = actors[0][1]
        assert sum(local for local, _ in actors) == whole, group
        assert all(0.4 * whole < local < 0.6 * whole for local, _ in actors), (group, actors)
    assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=1e-5)
    assert_same_export(local_run, out, tolerance=1e-5)
    checkpoints = out / "checkpoints"
    assert (checkpoints / "iter_000001" / "groups" / "policy" / "shards" / ".metadata").is_file()
    assert not (checkpoints / "iter_000001" / "model.trained.safetensors").exists()
    for resume in (["--ray.critic.num_actors", "1"], ["--dist.runtime", "local"]):
        for later in ("iter_000002", "iter_000003"):
            shutil.rmtree(checkpoints / later)
        assert main(["train", "--resume", str(out), *resume]) == 0
        assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=1e-5)
        assert_same_export(local_run, out, tolerance=1e-5)


def planted_rng_states(seed: int, count: int) -> list[dict]:
    """`count` global random states of their own (Python's, NumPy's, torch's), this process's kept."""
    from rlhf.rundir.checkpoint import rng_state, set_rng_state

    mine, states = rng_state(), []
    for k in range(count):
        random.seed(seed + k)
        np.random.seed(seed + k)
        torch.manual_seed(seed + k)
        states.append(rng_state())
    set_rng_state(mine)
    return states


def same_rng_state(a: dict, b: dict) -> bool:
    return (
        a["python"] == b["python"]
        and torch.equal(a["numpy"][1], b["numpy"][1])
        and torch.equal(a["torch"], b["torch"])
    )


def test_two_updates_ahead_two_actor_groups_a_dead_actor_and_a_resume_under_one_actor_each(
    models, cluster, tmp_path, monkeypatch, capsys
):
    """rollout.max_staleness 2 with a LoRA policy (its reference on the policy's own actors), the
    reward from a function (no reward model's actor), and policy and critic groups of two actors
    each (a gloo group per role group, each actor a share of the rows), a placement group per role.
    Iteration 0 samples now; during its update the rollouts of iterations 1 and 2 are sampled by
    policy version 0, during iteration 1's that of iteration 3 by version 1: staleness 0, 1, 2, 2
    (recorded, never above 2), corrected by decoupled PPO (its weights logged). The critic's actor
    killed in the fourth iteration's update ends the run (exit 1, no traceback) with a message naming
    the role group and the resume command. Resumed from the second iteration's checkpoint (which
    holds the two rollouts sampled ahead and every actor's global random state), under one
    colocated actor per role, it gives the killed run's metrics of the iterations both ran to 1e-5
    (two actors' summed gradients differ from one's in float rounding only), and every actor starts
    from the random state its rank had when the checkpoint was written."""
    from rlhf.ray_runtime.runtime import RayRuntime

    ahead = ["--rollout.max_staleness", "2", "--checkpoint.every", "1", "--checkpoint.keep", "4"]
    ahead += ["--model.lora.enabled", "true", "--train.iterations", "4"]
    two = ["--ray.placement", "separate", "--ray.policy.num_actors", "2", "--ray.critic.num_actors", "2"]
    calls, train, load_role_state = {"n": 0}, RayRuntime.train, RayRuntime.load_role_state
    planted: dict[str, list[dict]] = {}

    def killing(self, roles, minibatches):
        calls["n"] += 1
        if calls["n"] == 5:  # critic pre-training, iterations 0, 1 and 2, then iteration 3's update
            ray.kill(self.actors["critic"][0])
        result = train(self, roles, minibatches)
        if calls["n"] == 2:  # iteration 0 updated: each actor's global state its own (as dropout would)
            for i, (group, actors) in enumerate(sorted(self.actors.items())):
                planted[group] = planted_rng_states(100 * i, len(actors))
                self._call(group, "load_rng_state", planted[group])
        return result

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
    assert [r["async/staleness"] for r in killed] == [0, 1, 2]
    assert all(0 < r["async/is_weight_mean"] <= r["async/is_weight_max"] <= 2.0 for r in killed)
    # no update yet: pi_prox = pi_behav; after one, the weights move away from 1
    assert killed[0]["async/is_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert all(r["async/is_weight_max"] != pytest.approx(1.0, abs=1e-6) for r in killed[1:])
    checkpoints = split / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"iter_00000{i}" for i in (1, 2, 3)]
    for later in ("iter_000002", "iter_000003"):  # resume from the second iteration's checkpoint
        shutil.rmtree(checkpoints / later)
    restored: dict[str, list[dict]] = {}

    def loading(self, state):
        load_role_state(self, state)
        restored.update({group: self._call(group, "rng_state") for group in self.actors})

    monkeypatch.setattr(RayRuntime, "train", train)
    monkeypatch.setattr(RayRuntime, "load_role_state", loading)
    one = [f"--ray.{group}.num_actors=1" for group in ("policy", "critic")]
    assert main(["train", "--resume", str(split), "--ray.placement", "colocate", *one]) == 0
    resumed = [r for r in metric_rows(split) if "iteration" in r]
    assert [r["iteration"] for r in resumed] == [0, 1, 2, 3]
    assert [r["async/staleness"] for r in resumed] == [0, 1, 2, 2]
    assert_same_rows(killed, resumed[:3], tolerance=1e-5)
    assert sorted(restored) == sorted(planted) == ["critic", "policy", "rollout"]
    assert all(same_rng_state(restored[g][0], planted[g][0]) for g in planted)  # one actor each: rank 0's


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


def test_an_evaluator_reaches_the_roles_through_ray_as_through_the_local_runtime(models, cluster, tmp_path):
    """An in-loop evaluator (as `rlhf demo`'s, rlhf/demo/held_out.py) under Ray: the roles are on
    the actors (the trainer holds a RayRuntime, as any run holds no roles) and it asks the runtime: `sample` from a seed of its own (the
    policy's actor) and log-probs at temperature 1 (the policy's and the reference's). After the
    first update: the local run's tokens bit for bit, its log-probs to float rounding."""
    from rlhf.config import RLConfig, load_config
    from rlhf.models.sampling import SamplingConfig
    from rlhf.stages.train import run_rl

    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0)

    def evaluator_into(seen: list):
        def evaluator(trainer, iteration: int) -> dict:
            prompts = [trainer.runtime.tokenizer(w)["input_ids"] for w in ("a b", "c d e", "f", "g h i j")]
            with torch.inference_mode():
                rollout = trainer.runtime.sample(prompts, sampling, 11)
                forwards = {
                    r: trainer.runtime.forward(r, rollout.sequences, 1.0) for r in ("policy", "reference")
                }
            seen.append((type(trainer.runtime).__name__, rollout.input_ids, forwards))
            return {"sampled_rows": float(len(prompts))}

        return evaluator

    runs = {}
    for runtime in ("local", "ray"):
        layers = {
            "model": {"policy": models["sft"], "reward_model": models["rm"]},
            "data": {"prompts": models["prompts"]},
            "out": str(tmp_path / runtime),
            "train": {"iterations": 1, "micro_batch_size": 2, "minibatches": 2},
            "rollout": {"batch_size": 6, "max_new_tokens": 4, "temperature": 0.7},
            "critic": {"pretrain_iterations": 0},
            "log": {"eval_every": 1, "sinks": ["jsonl"]},
            "dist": {"runtime": runtime},
        }
        if runtime == "ray":  # ray.* applies under dist.runtime ray only
            layers["ray"] = {
                group: {"num_cpus": 0.5} for group in ("policy", "critic", "reference", "reward_model")
            }
        runs[runtime] = []
        run_rl(
            load_config(RLConfig, preset="ppo_max", overrides=layers),
            evaluator=evaluator_into(runs[runtime]),
            quiet=True,
        )
    ((local_runtime, want, want_forwards),) = runs["local"]
    ((ray_runtime, got, got_forwards),) = runs["ray"]
    assert (local_runtime, ray_runtime) == ("LocalRuntime", "RayRuntime")
    assert torch.equal(got, want)
    for role in ("policy", "reference"):
        torch.testing.assert_close(got_forwards[role], want_forwards[role])


def test_train_compile_in_the_role_actors_gives_the_local_runs_numbers(models, local_run, cluster, tmp_path):
    """`train.compile` marks the trained models where the roles are built, in their actors: they
    compile (their stderr, in the cluster's log folder, says so) and, with the aot_eager backend
    (compiled graphs, torch's own kernels), log the local uncompiled run's numbers."""
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    said = "train.compile: compiling the training forward and backward (aot_eager)"

    def compiled_in_actors() -> int:
        return sum(said in f.read_text(errors="replace") for f in logs.glob("worker-*.err"))

    before = compiled_in_actors()
    out = tmp_path / "ray"
    compile = ["--train.compile", "true", "--train.compile_backend", "aot_eager"]
    assert main(train_args(models, out, "--dist.runtime", "ray", *HALF_A_CPU, *compile)) == 0
    assert compiled_in_actors() > before
    assert_same_rows(metric_rows(local_run), metric_rows(out), tolerance=1e-6)


def test_agent_episodes_are_decoded_by_the_rollout_actor(models, cluster, tmp_path, monkeypatch):
    """`--agent` under Ray: the episodes' requests are sampled by the rollout group (its copy of the
    policy synced after each update), the agent's server and the loop on the driver."""
    from rlhf.ray_runtime.runtime import RayRuntime

    first, calls = RayRuntime._first, []

    def counted(self, group, method, *args, **kwargs):
        calls.append((group, method))
        return first(self, group, method, *args, **kwargs)

    monkeypatch.setattr(RayRuntime, "_first", counted)
    out = tmp_path / "agent"
    args = [
        "train", "--preset", "grpo", "--policy", models["sft"], "--prompts", models["prompts"],
        "--out", str(out), "--agent", "tests.support.agents_testing:chat_agent", "--train.iterations", "2",
        "--rollout.batch_size", "3", "--rollout.samples_per_prompt", "2", "--rollout.max_new_tokens", "4",
        "--train.micro_batch_size", "6", "--log.sinks", "jsonl", "--dist.runtime", "ray",
        "--ray.policy.num_cpus=0.5", "--ray.reference.num_cpus=0.5", "--ray.rollout.num_actors=1",
        "--ray.rollout.num_cpus=0.5",
    ]  # fmt: skip
    assert main(args) == 0
    rows = metric_rows(out)
    assert len(rows) == 2 and all(
        r["agent/turns_mean"] == 2 and r["agent/failed_fraction"] == 0 for r in rows
    )
    sampled = [group for group, method in calls if method == "generate"]
    assert sampled and set(sampled) == {"rollout"}  # every turn of every episode, on the rollout actor
