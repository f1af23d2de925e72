"""The GPU section's functions, run on the CPU (tiny workload, a couple of iterations), its plumbing
in run.py and report.py, and one CUDA-only test (skipped here with the reason)."""

from __future__ import annotations

import json
import random
import statistics
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from bench import common, run
from bench.speed import gpu
from bench.speed.ours import PHASES
from bench.speed.report import print_report, summarize
from bench.speed.workload import SIZES, WORKLOADS, Workload, build_causal_lm, build_prompts, build_tokenizer

# The tiny model with a smaller rollout: the same code path as tiny-1x1, a few seconds per run.
TINY = Workload("tiny", 1, 1, batch_size=4, response_length=8)

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)


@pytest.fixture(scope="module")
def tiny_lm():
    rng = random.Random(0)
    tokenizer, words = build_tokenizer(SIZES["tiny"]["vocab"], rng)
    prompts = build_prompts(tokenizer, words, rng, count=8)
    return tokenizer, prompts, build_causal_lm("tiny", tokenizer, seed=0)


# -- device-aware timing -----------------------------------------------------------------------


def test_timed_regions_and_phase_ends_wait_for_the_device(monkeypatch):
    events = []
    monkeypatch.setattr(common, "synchronize", lambda device: events.append(("sync", str(device))))
    seconds, result = common.timed(lambda: events.append("work") or 7, "cuda")
    assert result == 7 and seconds >= 0
    assert events == [("sync", "cuda"), "work", ("sync", "cuda")]  # idle at both ends

    class Role:
        def score(self, x):
            events.append(("score", x))
            return x + 1

    role = Role()
    events.clear()
    common.synchronized_after(role, "score", "cuda:1")
    assert role.score(1) == 2
    assert events == [("score", 1), ("sync", "cuda:1")]  # the phase's clock stops after the wait


def test_peak_memory_reads_cuda_allocations_or_the_cpu_rss(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(device))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**20)
    common.reset_peak_memory("cuda")
    assert calls == [torch.device("cuda")]
    assert common.peak_memory("cuda") == {"peak_mb": 3.0, "kind": "cuda_allocated"}
    common.reset_peak_memory("cpu")  # nothing to reset on the CPU
    assert len(calls) == 1
    cpu = common.peak_memory("cpu")
    assert cpu["kind"] == "cpu_peak_rss" and cpu["peak_mb"] > 0


# -- one PPO iteration on a device --------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ppo_iteration_on_the_cpu_splits_each_iteration_into_its_phases(dtype):
    result = gpu.ppo_iteration(TINY, "cpu", dtype, iters=2, warmup=1)
    assert result["workload"] == "tiny-1x1" and result["device"] == "cpu" and result["dtype"] == dtype
    assert result["iterations_counted"] == 1 and len(result["iter_s"]) == 2
    assert result["s_per_iter_median"] == pytest.approx(statistics.median(result["iter_s"][1:]), abs=1e-4)
    assert result["shapes_BPT"][0][0] == 4 and all(s[2] == 8 for s in result["shapes_BPT"])  # no EOS stop
    for row in result["phases_per_iteration_s"]:
        phases = [row[p] for p in PHASES]
        assert all(t > 0 for t in phases)
        # the phases are disjoint parts of the iteration: they fill most of it and never exceed it
        assert 0.5 * row["wall"] <= sum(phases) <= row["wall"]
    steady = result["phases_per_iteration_s"][1]
    assert result["phases_s"]["other"] == pytest.approx(
        steady["wall"] - sum(steady[p] for p in PHASES), abs=1e-3
    )
    assert set(result["gflop_per_iter"]) == set(PHASES) and all(
        v > 0 for v in result["gflop_per_iter"].values()
    )
    assert result["memory_kind"] == "cpu_peak_rss" and result["peak_memory_mb"] > 0


def test_ppo_iteration_counts_at_least_one_iteration():
    with pytest.raises(ValueError, match="must exceed warmup"):
        gpu.ppo_iteration(TINY, "cpu", "float32", iters=1, warmup=1)


# -- our sampler against generate -----------------------------------------------------------------


def plain_greedy(model, ids, mask, new_tokens: int, eos: int, pad: int) -> torch.Tensor:
    """Reference: argmax of a full forward over the whole sequence at every step, no cache."""
    ids, mask = ids.clone(), mask.clone()
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    out = []
    with torch.no_grad():
        for _ in range(new_tokens):
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
            token = torch.where(done, torch.full_like(done, pad, dtype=torch.long), logits.argmax(-1))
            out.append(token)
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, (~done).long()[:, None]], 1)
            done |= token == eos
    return torch.stack(out, 1)


