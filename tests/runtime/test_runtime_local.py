"""The local runtime's switches (rlhf/runtime/local.py, LocalRuntime), which make an iteration
cheaper without changing what it computes: the critic's update beside the policy's
(runtime.overlap_critic, `train`), the rollout's forwards on two halves of the rows
(runtime.split_forwards, `map_rows`), freed memory kept for reuse (runtime.keep_freed_memory,
runtime/allocator.py) and packed weights for sampling (runtime.pack_weights, packed_linear.py); and
the old log-probs read from the sampler (rollout.logprobs_from_sampler). The threads and FLOP
counts they use, without a trainer: test_runtime_threads.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from functools import partial

import pytest
import torch

import rlhf.rl.roles.forward as forward_module
import rlhf.runtime.local as local_module
from rlhf.parallel.threads import by_row_halves, run_side_by_side
from rlhf.runtime.flops import handover_step
from tests.support.train_testing import rl_config

# -- the trainer's update beside the critic's --------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_omp_limit(monkeypatch):
    """The tests set the cores they need (available_cores); OMP_NUM_THREADS in the environment
    of the suite would cap the side-by-side threads under them (threads.thread_budget)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def one_update(make_trainer, monkeypatch, tmp_path, *, cores: int, **overrides):
    """A trainer's first iteration with the machine reporting `cores` cores; returns its metrics,
    its parameters, and how many times the side-by-side update ran."""
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: cores)
    calls = []

    def spy(*args):
        calls.append(args[2:])
        return run_side_by_side(*args)

    monkeypatch.setattr(local_module, "run_side_by_side", spy)
    trainer = make_trainer(
        rl_config("ppo_max", **overrides), run_dir=tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    )
    metrics = trainer.step()
    params = [
        p.detach().clone()
        for p in (
            *trainer.runtime.roles.policy.model.parameters(),
            *trainer.runtime.roles.critic.model.parameters(),
        )
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

    monkeypatch.setattr(local_module, "handover_step", handover)
    base = {"train": {"ppo_epochs": 2, "minibatches": 2}}
    sequential, seq_params, seq_calls = one_update(
        make_trainer, monkeypatch, tmp_path, cores=2, runtime={"overlap_critic": False}, **base
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
    trainer = make_trainer(rl_config("vanilla_ppo", train={"minibatches": 1}))
    experience, _ = trainer.make_experience()
    policy, critic = trainer.runtime.roles.learners(train_policy=True)
    policy_flops, critic_flops = (trainer.runtime.step_flops(r, [experience]) for r in (policy, critic))
    decoder = trainer.runtime.roles.policy.model.model  # the decoder (LlamaModel) under the output head
    trunk = sum(q.numel() for n, q in decoder.named_parameters() if q.dim() == 2 and "embed" not in n)
    head = trainer.runtime.roles.policy.model.lm_head.weight.numel()
    rows, width = experience.input_ids.shape
    tokens = rows * (width - 1)  # one minibatch of every row; the decoders never compute the last column
    share = experience.response_mask.shape[1] / (width - 1)
    assert policy_flops == pytest.approx(6 * (trunk + head * share) * tokens)
    critic_head = trainer.runtime.roles.critic.model.head.weight.numel()
    assert critic_flops == pytest.approx(6 * (trunk + critic_head) * tokens)
    # several minibatches: the mean of their steps, each on its own rows and columns
    halves = list(experience.minibatches(2, torch.Generator().manual_seed(0)))
    assert len(halves) == 2
    assert trainer.runtime.step_flops(critic, halves) == pytest.approx(
        sum(6 * (trunk + critic_head) * m.input_ids.shape[0] * (m.input_ids.shape[1] - 1) for m in halves) / 2
    )
    lora = make_trainer(rl_config("vanilla_ppo", train={"minibatches": 1}, model={"lora": {"enabled": True}}))
    lora_policy_flops, lora_critic_flops = (
        lora.runtime.step_flops(r, [experience]) for r in lora.runtime.roles.learners(train_policy=True)
    )
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
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 2)
    trainer = make_trainer(rl_config("vanilla_ppo"))

    def broken(*args, **kwargs):
        raise FloatingPointError("value loss is NaN")

    monkeypatch.setattr("rlhf.rl.roles.policy.value_loss", broken)
    threads = torch.get_num_threads()
    with pytest.raises(FloatingPointError, match="value loss is NaN"):
        trainer.step()
    assert torch.get_num_threads() == threads


# -- the rollout's forwards on two halves of the rows --------------------------------------------------


@pytest.mark.parametrize("lora", [False, True], ids=["copied-reference", "adapter-reference"])
def test_split_forwards_equal_the_whole_batch(make_trainer, monkeypatch, tmp_path, lora):
    """Scores, old and reference log-probs and values computed on two halves of the rows, one thread
    each, equal the whole batch's to float rounding; a LoRA reference switches its adapter off once
    for both halves (per call, one thread could switch it back on under the other)."""
    torch.set_num_threads(1)
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 2)
    monkeypatch.setattr(local_module, "MIN_SPLIT_FORWARD_FLOPS", 0.0)
    calls = []

    def spy(compute, rows, threads_each):
        calls.append(threads_each)
        return by_row_halves(compute, rows, threads_each)

    monkeypatch.setattr(local_module, "by_row_halves", spy)
    experiences = {}
    for split in (False, True):
        trainer = make_trainer(
            rl_config(
                "vanilla_ppo",
                runtime={"split_forwards": split},
                model={"lora": {"enabled": lora}},
            ),
            run_dir=tmp_path / f"split-{split}",
        )
        if lora:  # an adapter that changes the policy, so a reference with it left on would differ
            generator = torch.Generator().manual_seed(0)
            for name, q in trainer.runtime.roles.policy.model.named_parameters():
                if "lora_B" in name:
                    q.data.normal_(0.0, 0.3, generator=generator)
            entered = []
            monkeypatch.setattr(
                trainer.runtime.roles.policy.model,
                "disable_adapter",
                partial(count_calls, entered, trainer.runtime.roles.policy.model.disable_adapter),
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
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 2)
    trainer = make_trainer(rl_config("vanilla_ppo"))
    if rope is not None:
        reward_config = trainer.runtime.roles.reward_model.model.causal_lm.config
        reward_config.rope_parameters = {"rope_theta": 10000.0, **rope}
    assert (trainer.runtime.split_forward_threads(tokens=10**9) is None) is stateful


