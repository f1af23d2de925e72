"""bench/update_compile.py: the compiled trainer's update runs compiled decoders (graphs made), the
rest of its iteration runs them uncompiled, and both trainers log the same first iteration (the
aot_eager backend runs the very ops eager mode runs: no rounding of its own)."""

import json
import sys

import torch

from bench import update_compile


def test_the_compiled_update_logs_the_uncompiled_ones_figures(monkeypatch, capsys):
    args = ["--workload", "tiny-1x1", "--device", "cpu", "--dtype", "float32", "--backend", "aot_eager"]
    monkeypatch.setattr(sys, "argv", ["update_compile", *args, "--iters", "2", "--warmup", "1"])
    update_compile.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["as_is"]["graphs_compiled"] == 0
    assert result["compiled"]["graphs_compiled"] >= 2  # the policy's decoder and the critic's
    difference = result["first_iteration_difference"]
    assert difference["figures_compared"] > 30 and difference["absolute"] <= 1e-6, difference


def test_the_compiled_decoders_are_the_update_ones_only(monkeypatch):
    """The sampler and the scoring forwards run under force_eager: no graph for their shapes."""
    import tempfile

    from bench.gpu import build_trainer, workload_named

    calls: list[str] = []
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(workload_named("tiny-1x1"), "cpu", "float32", 0, run_dir, engine="static")
        update = trainer.update

        def watched(*a, **k):
            calls.append("update")
            return update(*a, **k)

        trainer.update = watched
        made: list[bool] = []

        def backend(graph_module, example_inputs):
            made.append(torch.is_grad_enabled())
            return graph_module.forward

        update_compile.compile_for_the_update(trainer, backend)
        trainer.step()
        trainer.logger.close()
    assert calls == ["update"] and made and all(made)  # every graph traced for a training forward
