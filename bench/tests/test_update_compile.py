"""bench/speed/update_compile.py: the trainer with train.compile runs compiled decoders in its update
(graphs made), the rest of its iteration runs them uncompiled, and both trainers log the same first
iteration (the aot_eager backend runs the very ops eager mode runs: no rounding of its own)."""

import json
import sys

import torch

from bench.speed import update_compile


def test_the_compiled_update_logs_the_uncompiled_ones_figures(monkeypatch, capsys):
    args = ["--workload", "tiny-1x1", "--device", "cpu", "--dtype", "float32", "--backend", "aot_eager"]
    monkeypatch.setattr(sys, "argv", ["update_compile", *args, "--iters", "2", "--warmup", "1"])
    update_compile.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["as_is"]["graphs_compiled"] == 0
    assert result["compiled"]["graphs_compiled"] >= 2  # the policy's decoder and the critic's
    difference = result["first_iteration_difference"]
    assert difference["figures_compared"] > 30 and difference["absolute"] <= 1e-6, difference


# grad mode of every graph the recording backend receives (registered once per process, by name:
# the config takes a backend's name)
TRACED_WITH_GRAD: list[bool] = []


def _recording(graph_module, example_inputs):
    TRACED_WITH_GRAD.append(torch.is_grad_enabled())
    return graph_module.forward


if "rlhf_test_recording" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(_recording, name="rlhf_test_recording")


def test_the_compiled_graphs_are_the_update_ones_only():
    """train.compile compiles the forwards with gradients on: the sampler's and the scoring ones
    make no graph."""
    import tempfile

    from bench.speed.gpu import build_trainer, workload_named

    torch._dynamo.reset()
    TRACED_WITH_GRAD.clear()
    train = {"compile": True, "compile_backend": "rlhf_test_recording"}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(
            workload_named("tiny-1x1"), "cpu", "float32", 0, run_dir, engine="static", train=train
        )
        trainer.step()
        trainer.logger.close()
    assert TRACED_WITH_GRAD and all(TRACED_WITH_GRAD)  # every graph traced for a training forward
