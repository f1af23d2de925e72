"""The switches that make an iteration cheaper without changing what it computes:
the critic's update beside the policy's (train.overlap_critic, concurrency.py), the rollout's
forwards on two halves of the rows (rollout.split_forwards), the old log-probs read from the
sampler (rollout.logprobs_from_sampler), freed memory kept for reuse (train.keep_freed_memory,
allocator.py) and packed weights for sampling (rollout.pack_weights, packed_linear.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from functools import partial

import pytest
import torch
from train_testing import rl_config

import rlhf.train.rl as rl_module
from rlhf.train.concurrency import (
    MIN_HANDOVER_STEP_FLOPS,
    by_row_halves,
    forward_flops,
    handover_step,
    run_side_by_side,
    side_by_side_threads,
    training_flops_per_token,
)

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


@pytest.mark.parametrize("handover_at", [0, 2, 4, 9])
def test_the_longer_side_takes_every_thread_once_the_other_is_done(handover_at):
    """Steps from `handover_at` on run after the helper's last step, with this thread's own count."""
    torch.set_num_threads(2)
    helper_done = threading.Event()
    here: list[tuple[int, int, bool]] = []

    def step_here(i: int):
        return lambda: here.append((i, torch.get_num_threads(), helper_done.is_set()))

    beside = [lambda: None] * 3 + [helper_done.set]
    run_side_by_side([step_here(i) for i in range(4)], beside, 1, handover_at)
    assert [i for i, _, _ in here] == [0, 1, 2, 3]
    for i, threads, done in here:
        if i >= handover_at:
            assert (threads, done) == (2, True)
        else:
            assert threads == 1
    assert torch.get_num_threads() == 2


def test_no_step_runs_after_the_hand_over_when_the_helper_failed():
    torch.set_num_threads(1)
    ran: list[int] = []

    def boom():
        raise RuntimeError("helper failed")

    with pytest.raises(RuntimeError, match="helper failed"):
        run_side_by_side([lambda: ran.append(0), lambda: ran.append(1)], [boom], 1, handover_at=1)
    assert ran in ([], [0])  # step 0 may start before the helper's error; step 1 never runs
    assert torch.get_num_threads() == 1


G = 1e9  # FLOPs


@pytest.mark.parametrize(
    "steps_here, flops_here, steps_beside, flops_beside, expected",
    [
        (16, 5.5 * G, 16, 0.86 * 5.5 * G, 14),  # ceil(13.76): small-4x4's measured critic/policy ratio
        (16, 4 * G, 16, 2 * G, 8),  # exactly on a step: no extra step beside
        (16, 4 * G, 16, 4 * G, 16),  # equal sides: no hand-over
        (4, 4 * G, 8, 1 * G, 2),  # unequal step counts
        (16, 0.2 * G, 16, 0.1 * G, 16),  # tiny steps: more threads would slow them down
    ],
)
def test_handover_step_is_where_the_shorter_side_is_predicted_done(
    steps_here, flops_here, steps_beside, flops_beside, expected
):
    assert handover_step(steps_here, flops_here, steps_beside, flops_beside) == expected


def test_handover_needs_steps_large_enough_for_more_threads():
    assert handover_step(16, MIN_HANDOVER_STEP_FLOPS, 16, MIN_HANDOVER_STEP_FLOPS / 2) == 8
    assert handover_step(16, MIN_HANDOVER_STEP_FLOPS * 0.99, 16, MIN_HANDOVER_STEP_FLOPS / 2) == 16


def test_training_flops_count_weight_matrices_not_embeddings_or_vectors():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 4), torch.nn.Linear(4, 8), torch.nn.LayerNorm(8))
    assert training_flops_per_token([model]) == 32 * 6  # forward, input gradient, weight gradient
    model[1].weight.requires_grad_(False)
    assert training_flops_per_token([model]) == 32 * 4  # frozen (LoRA base): no weight gradient
    head = torch.nn.Linear(8, 10, bias=False)
    assert training_flops_per_token([model, head], scale=[1.0, 0.5]) == 32 * 4 + 80 * 6 * 0.5


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
        calls.append(args[2:])
        return run_side_by_side(*args)

    monkeypatch.setattr(rl_module, "run_side_by_side", spy)
    trainer = make_trainer(
        rl_config("ppo_max", **overrides), run_dir=tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    )
    metrics = trainer.step()
    params = [
        p.detach().clone() for p in (*trainer.roles.policy.model.parameters(), *trainer.roles.critic.model.parameters())
    ]
    return metrics, params, calls


@pytest.mark.parametrize("forced_handover", [None, 1], ids=["computed-handover", "handover-after-one-step"])
def test_overlapped_update_equals_the_sequential_one(make_trainer, monkeypatch, tmp_path, forced_handover):
    """Policy and critic share no parameter: updating them side by side gives the same weights and
    stats as in turn (to float rounding), with each side on one of the two cores and the longer
    side on both once the other is done."""
    torch.set_num_threads(1)
    weighed = []

    def handover(*args):
        weighed.append(args)
        return forced_handover if forced_handover is not None else handover_step(*args)

    monkeypatch.setattr(rl_module, "handover_step", handover)
    base = {"train": {"ppo_epochs": 2, "minibatches": 2}}
    sequential, seq_params, seq_calls = one_update(
        make_trainer, monkeypatch, tmp_path, cores=2, train={**base["train"], "overlap_critic": False}
    )
    overlapped, ovl_params, ovl_calls = one_update(make_trainer, monkeypatch, tmp_path, cores=2, **base)
    assert seq_calls == []
    ((steps_here, flops_here, steps_beside, flops_beside),) = weighed
    # the policy's head over the response columns on top of a trunk like the critic's: the longer side
    assert (steps_here, steps_beside) == (4, 4) and flops_here > flops_beside > 0
    ((threads, handover_at),) = ovl_calls
    assert threads == 1 and handover_at == (forced_handover or handover_step(*weighed[0]))
    for a, b in zip(seq_params, ovl_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    keys = [k for k in sequential if k.startswith(("policy/", "value/"))]
    assert keys and set(keys) == {k for k in overlapped if k.startswith(("policy/", "value/"))}
    for k in keys:
        assert overlapped[k] == pytest.approx(sequential[k], rel=1e-4, abs=1e-6), k
    assert "value/grad_norm" in keys and "policy/grad_norm" in keys


def test_step_flops_follow_the_models_and_the_minibatch(make_trainer):
    """FLOPs of one optimizer step: 6 per weight and token for the trained trunk, the policy's head
    on the response columns only; a LoRA policy's frozen weights get no weight gradient (4), so a
    fully trained critic becomes the longer side and runs on the caller's thread."""
    trainer = make_trainer(rl_config("vanilla_ppo", train={"minibatches": 2}))
    experience, _ = trainer.make_experience()
    policy_flops, critic_flops = trainer.step_flops(experience)
    decoder = trainer.roles.policy.model
    trunk = sum(q.numel() for n, q in decoder.named_parameters() if q.dim() == 2 and "embed" not in n)
    head = trainer.roles.policy.model.lm_head.weight.numel()
    rows, width = experience.input_ids.shape
    tokens = rows * (width - 1) / 2  # the decoders never compute the last column
    share = experience.response_mask.shape[1] / (width - 1)
    assert policy_flops == pytest.approx(6 * (trunk + head * share) * tokens)
    assert critic_flops == pytest.approx(6 * (trunk + trainer.roles.critic.model.head.weight.numel()) * tokens)
    lora = make_trainer(rl_config("vanilla_ppo", train={"minibatches": 2}, model={"lora": {"enabled": True}}))
    lora_policy_flops, lora_critic_flops = lora.step_flops(experience)
    assert lora_policy_flops < lora_critic_flops == pytest.approx(critic_flops)


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