def count_calls(calls: list, function, *args, **kwargs):
    calls.append(1)
    return function(*args, **kwargs)


def test_split_forwards_need_the_switch_two_cores_and_enough_work(make_trainer, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 2)
    trainer = make_trainer(rl_config("vanilla_ppo"))
    assert trainer.runtime.split_forward_threads(tokens=10**9) == 1
    assert trainer.runtime.split_forward_threads(tokens=10) is None  # a forward too small to gain from it
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 1)
    assert trainer.runtime.split_forward_threads(tokens=10**9) is None
    monkeypatch.setattr("rlhf.parallel.threads.available_cores", lambda: 2)
    off = make_trainer(rl_config("vanilla_ppo", runtime={"split_forwards": False}))
    assert off.runtime.split_forward_threads(tokens=10**9) is None


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
    original = forward_module.response_logprobs
    monkeypatch.setattr(
        forward_module, "response_logprobs", lambda *a, **k: calls.append(a[0]) or original(*a, **k)
    )
    experience, _ = from_sampler.make_experience()
    policy = from_sampler.runtime.roles.policy.model
    assert calls and all(model is not policy for model in calls)  # the reference's forwards only
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
    from rlhf.runtime.allocator import keep_freed_memory
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
@pytest.mark.slow
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
@pytest.mark.slow
def test_a_malloc_setting_of_the_user_wins():
    first, second, _ = late_step_faults("keep", env={"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert (first, second) == ("False", "False")


def test_the_trainer_keeps_freed_memory_unless_switched_off(make_trainer, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(local_module, "keep_freed_memory", lambda: calls.append(1) or True)
    make_trainer(rl_config("vanilla_ppo"), run_dir=tmp_path / "on")
    assert calls == [1]
    make_trainer(rl_config("vanilla_ppo", runtime={"keep_freed_memory": False}), run_dir=tmp_path / "off")
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
            rl_config("vanilla_ppo", runtime={"pack_weights": pack}), run_dir=tmp_path / str(pack)
        )
        assert trainer.runtime.roles.policy.sampling.pack_weights is pack
        experiences[pack], _ = trainer.make_experience()
        assert bool(calls) is (pack and packed_linear.packing_available())
    assert torch.equal(experiences[True].input_ids, experiences[False].input_ids)
    torch.testing.assert_close(experiences[True].advantages, experiences[False].advantages)
