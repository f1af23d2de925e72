"""The benchmark's plumbing: workload shapes, subprocess runner, ratio of medians and targets."""

from __future__ import annotations

import random
import sys

import pytest

from bench.common import child_env, run_case
from bench.speed.report import summarize, vs_trl_rows
from bench.speed.workload import PROMPT_WORDS, SIZES, WORKLOADS, build_prompts, build_tokenizer


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_workload_vocabulary_and_prompts_have_the_peer_shapes(size):
    rng = random.Random(0)
    tokenizer, words = build_tokenizer(SIZES[size]["vocab"], rng)
    assert len(tokenizer) == SIZES[size]["vocab"]
    prompts = build_prompts(tokenizer, words, rng, count=50)
    lo, hi = PROMPT_WORDS
    assert all(lo <= len(p) <= hi for p in prompts)
    assert tokenizer.eos_token_id not in {t for p in prompts for t in p}


def test_run_case_reads_the_last_json_line_and_the_childs_peak_rss(tmp_path):
    code = "import json; x = bytearray(64 * 2**20); print('noise'); print(json.dumps({'ok': 1}))"
    result = run_case([sys.executable, "-c", code], env=child_env(1), cwd=str(tmp_path), timeout=60)
    assert result["ok"] == 1 and "error" not in result
    assert result["maxrss_mb"] >= 64  # the child's own peak, not the parent's


def test_run_case_reports_a_failure_with_stderr(tmp_path):
    code = "import sys; sys.exit('boom: bad thing')"
    result = run_case([sys.executable, "-c", code], env=child_env(1), cwd=str(tmp_path), timeout=60)
    assert "exit code 1" in result["error"] and "boom: bad thing" in result["error"]


def _ours(times, **extra):
    return {"iter_s": times, "maxrss_mb": 100.0, **extra}


def _trl(times, warmup=1):
    return {"iter_s": times, "warmup_iters": warmup, "maxrss_mb": 200.0}


def _raw(runs):
    return {
        "machine": [{"gflops": [100.0], "gflops_max": 100.0, "gflops_median": 90.0}],
        "vs_trl": {"runs": runs},
    }


def _meta():
    return {"date": "d", "threads": 2, "cores": 2, "total_s": 1.0, "load_average_1min": {}}


def test_speedup_is_the_ratio_of_medians_over_all_steady_iterations():
    runs = {w.name: {"ours": [], "trl": []} for w in WORKLOADS}
    # warm-up iterations (first of each run) are huge and must be dropped; a failed run is ignored
    runs["tiny-1x1"]["ours"] = [_ours([9.0, 1.0, 1.0]), _ours([9.0, 2.0, 4.0]), {"error": "x"}]
    runs["tiny-1x1"]["trl"] = [_trl([9.0, 3.0, 3.0]), _trl([9.0, 6.0, 3.0])]
    row = vs_trl_rows(_raw(runs)["vs_trl"], 100.0)[0]
    assert row["ours_s_per_iter"] == 1.5  # median of 1, 1, 2, 4
    assert row["trl_s_per_iter"] == 3.0  # median of 3, 3, 6, 3
    assert row["speedup"] == 2.0 and row["target_met"] is True
    assert row["ours_iterations"] == 4 and row["errors"] == ["x"]
    # per repetition: that repetition's TRL median over ours (3/1, then 4.5/3); None where a run failed
    assert row["speedup_per_repetition"] == [3.0, 1.5]
    runs["tiny-1x1"]["trl"].append(_trl([9.0, 2.0]))
    assert vs_trl_rows(_raw(runs)["vs_trl"], 100.0)[0]["speedup_per_repetition"] == [3.0, 1.5, None]
    empty = vs_trl_rows(_raw(runs)["vs_trl"], 100.0)[1]
    assert empty["speedup"] is None and empty["target_met"] is None


def test_summary_fractions_and_targets():
    phases = {f"{p}_s_median": 1.0 for p in ("generate", "score", "forward", "update")}
    gflops = {"generate_gflops": 10.0, "score_gflops": 20.0, "forward_gflops": 40.0, "update_gflops": 45.0}
    runs = {
        w.name: {"ours": [_ours([5.0, 1.0], **phases, **gflops)], "trl": [_trl([5.0, 1.2])]}
        for w in WORKLOADS
    }
    result = summarize(_raw(runs), _meta())
    assert result["matmul_gflops"] == 100.0
    row = result["vs_trl"][0]
    assert row["ours_fraction_of_peak"] == {"generate": 0.1, "scoring": 0.3, "update": 0.45}
    assert result["update_fraction_of_peak"]["small"] == 0.45
    met = {t["what"]: t["met"] for t in result["targets"]}
    assert met["tiny-1x1: ours vs TRL iterations/s"] is False  # 1.2x < 1.5x
    assert met["small: update FLOP/s / matmul rate"] is True
    assert result["peak_rss_mb"]["ours/tiny-1x1"] == 100.0 and result["peak_rss_mb"]["trl/small-4x4"] == 200.0