# -- the rollout's forwards on two halves of the rows --------------------------------------------------


@pytest.mark.parametrize("rows, threads_each, calls", [(5, 1, 2), (5, None, 1), (1, 1, 1)])
def test_row_halves_are_joined_in_order_under_the_callers_autograd_mode(rows, threads_each, calls):
    torch.set_num_threads(1)
    seen = []

    def compute(where: slice) -> torch.Tensor:
        seen.append((where, threading.current_thread().name, torch.is_inference_mode_enabled()))
        return torch.arange(rows)[where] * 10

    with torch.inference_mode():
        out = by_row_halves(compute, rows, threads_each)
    assert torch.equal(out, torch.arange(rows) * 10)
    assert len(seen) == calls
    assert all(inference for _, _, inference in seen)  # the helper thread too
    if calls == 2:
        assert sorted((w.start, w.stop) for w, _, _ in seen) == [(0, 3), (3, 5)]
        assert {name for _, name, _ in seen} == {threading.current_thread().name, "rlhf-side-by-side"}
    assert torch.get_num_threads() == 1


def test_forward_flops_count_two_per_weight_matrix_and_token():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    assert forward_flops([model], tokens=5) == 2 * 5 * (4 * 3)


@pytest.mark.parametrize("lora", [False, True], ids=["copied-reference", "adapter-reference"])
def test_split_forwards_equal_the_whole_batch(make_trainer, monkeypatch, tmp_path, lora):
    """Scores, old and reference log-probs and values computed on two halves of the rows, one thread
    each, equal the whole batch's to float rounding; a LoRA reference switches its adapter off once
    for both halves (per call, one thread could switch it back on under the other)."""
    torch.set_num_threads(1)
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 2)
    monkeypatch.setattr(rl_module, "MIN_SPLIT_FORWARD_FLOPS", 0.0)
    calls = []

    def spy(compute, rows, threads_each):
        calls.append(threads_each)
        return by_row_halves(compute, rows, threads_each)

    monkeypatch.setattr(rl_module, "by_row_halves", spy)
    experiences = {}
    for split in (False, True):
        trainer = make_trainer(
            rl_config(
                "vanilla_ppo",
                rollout={"split_forwards": split},
                model={"lora": {"enabled": lora}},
            ),
            run_dir=tmp_path / f"split-{split}",
        )
        if lora:  # an adapter that changes the policy, so a reference with it left on would differ
            generator = torch.Generator().manual_seed(0)
            for name, q in trainer.roles.policy.model.named_parameters():
                if "lora_B" in name:
                    q.data.normal_(0.0, 0.3, generator=generator)
            entered = []
            monkeypatch.setattr(
                trainer.roles.policy.model,
                "disable_adapter",
                partial(count_calls, entered, trainer.roles.policy.model.disable_adapter),
            )
        calls.clear()
        experiences[split], metrics = trainer.make_experience()
        assert calls == ([1, 1, 1, 1] if split else [None, None, None, None])  # scores, old, ref, values
        if lora:
            assert entered == [1]
        experiences[split].raw_scores = torch.tensor(metrics["reward/raw_scores"])
    whole, halves = experiences[False], experiences[True]
    assert torch.equal(whole.input_ids, halves.input_ids)
    if lora:
        assert not torch.allclose(whole.old_logp, whole.ref_logp, atol=1e-3)  # the adapter matters
    for name in ("raw_scores", "old_logp", "ref_logp", "old_values", "advantages", "returns"):
        torch.testing.assert_close(getattr(halves, name), getattr(whole, name), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "rope, stateful",
    [
        (None, False),
        ({"rope_type": "linear", "factor": 2.0}, False),
        ({"rope_type": "dynamic", "factor": 2.0}, True),
        ({"type": "longrope", "short_factor": [1.0]}, True),
    ],
)
def test_models_whose_forward_rewrites_rope_frequencies_are_never_split(
    make_trainer, monkeypatch, rope, stateful
):
    """Dynamic NTK and LongRoPE rotary modules rewrite their frequencies from the sequence length
    inside the forward: two threads running the model at once could race, so nothing is split."""
    from transformers import LlamaConfig

    from rlhf.models.backbone import forward_changes_state

    config = LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=50
    )
    if rope is not None:
        config.rope_parameters = {"rope_theta": 10000.0, **rope}
    model = torch.nn.Module()
    model.config = config
    assert forward_changes_state(model) is stateful
    torch.set_num_threads(1)
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 2)
    trainer = make_trainer(rl_config("vanilla_ppo"))
    if rope is not None:
        reward_config = trainer.roles.reward_model.model.causal_lm.config
        reward_config.rope_parameters = {"rope_theta": 10000.0, **rope}
    assert (trainer.split_forward_threads(tokens=10**9) is None) is stateful


