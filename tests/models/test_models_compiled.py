"""Compiled training forwards (`train.compile`, rlhf/models/compiled.py): a marked decoder runs
compiled in forwards with gradients on, and its log-probs, values and gradients equal the eager
path's (float32: exactly under the aot_eager backend, which compiles the graph but keeps torch's
kernels; at 1e-5 under inductor, which fuses them); forwards without gradients stay eager; the mark
survives a copy and changes no state dict; a backend that cannot run is refused naming the key."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf.config import ConfigError, RLConfig, SFTConfig, load_config
from rlhf.models.compiled import (
    COMPILE_ATTRIBUTE,
    compile_for_training,
    compile_refusal,
    is_compiled_for_training,
)
from rlhf.models.grad_checkpointing import gradient_checkpointing
from rlhf.models.logprobs import response_logprobs
from rlhf.models.lora import apply_lora
from rlhf.models.packing import enable_packing
from rlhf.models.scalar_head import ScalarHeadModel, response_values
from rlhf.train.setup import with_compile
from tests.support.models_testing import left_pad

ROWS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19], [20, 21]]


def graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from nothing: dynamo's recompile limit counts every earlier compile of the
    one compiled function in this worker."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def logprobs_and_grads(model, ids, mask, prompt):
    model.zero_grad(set_to_none=True)
    logprobs, _ = response_logprobs(model, ids, mask, prompt)
    (logprobs * torch.linspace(0.5, 1.5, logprobs.shape[1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), grads


def assert_same(eager, compiled, atol):
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=atol)
    assert compiled[1].keys() == eager[1].keys() and eager[1]
    for name, grad in eager[1].items():
        torch.testing.assert_close(compiled[1][name], grad, rtol=atol, atol=atol, msg=name)


@pytest.mark.slow
def test_inductor_compiles_the_training_forward_and_gives_the_eager_numbers(lm):
    ids, mask = left_pad(ROWS, pad_id=0)
    compiled = copy.deepcopy(lm)
    compile_for_training(compiled, "inductor")
    before = graphs()
    assert_same(logprobs_and_grads(lm, ids, mask, 3), logprobs_and_grads(compiled, ids, mask, 3), atol=1e-5)
    assert graphs() > before  # it did compile


@pytest.mark.parametrize("case", ["plain", "packed", "lora", "checkpointed"])
def test_aot_eager_gives_the_eager_numbers_with_packing_lora_and_checkpointing(lm, case):
    ids, mask = left_pad(ROWS, pad_id=0)
    if case == "lora":
        lm = apply_lora(lm, r=4, alpha=8)
    compiled = copy.deepcopy(lm)
    for model in (lm, compiled):
        if case == "packed":
            enable_packing(model)
        if case == "checkpointed":
            gradient_checkpointing(model)
            model.train()
    compile_for_training(compiled, "aot_eager")
    before = graphs()
    assert_same(logprobs_and_grads(lm, ids, mask, 3), logprobs_and_grads(compiled, ids, mask, 3), atol=1e-6)
    assert graphs() > before


def test_values_of_a_scalar_head_model_equal_the_eager_ones(lm):
    ids, mask = left_pad(ROWS, pad_id=0)
    critic = ScalarHeadModel.from_causal_lm(lm)
    compiled = copy.deepcopy(critic)
    compile_for_training(compiled, "aot_eager")
    out = []
    for model in (critic, compiled):
        values = response_values(model, ids, mask, 3)
        values.sum().backward()
        out.append((values.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=1e-6)
    for a, b in zip(out[0][1], out[1][1], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


def test_forwards_without_gradients_stay_eager(lm):
    ids, mask = left_pad(ROWS, pad_id=0)
    compile_for_training(lm, "aot_eager")
    before = graphs()
    with torch.no_grad():
        response_logprobs(lm, ids, mask, 3)
    with torch.inference_mode():
        response_logprobs(lm, ids, mask, 3)
    assert graphs() == before


def test_the_mark_survives_a_copy_and_changes_no_state_dict(lm):
    keys = list(lm.state_dict())
    assert not is_compiled_for_training(lm)
    compile_for_training(lm, "aot_eager")
    assert is_compiled_for_training(lm) and list(lm.state_dict()) == keys
    assert getattr(lm.get_decoder(), COMPILE_ATTRIBUTE) == "aot_eager"
    assert is_compiled_for_training(copy.deepcopy(lm))  # a reference or critic copied later
    critic = ScalarHeadModel.from_causal_lm(copy.deepcopy(lm))
    assert is_compiled_for_training(critic)


def test_inductor_without_triton_on_a_gpu_is_refused_naming_the_key(lm, monkeypatch):
    import importlib.util

    assert compile_refusal("inductor", torch.device("cpu")) is None
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a)
    )
    assert compile_refusal("inductor", torch.device("cpu")) is None  # a CPU compiles with a C++ compiler
    assert compile_refusal("aot_eager", torch.device("cuda")) is None
    with pytest.raises(
        ConfigError, match="train.compile is true, but inductor compiles for a GPU with triton"
    ) as error:
        with_compile(True, "inductor", torch.device("cuda"), lm)
    assert error.value.key == "train.compile_backend" and not is_compiled_for_training(lm)
    with_compile(False, "inductor", torch.device("cuda"), lm)  # off: nothing checked, nothing marked
    assert not is_compiled_for_training(lm)


def test_compile_is_a_switch_of_every_train_group_and_refused_under_fsdp2():
    assert load_config(SFTConfig, overrides={"train": {"compile": True}}).train.compile is True
    rl = load_config(RLConfig, overrides={"train": {"compile": True, "compile_backend": "aot_eager"}})
    assert rl.train.compile and rl.train.compile_backend == "aot_eager"
    for stage in (SFTConfig, RLConfig):
        with pytest.raises(
            ConfigError, match="train.compile does not run under dist.strategy fsdp2"
        ) as error:
            load_config(stage, overrides={"train": {"compile": True}, "dist": {"strategy": "fsdp2"}})
        assert error.value.key == "train.compile" and "Fix: --train.compile false" in str(error.value)
    with pytest.raises(ConfigError, match="train.compile"):
        load_config(SFTConfig, overrides={"train": {"compile": "often"}})
    with pytest.raises(ConfigError, match="train.compile_backend must be a torch.compile backend") as error:
        load_config(RLConfig, overrides={"train": {"compile": True, "compile_backend": "fast"}})
    assert "'fast'" in str(error.value) and "inductor" in str(error.value)
    # off, a backend set would do nothing: refused as a setting that cannot apply
    with pytest.raises(ConfigError, match="train.compile_backend applies only when train.compile true"):
        load_config(RLConfig, overrides={"train": {"compile_backend": "aot_eager"}})


def test_rows_and_lengths_that_change_make_one_graph(lm):
    """A pass's rows and length are marked dynamic from the first call: one graph for every shape
    (dynamo's own rule would compile the first shape static, then again dynamic)."""
    compile_for_training(lm, "aot_eager")
    before = graphs()
    for rows in (ROWS, ROWS[:3], ROWS[:1] * 2, [r + [22, 23, 24] for r in ROWS]):
        ids, mask = left_pad(rows, pad_id=0)
        logprobs_and_grads(lm, ids, mask, 2)
    assert graphs() == before + 1
