"""The switches that make an iteration cheaper without changing what it computes:
the critic's update beside the policy's (train.overlap_critic, concurrency.py) and the old
log-probs read from the sampler (rollout.logprobs_from_sampler)."""

from __future__ import annotations

import threading

import pytest
import torch
from train_testing import rl_config

import rlhf.train.rl as rl_module
from rlhf.train.concurrency import run_side_by_side, side_by_side_threads

# -- run_side_by_side ------------------------------------------------------------------------------


def test_side_by_side_runs_every_step_in_order_on_two_threads_and_restores_threads():
    torch.set_num_threads(1)
    seen: dict[str, list] = {"here": [], "beside": []}

    def step(side: str, i: int):
        def run():
            seen[side].append((i, threading.current_thread().name, torch.get_num_threads()))

        return run

    run_side_by_side([step("here", i) for i in range(4)], [step("beside", i) for i in range(3)], 1)
    assert [i for i, _, _ in seen["here"]] == [0, 1, 2, 3]
    assert [i for i, _, _ in seen["beside"]] == [0, 1, 2]
    assert {name for _, name, _ in seen["here"]} == {threading.current_thread().name}
    assert {name for _, name, _ in seen["beside"]} == {"rlhf-side-by-side"}
    assert {n for side in seen.values() for _, _, n in side} == {1}
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("failing", ["here", "beside"])
def test_side_by_side_reraises_an_error_and_the_other_side_stops(failing):
    torch.set_num_threads(1)
    started = threading.Event()  # the other side is inside its first step
    gate = threading.Event()  # the failing side's error is recorded before the other side goes on
    ran: list[str] = []

    def boom():
        started.wait(timeout=30)
        try:
            raise RuntimeError(f"{failing} failed")
        finally:
            gate.set()

    def wait_then(name):
        def run():
            started.set()
            gate.wait(timeout=30)
            ran.append(name)

        return run

    failing_steps = [boom, lambda: ran.append("after the error")]
    other_steps = [wait_then("first"), lambda: ran.append("second"), lambda: ran.append("third")]
    here, beside = (failing_steps, other_steps) if failing == "here" else (other_steps, failing_steps)
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        run_side_by_side(here, beside, 1)
    assert ran == ["first"]  # the other side finished the step it was in, then stopped
    assert torch.get_num_threads() == 1


def test_side_by_side_threads_split_the_intra_op_threads(monkeypatch):
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 1)
    assert side_by_side_threads() is None  # one core: two threads would only take turns
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 8)
    previous = torch.get_num_threads()
    try:
        for threads, each in [(1, 1), (2, 1), (4, 2), (5, 2)]:
            torch.set_num_threads(threads)
            assert side_by_side_threads() == each
    finally:
        torch.set_num_threads(previous)


# -- the trainer's update beside the critic's --------------------------------------------------------


def one_update(make_trainer, monkeypatch, tmp_path, *, cores: int, **overrides):
    """A trainer's first iteration with the machine reporting `cores` cores; returns its metrics,
    its parameters, and how many times the side-by-side update ran."""
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: cores)
    calls = []

    def spy(*args):
        calls.append(args[2])
        return run_side_by_side(*args)

    monkeypatch.setattr(rl_module, "run_side_by_side", spy)
    trainer = make_trainer(
        rl_config("ppo_max", **overrides), run_dir=tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    )
    metrics = trainer.step()
    params = [
        p.detach().clone() for p in (*trainer.roles.policy.parameters(), *trainer.roles.critic.parameters())
    ]
    return metrics, params, calls


def test_overlapped_update_equals_the_sequential_one(make_trainer, monkeypatch, tmp_path):
    """Policy and critic share no parameter: updating them side by side gives the same weights and
    stats as in turn (to float rounding), with each side on one of the two cores."""
    torch.set_num_threads(1)
    base = {"train": {"ppo_epochs": 2, "minibatches": 2}}
    sequential, seq_params, seq_calls = one_update(
        make_trainer, monkeypatch, tmp_path, cores=2, train={**base["train"], "overlap_critic": False}
    )
    overlapped, ovl_params, ovl_calls = one_update(make_trainer, monkeypatch, tmp_path, cores=2, **base)
    assert seq_calls == [] and ovl_calls == [1]
    for a, b in zip(seq_params, ovl_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    keys = [k for k in sequential if k.startswith(("policy/", "value/"))]
    assert keys and set(keys) == {k for k in overlapped if k.startswith(("policy/", "value/"))}
    for k in keys:
        assert overlapped[k] == pytest.approx(sequential[k], rel=1e-4, abs=1e-6), k
    assert "value/grad_norm" in keys and "policy/grad_norm" in keys


@pytest.mark.parametrize(
    "cores, overrides",
    [(1, {}), (2, {"model": {"critic_mode": "shared"}})],
    ids=["one-core", "shared-critic"],
)
def test_no_overlap_on_one_core_or_with_a_shared_critic(
    make_trainer, monkeypatch, tmp_path, cores, overrides
):
    metrics, _, calls = one_update(make_trainer, monkeypatch, tmp_path, cores=cores, **overrides)
    assert calls == []
    assert torch.isfinite(torch.tensor(metrics["value/loss"]))


def test_an_error_in_the_critic_update_reaches_the_caller(make_trainer, monkeypatch):
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 2)
    trainer = make_trainer(rl_config("vanilla_ppo"))

    def broken(*args, **kwargs):
        raise FloatingPointError("value loss is NaN")

    monkeypatch.setattr(rl_module, "value_loss", broken)
    threads = torch.get_num_threads()
    with pytest.raises(FloatingPointError, match="value loss is NaN"):
        trainer.step()
    assert torch.get_num_threads() == threads


# -- old log-probs from the sampler -----------------------------------------------------------------


def test_sampler_logprobs_replace_the_old_logprob_forward(make_trainer, monkeypatch, tmp_path):
    """With rollout.logprobs_from_sampler the policy runs no forward for old_logp, and the old
    log-probs equal the forward's to float rounding: the first PPO ratio is 1."""
    forward = make_trainer(rl_config("vanilla_ppo"), run_dir=tmp_path / "forward")
    reference, _ = forward.make_experience()
    from_sampler = make_trainer(
        rl_config("vanilla_ppo", rollout={"logprobs_from_sampler": True}), run_dir=tmp_path / "sampler"
    )
    calls = []
    original = rl_module.response_logprobs
    monkeypatch.setattr(rl_module, "response_logprobs", lambda *a, **k: calls.append(1) or original(*a, **k))
    experience, _ = from_sampler.make_experience()
    assert calls == []  # the reference model scores through its own wrapper, not this function
    assert torch.equal(experience.input_ids, reference.input_ids)  # same seed, same draws
    assert experience.response_mask.eq(0).any()  # padding inside the batch
    torch.testing.assert_close(experience.old_logp, reference.old_logp, rtol=0, atol=1e-5)
    assert experience.old_logp[experience.response_mask == 0].eq(0).all()


def test_sampler_logprobs_give_ratio_one_on_the_first_epoch(make_trainer):
    trainer = make_trainer(
        rl_config(
            "vanilla_ppo",
            rollout={"logprobs_from_sampler": True},
            train={"ppo_epochs": 1, "minibatches": 1, "micro_batch_size": 8},
        )
    )
    metrics = trainer.step()
    assert metrics["policy/ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["policy/clip_fraction"] == 0.0
