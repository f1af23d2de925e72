"""bench/studies/ablation_worlds.py: one row per trick, the effect in each world, and whether verdicts agree."""

from __future__ import annotations

import json

from bench.studies.ablation_worlds import agreement, main


def ablation(seed: int, effects: dict[str, tuple[float, list[float] | None, str]], **world) -> dict:
    """An ablation.json whose variants have the given summary effects; each variant's runs are the
    full preset's (gold 1.0, 2.0) shifted by the effect's mean, so the pooled effect is known."""
    full_runs = [{"seed": 0, "gold_gain_end": 1.0}, {"seed": 1, "gold_gain_end": 2.0}]
    rows = [{"variant": "full", "runs": full_runs}]
    for name, (mean, ci, verdict) in effects.items():
        runs = [{"seed": r["seed"], "gold_gain_end": r["gold_gain_end"] + mean} for r in full_runs]
        summary = {"mean": mean, "ci95": ci, "verdict": verdict}
        rows.append({"variant": name, "runs": runs, "vs_full": {"gold_gain_end": summary}})
    return {"world": {"seed": seed, **world}, "variants": rows}


def test_agreement_of_verdicts():
    assert agreement(["no measurable effect", "no measurable effect"]) == "no effect on any"
    assert agreement(["lower", "lower", "lower"]) == "lower on every world"
    assert agreement(["lower", "no measurable effect"]) == "differs"
    assert agreement(["lower", "higher"]) == "differs"


def test_table_lines_up_each_trick_across_worlds(tmp_path, capsys):
    first = ablation(
        0, {"no_kl": (-0.5, [-0.8, -0.2], "lower"), "no_clip": (0.0, [-0.1, 0.1], "no measurable effect")}
    )
    second = ablation(
        1,
        {"no_kl": (-0.3, [-0.5, -0.1], "lower"), "no_clip": (0.4, [0.1, 0.7], "higher")},
        rm_scale_drift=0.05,
    )
    paths = []
    for i, a in enumerate((first, second)):
        paths.append(tmp_path / f"a{i}.json")
        paths[-1].write_text(json.dumps(a))
    assert main([str(p) for p in paths]) == 0
    out = capsys.readouterr().out
    assert "| trick switched | world seed 0 | world seed 1, drift + outliers | pooled | verdicts |" in out
    # pooled: the paired differences -0.5, -0.5, -0.3, -0.3: mean -0.4, t(3) half-width 0.184
    no_kl = "-0.50 [-0.80, -0.20] (lower) | -0.30 [-0.50, -0.10] (lower) | -0.40 [-0.58, -0.22] (lower)"
    assert f"| no_kl | {no_kl} | lower on every world |" in out
    # 0, 0, 0.4, 0.4: mean 0.2, half-width 0.367
    no_clip = "+0.00 [-0.10, +0.10] | +0.40 [+0.10, +0.70] (higher) | +0.20 [-0.17, +0.57]"
    assert f"| no_clip | {no_clip} | differs |" in out
    assert "| full |" not in out