def count_calls(calls: list, function, *args, **kwargs):
    calls.append(1)
    return function(*args, **kwargs)


def test_split_forwards_need_the_switch_two_cores_and_enough_work(make_trainer, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 2)
    trainer = make_trainer(rl_config("vanilla_ppo"))
    assert trainer.split_forward_threads(tokens=10**9) == 1
    assert trainer.split_forward_threads(tokens=10) is None  # a forward too small to gain from it
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 1)
    assert trainer.split_forward_threads(tokens=10**9) is None
    monkeypatch.setattr("rlhf.train.concurrency.available_cores", lambda: 2)
    off = make_trainer(rl_config("vanilla_ppo", rollout={"split_forwards": False}))
    assert off.split_forward_threads(tokens=10**9) is None


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


# -- freed memory kept for reuse -----------------------------------------------------------------------

FAULTS_SCRIPT = textwrap.dedent(
    """
    import ctypes, resource, sys
    from rlhf.train.allocator import keep_freed_memory
    in_force = keep_freed_memory() if sys.argv[1] == "keep" else False
    libc = ctypes.CDLL(None)  # torch's CPU tensors come from this malloc too
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    faults = []
    for _ in range(6):  # a step's activations, 40 x 1 MiB: allocated, written, freed together
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(1 << 20) for _ in range(40)]
        for block in blocks:
            ctypes.memset(block, 1, 1 << 20)
        for block in blocks:
            libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(in_force, keep_freed_memory() if sys.argv[1] == "keep" else False, sum(faults[3:]))
    """
)