def test_sampler_vs_generate_on_the_cpu(tiny_lm):
    tokenizer, prompts, model = tiny_lm
    result = gpu.sampler_vs_generate(
        model, tokenizer, prompts, "cpu", "float32", (1, 4), new_tokens=8, reps=1
    )
    for size in (1, 4):
        row = result[f"batch{size}"]
        assert row["batch"] == size
        # EOS never stops a row: both produce every token of every row
        assert row["ours_tokens"] == row["generate_tokens"] == size * 8
        assert row["ours_steps"] == row["generate_steps"] == 8
        # the times are stored rounded to 1 ms: the ratio they give is known only to that rounding
        slack = 0.0005 / row["generate_s"] + 0.0005 / row["ours_s"]
        assert row["speedup"] == pytest.approx(row["generate_s"] / row["ours_s"], rel=slack + 0.002)
    assert result["greedy_tokens"] == {
        "steps": [8, 8],
        "equal": True,
        "rows_differing": 0,
        "first_step_differing": None,
    }
    assert result["memory_kind"] == "cpu_peak_rss" and result["peak_memory_mb"] > 0
    # the greedy tokens both samplers agree on are those of a plain, cache-free argmax loop
    ids, mask = gpu.batch_of(prompts, 4, tokenizer.pad_token_id)
    reference = plain_greedy(model, ids, mask, 8, tokenizer.eos_token_id, tokenizer.pad_token_id)
    from bench.speed.smollm2 import ours_generate
    from rlhf.models.sampling import SamplingConfig

    _, rollout = ours_generate(
        model, ids, mask, SamplingConfig(max_new_tokens=8, do_sample=False), tokenizer, 0
    )
    assert torch.equal(rollout.response_ids, reference)


def test_token_differences_finds_the_first_differing_step():
    a = torch.tensor([[5, 6, 7], [1, 2, 3]])
    assert gpu.token_differences(a, a.clone()) == {
        "equal": True,
        "rows_differing": 0,
        "first_step_differing": None,
    }
    b = a.clone()
    b[1, 2] = 9
    assert gpu.token_differences(a, b) == {"equal": False, "rows_differing": 1, "first_step_differing": 2}
    # a response one step shorter differs at that step
    assert gpu.token_differences(a, a[:, :2]) == {
        "equal": False,
        "rows_differing": 2,
        "first_step_differing": 2,
    }


# -- run.py and report.py -----------------------------------------------------------------------


def _args(**extra) -> Namespace:
    return Namespace(**{"iters": 3, "threads": 2, "quick": False, "skip_smollm2": True, **extra})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
@pytest.mark.slow
def test_without_cuda_the_section_is_one_line_and_a_skipped_key(tmp_path, monkeypatch, capsys):
    machine = {"gflops": [1.0], "gflops_max": 1.0, "gflops_median": 1.0, "maxrss_mb": 1.0}
    monkeypatch.setattr(run, "machine_section", lambda runner, threads, reps: machine)
    out = tmp_path / "make_bench.json"
    assert run.main(["--only", "gpu", "--out", str(out)]) == 0  # the real CUDA check, in a subprocess
    printed = capsys.readouterr().out
    assert printed.count("GPU section skipped: no CUDA device") == 1
    assert json.loads(out.read_text())["gpu"]["skipped"].startswith("no CUDA device")


class FakeRunner:
    """Stands in for run.Runner on a CUDA machine: records the commands, answers with canned results."""

    python = sys.executable

    def __init__(self, ppo_result: dict):
        self.commands: list[list[str]] = []
        self.ppo_result = ppo_result

    def module(self, name: str, *args: str) -> list[str]:
        return [self.python, "-m", name, *args]

    def run(self, label: str, cmd: list[str]) -> dict:
        self.commands.append(cmd)
        if "info" in cmd:
            return {
                "cuda": True,
                "name": "Fake GPU",
                "matmul_gflops": {"float32": 1000.0, "bfloat16": 4000.0},
            }
        workload = cmd[cmd.index("--workload") + 1]
        return {**self.ppo_result, "workload": workload, "dtype": cmd[cmd.index("--dtype") + 1]}


