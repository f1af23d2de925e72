"""bench/studies/demo_paired.py: final figures of two demo runs, paired by seed, checked by hand."""

from __future__ import annotations

import json

import pytest

from bench.studies.demo_paired import compare, main


def demo_dir(tmp_path, name: str, golds: list[float], kls: list[float], collapsed: list[bool]):
    runs = [
        {
            "algorithm": "apa",
            "seed": seed,
            "final": {"gold": gold, "proxy": 1.0, "kl": kl, "ppl": 5.0, "distinct2": 0.3},
            "peak_gold": gold + 1.0,
            "collapse_detected": flag,
        }
        for seed, (gold, kl, flag) in enumerate(zip(golds, kls, collapsed))
    ]
    runs.append({**runs[0], "algorithm": "awr", "final": {**runs[0]["final"], "gold": 99.0}})  # not paired
    directory = tmp_path / name
    directory.mkdir()
    (directory / "summary.json").write_text(
        json.dumps({"sft": {"gold_mean": 1.0, "gold_std": 2.0}, "runs": runs})
    )
    return directory


def test_paired_differences_in_sft_standard_deviations(tmp_path, capsys):
    base = demo_dir(tmp_path, "base", [3.0, 5.0, 4.0], [2.0, 2.0, 2.0], [False, False, False])
    other = demo_dir(tmp_path, "other", [1.0, 4.0, 1.0], [9.0, 5.0, 4.0], [True, False, True])
    result = compare(base, [other], "apa")
    # gold gains (gold - 1) / 2: base 1.0, 2.0, 1.5; other 0.0, 1.5, 0.0; paired -1.0, -0.5, -1.5
    assert result["runs"]["base"]["gold_gain"]["mean"] == pytest.approx(1.5)
    gain = result["vs_base"]["other"]["gold_gain"]
    assert gain["mean"] == pytest.approx(-1.0)
    half = 4.303 * 0.5 / 3**0.5  # t(2) x sd / sqrt(3)
    assert gain["ci95"] == pytest.approx([-1.0 - half, -1.0 + half])
    assert gain["verdict"] == "no measurable effect"  # the interval [-2.24, +0.24] holds 0
    assert result["vs_base"]["other"]["kl"]["mean"] == pytest.approx(4.0)
    assert result["runs"]["other"]["collapse"] == "2/3"
    assert main([str(base), str(other), "--algorithm", "apa", "--json", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    # other's gains 0, 1.5, 0: mean 0.5, sd 0.866, t(2) half-width 2.15
    assert "| other | +0.50 [-1.65, +2.65] | -1.00 [-2.24, +0.24] |" in out
    assert json.loads((tmp_path / "o.json").read_text())["algorithm"] == "apa"


def test_an_algorithm_without_runs_stops_with_its_name(tmp_path):
    base = demo_dir(tmp_path, "base", [3.0], [2.0], [False])
    with pytest.raises(SystemExit, match="has no run of 'grpo'"):
        compare(base, [base], "grpo")
    with pytest.raises(SystemExit, match="must have different names"):
        compare(base, [base], "apa")