def late_step_faults(mode: str, env: dict | None = None) -> tuple[str, str, int]:
    """(in force, in force on a second call, minor page faults of steps 4-6) in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    first, second, faults = done.stdout.split()
    return first, second, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_kept_memory_is_reused_without_page_faults():
    """A step's 40 MiB of activations, freed and allocated again: by default glibc returns them to
    the OS after every step and faults their 10,240 pages back in at the next; with
    keep_freed_memory the same pages are reused."""
    _, _, default_faults = late_step_faults("default")
    assert default_faults > 3 * 8_000
    first, second, kept_faults = late_step_faults("keep")
    assert (first, second) == ("True", "True")
    assert kept_faults < 1_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_a_malloc_setting_of_the_user_wins():
    first, second, _ = late_step_faults("keep", env={"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert (first, second) == ("False", "False")


def test_the_trainer_keeps_freed_memory_unless_switched_off(make_trainer, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(rl_module, "keep_freed_memory", lambda: calls.append(1) or True)
    make_trainer(rl_config("vanilla_ppo"), run_dir=tmp_path / "on")
    assert calls == [1]
    make_trainer(rl_config("vanilla_ppo", train={"keep_freed_memory": False}), run_dir=tmp_path / "off")
    assert calls == [1]


# -- packed sampling weights ----------------------------------------------------------------------------


def test_pack_weights_reaches_the_sampler_and_draws_the_same_rollout(make_trainer, monkeypatch, tmp_path):
    """rollout.pack_weights (on by default) is the sampler's switch; with it the rollout's tokens are
    those drawn without it (the tests' tiny policy is packed here despite its size and short responses)."""
    import rlhf.models.packed_linear as packed_linear

    monkeypatch.setattr(packed_linear, "MIN_PACKED_BYTES", 0)
    monkeypatch.setattr("rlhf.models.sampling.MIN_PACKED_NEW_TOKENS", 0)  # the tests' short responses
    calls = []
    packed_call = packed_linear._PackedForward.__call__
    monkeypatch.setattr(
        packed_linear._PackedForward, "__call__", lambda self, x: count_calls(calls, packed_call, self, x)
    )
    experiences = {}
    for pack in (True, False):
        calls.clear()
        trainer = make_trainer(
            rl_config("vanilla_ppo", rollout={"pack_weights": pack}), run_dir=tmp_path / str(pack)
        )
        assert trainer.sampling.pack_weights is pack
        experiences[pack], _ = trainer.make_experience()
        assert bool(calls) is (pack and packed_linear.packing_available())
    assert torch.equal(experiences[True].input_ids, experiences[False].input_ids)
    torch.testing.assert_close(experiences[True].advantages, experiences[False].advantages)