def test_with_cuda_every_workload_runs_in_each_dtype_and_lands_in_the_table(capsys):
    phases = {"generate": 0.5, "score": 0.1, "forward": 0.1, "update": 0.2, "other": 0.1}
    ppo = {
        "s_per_iter_median": 1.0,
        "iterations_counted": 2,
        "phases_s": phases,
        "gflop_per_iter": {"generate": 1.0, "score": 1.0, "forward": 1.0, "update": 40.0},
        "peak_memory_mb": 512.0,
        "memory_kind": "cuda_allocated",
    }
    runner = FakeRunner(ppo)
    section = run.gpu_section(runner, _args())
    cases = [c for c in runner.commands if "ppo" in c]
    assert len(cases) == len(WORKLOADS) * len(gpu.DTYPES)
    assert {(c[c.index("--workload") + 1], c[c.index("--dtype") + 1]) for c in cases} == {
        (w.name, d) for w in WORKLOADS for d in gpu.DTYPES
    }
    assert all(c[c.index("--device") + 1] == "cuda" and c[c.index("--iters") + 1] == "3" for c in cases)
    # the peer script pins the CPU: TRL is reported as not run, with what pins it
    if (Path(run.REPO).parent / "shared" / "bench" / "peer").is_dir():
        assert "CUDA" in section["trl_skipped"] and "use_cpu=True" in section["trl_skipped"]
    meta = {
        "date": "d",
        "threads": 2,
        "cores": 2,
        "total_s": 1.0,
        "load_average_1min": {"mean": 0, "min": 0, "max": 0},
    }
    raw = {"machine": [{"gflops": [1.0], "gflops_max": 1.0, "gflops_median": 1.0}], "gpu": section}
    results = summarize(raw, meta)
    rows = results["gpu"]["ppo"]
    by_key = {(r["workload"], r["dtype"]): r for r in rows}
    # update: 40 GFLOP in 0.2 s = 200 GFLOP/s, against the dtype's matmul rate
    assert by_key[("small-4x4", "float32")]["fraction_of_peak"]["update"] == pytest.approx(200 / 1000)
    assert by_key[("small-4x4", "bfloat16")]["fraction_of_peak"]["update"] == pytest.approx(200 / 4000)
    print_report(results)
    printed = capsys.readouterr().out
    assert "5. On the GPU: Fake GPU" in printed
    for w in WORKLOADS:
        assert any(line.split()[:2] == [w.name, "bfloat16"] for line in printed.splitlines())


def test_the_smollm2_case_without_a_model_runs_its_shape_with_random_weights_at_the_rollout_asked(
    monkeypatch, capsys
):
    """No --model: SmolLM2's shape with random weights (a GPU machine without the weights), here
    shrunk to keep the test small; --batch-size / --response-length set the rollout (the issue's 32 x 64)."""
    from bench.memory import gpu_memory

    tiny = dict(hidden_size=32, num_layers=2, num_heads=4, kv_heads=2, intermediate_size=64, vocab=4096)
    monkeypatch.setitem(gpu_memory.SHAPES, "smollm2", tiny)
    argv = ["bench.speed.gpu", "ppo", "--workload", "smollm2-1x1", "--device", "cpu", "--iters", "2"]
    monkeypatch.setattr(sys, "argv", [*argv, "--batch-size", "3", "--response-length", "5"])
    gpu.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["workload"] == "smollm2-1x1" and result["weights"] == "random"
    assert result["rollout_BL"] == [3, 5]
    assert all(shape[0] == 3 and shape[2] == 5 for shape in result["shapes_BPT"])  # no EOS stop


# -- on a CUDA GPU ---------------------------------------------------------------------------------


@needs_cuda
def test_on_cuda_the_iteration_reports_device_memory_and_greedy_tokens_match(tiny_lm):
    result = gpu.ppo_iteration(TINY, "cuda", "bfloat16", iters=2, warmup=1)
    assert result["device"].startswith("cuda") and result["memory_kind"] == "cuda_allocated"
    assert result["peak_memory_mb"] > 0
    for row in result["phases_per_iteration_s"]:
        assert 0.5 * row["wall"] <= sum(row[p] for p in PHASES) <= row["wall"]
    tokenizer, prompts, model = tiny_lm
    import copy

    sampled = gpu.sampler_vs_generate(
        copy.deepcopy(model), tokenizer, prompts, "cuda", "float32", (4,), new_tokens=8, reps=1
    )
    assert sampled["greedy_tokens"]["equal"] and sampled["memory_kind"] == "cuda_allocated"
    assert all(rate > 0 for rate in gpu.matmul_rates("cuda", size=512, reps=2).values())


def test_gpu_blockers_name_what_pins_the_peer_script_to_the_cpu(tmp_path):
    from bench.speed.peer import gpu_blockers

    repo = tmp_path / "repo"
    repo.mkdir()
    assert "absent" in gpu_blockers(repo)[0]
    peer = tmp_path / "shared" / "bench" / "peer"
    peer.mkdir(parents=True)
    (peer / "setup.sh").write_text('pip install torch\nassert "+cpu" in torch.__version__\n')
    (peer / "trl_ppo_bench.py").write_text(
        'os.environ["CUDA_VISIBLE_DEVICES"] = ""\ncfg(use_cpu=True, bf16=False)\n'
    )
    assert gpu_blockers(repo) == [
        "trl_ppo_bench.py hides every CUDA device",
        "trl_ppo_bench.py passes use_cpu=True to PPOConfig",
        "trl_ppo_bench.py fixes bf16=False (float32 only)",
        "setup.sh installs and asserts the CPU build of torch",
        "trl_ppo_bench.py has no --device option",
    ]
    (peer / "setup.sh").write_text("pip install torch\n")
    (peer / "trl_ppo_bench.py").write_text('p.add_argument("--device")\ncfg(bf16=args.bf16)\n')
    assert gpu_blockers(repo) == []
