"""`dist.strategy ddp` through DistributedDataParallel (rlhf/parallel/replicated.py): the gradients of
a step's passes summed over the ranks, a parameter some rank left out counted as zeros there, one no
rank used left without a gradient (AdamW skips it), against the plain sum in one process."""

from __future__ import annotations

import pytest
import torch

from rlhf.config import OptimConfig
from rlhf.train.accumulation import Accumulation
from rlhf.train.learner import Learner, Training
from tests.support.dist_cases import PASS_INPUTS, ThreeLayers, first_pass_loss, last_pass_loss, partial_passes
from tests.support.ranks import run_ranks


@pytest.mark.slow
def test_ddp_sums_every_pass_of_a_step_and_leaves_an_unused_parameter_without_gradient():
    module = ThreeLayers()
    learner = Learner.build(module, Training(OptimConfig(lr=0.1, weight_decay=0.5), 1))
    total = sum(
        first_pass_loss(module, x, rank == 0) + last_pass_loss(module, x)
        for rank, x in enumerate(PASS_INPUTS)
    )
    total.backward()  # the one-process gradient: every rank's rows in one loss
    expected = {n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()}
    learner.optimizer_step()
    stepped = {n: p.detach().clone() for n, p in module.named_parameters()}
    assert expected["c.weight"] is None and expected["a.weight"] is not None
    for rank, got in enumerate(run_ranks(partial_passes)):
        for name, grad in expected.items():
            if grad is None:
                assert got["grads"][name] is None, f"rank {rank}: {name} got a gradient"
            else:
                torch.testing.assert_close(got["grads"][name], grad, msg=f"rank {rank}: {name}")
        for name, param in stepped.items():  # c: no weight decay either (AdamW skipped it)
            torch.testing.assert_close(got["params"][name], param, msg=f"rank {rank}: {name}")


def test_only_the_last_pass_reduces_and_a_missing_pass_is_an_error():
    entered = []

    class Local:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    passes = Accumulation(3, Local)
    for _ in range(3):
        with passes.next_pass():
            pass
    passes.finish()
    assert len(entered) == 2  # the first two accumulate locally, the last reduces
    short = Accumulation(2, Local)
    with short.next_pass():
        pass
    with pytest.raises(RuntimeError, match="1 of its 2"):
        short.finish()
    with short.next_pass():
        pass
    with pytest.raises(RuntimeError, match="ran pass 3"):
        with short.next_pass():
            pass
