"""The self-contained HTML report and its figures."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

from rlhf.demo.report import OVERVIEW_PNG, SECTIONS, load_run, write_report
from rlhf.monitor import MetricsLogger, plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert('x')</script>"


def make_run(algorithm: str, seed: int, iterations: int = 30, *, full: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    evals = [
        {
            "iteration": i,
            "proxy": 0.1 * i + rng.normal(0, 0.1),
            "gold": np.sin(i / 10),
            "kl": 0.2 * i,
            "ppl": 3 - i / 30,
            "length": 20 + i / 3,
            "distinct2": 0.6 - i / 100,
        }
        for i in range(0, iterations + 1, 5)
    ]
    run = {"algorithm": algorithm, "seed": seed, "eval": evals}
    if full:
        run["metrics"] = [
            {
                "iteration": i,
                "reward/proxy_mean": i / 30,
                "kl/ref": i / 10,
                "policy_ppl": 3 - i / 40,
                "response_length": 20 + i / 4,
                "other": None,
            }
            for i in range(1, iterations + 1)
        ]
        run["reward_samples"] = [
            {"iteration": i, "scores": list(rng.normal(i / 10, 1, 16))} for i in range(1, iterations + 1, 3)
        ]
        run["samples"] = {
            "start": [{"prompt": "review of the <b>book</b> :", "response": EVIL, "proxy": 0.1, "gold": 0.2}],
            "end": [
                {
                    "prompt": [{"role": "user", "content": "hi & bye"}],
                    "response": "cozy cozy cozy",
                    "proxy": 1.5,
                    "gold": -0.7,
                }
            ],
        }
        run["warnings"] = [{"iteration": 20, "message": f"collapse {EVIL}"}] if algorithm == "ppo" else []
    return run


def make_summary(runs: list[dict]) -> dict:
    return {
        "world": {"name": "reviews", "vocabulary": 190},
        "sft": {"gold_mean": 0.1, "gold_std": 0.5, "proxy_mean": 0.2},
        "reward_model": {"label_accuracy": 0.82, "gold_accuracy": 0.9},
        "runs": [
            {
                "algorithm": run["algorithm"],
                "seed": run["seed"],
                "final": {
                    "proxy": 1.0 + run["seed"],
                    "gold": 2.0 * run["seed"],
                    "kl": 3.0,
                    "ppl": 2.0,
                    "length": 30.0,
                    "distinct2": 0.3,
                },
                "peak_gold": 0.9,
                "collapse_detected": bool(run.get("warnings")),
                "iterations": 30,
                "seconds": 12.5,
            }
            for run in runs
        ],
        "findings": [
            {"claim": "PPO-max keeps gold above SFT", "holds": True, "evidence": "+1.3 SFT-std"},
            {"claim": f"vanilla collapses {EVIL}", "holds": False, "evidence": "KL < 10"},
        ],
        "extra": {"ignored": 1},
    }


def images(page: str) -> list[bytes]:
    tags = re.findall(r"<img\b[^>]*>", page)
    sources = [re.search(r'src="([^"]*)"', tag).group(1) for tag in tags]
    assert all(src.startswith("data:image/png;base64,") for src in sources)
    blobs = [base64.b64decode(src.split(",", 1)[1]) for src in sources]
    assert all(blob.startswith(PNG_SIGNATURE) for blob in blobs)
    return blobs


def assert_self_contained(page: str) -> None:
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.IGNORECASE)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert "<script" not in page.lower()  # no scripts of its own, and every sample text escaped


def headings(page: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", page)


def test_two_algorithms_two_seeds_full_report(tmp_path):
    runs = [make_run(a, s) for a in ("ppo", "ppo_max") for s in (0, 1)]
    path = write_report(
        tmp_path / "out" / "report.html", make_summary(runs), runs, notes=["CPU run, <2 minutes"]
    )
    page = path.read_text()
    assert_self_contained(page)
    assert headings(page) == list(SECTIONS)
    blobs = images(page)
    assert len(blobs) == 4  # curves, training monitors, gold against KL, reward distribution
    assert (tmp_path / "out" / OVERVIEW_PNG).read_bytes() == blobs[0]
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "review of the &lt;b&gt;book&lt;/b&gt; :" in page and "user: hi &amp; bye" in page
    assert "CPU run, &lt;2 minutes" in page
    assert page.count('class="pass"') == 1 and page.count('class="fail"') == 1 and "(1/2 hold)" in page
    assert "82.0%" in page and "90.0%" in page and "0.1 ± 0.5" in page
    # final figures: mean ± sample std over the two seeds (proxy 1 and 2, gold 0 and 2), collapse 2/2 for ppo
    final = page.split("<h2>Final figures</h2>")[1].split("</section>")[0]
    ppo_row = re.search(r"<tr><td>ppo</td>.*?</tr>", final).group(0)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", ppo_row)
    assert cells[:4] == ["ppo", "2", "1.5 ± 0.71", "1 ± 1.4"]
    assert cells[-1] == "2/2"
    warnings = page.split("<h2>Collapse warnings</h2>")[1]
    assert warnings.count("collapse &lt;script&gt;") == 2  # one per ppo seed


def test_four_algorithms_three_seeds(tmp_path):
    runs = [make_run(a, s, iterations=20) for a in ("ppo", "ppo_max", "apa", "awr") for s in range(3)]
    page = write_report(tmp_path / "report.html", make_summary(runs), runs).read_text()
    assert headings(page) == list(SECTIONS)
    assert len(images(page)) == 4
    for algorithm in ("ppo_max", "apa", "awr"):
        assert f'<tr><td>{algorithm}</td><td class="num">3</td>' in page


def test_one_run_with_only_evaluations_still_renders(tmp_path):
    runs = [make_run("ppo_max", 0, full=False)]
    page = write_report(tmp_path / "report.html", {}, runs).read_text()
    assert_self_contained(page)
    assert headings(page) == list(SECTIONS)
    assert len(images(page)) == 2  # curves and gold against KL
    for note in (
        "No per-iteration training metrics recorded.",
        "No reward samples recorded.",
        "No sample responses recorded.",
        "No collapse warnings",
    ):
        assert note in page
    # the final figures come from the last evaluation when the summary has no "runs"
    final = page.split("<h2>Final figures</h2>")[1]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", re.search(r"<tr><td>ppo_max</td>.*?</tr>", final).group(0))
    assert (
        cells[:2] == ["ppo_max", "1"]
        and cells[3] == f"{np.sin(3.0):.4g}"
        and cells[4] == "6"
        and cells[-1] == "0/1"
    )


def test_runs_with_only_training_metrics_fall_back_to_them(tmp_path):
    run = make_run("ppo", 0)
    del run["eval"], run["reward_samples"], run["samples"]
    for record in run["metrics"]:
        record["eval/gold"] = record["iteration"] / 100
    page = write_report(tmp_path / "report.html", {"sft": {"gold_mean": 0.0}}, [run]).read_text()
    assert len(images(page)) == 3  # curves (from metrics), training monitors, gold against KL
    assert "No SFT or reward-model figures" not in page


def test_no_runs_renders_every_section_without_figures(tmp_path):
    page = write_report(tmp_path / "report.html", {}, [], title="empty <report>").read_text()
    assert headings(page) == list(SECTIONS)
    assert images(page) == []
    assert "<title>empty &lt;report&gt;</title>" in page
    assert not (tmp_path / OVERVIEW_PNG).exists()


def test_bad_arguments_are_named(tmp_path):
    runs = [make_run("ppo", 0, full=False)]
    with pytest.raises(TypeError, match="look swapped"):
        write_report(tmp_path / "r.html", runs, {})
    with pytest.raises(ValueError, match=r"runs\[1\].*'algorithm'"):
        write_report(tmp_path / "r.html", {}, [runs[0], {"seed": 1}])


def test_load_run_reads_a_logged_run_directory(tmp_path):
    with MetricsLogger(tmp_path, sinks=("jsonl",)) as logger:
        for i in range(1, 7):
            logger.log(
                i, {"reward/proxy_mean": i / 10, "kl/ref": i / 5, "policy_ppl": 3.0, "response_length": 20.0}
            )
            if i % 3 == 0:
                logger.log(i, {"eval/gold": i / 7, "eval/kl": i / 5, "eval/proxy": float("nan")})
        logger.warn("collapse suspected")
    run = load_run(tmp_path, "ppo", seed=3)
    assert run["algorithm"] == "ppo" and run["seed"] == 3
    assert len(run["metrics"]) == 8
    assert run["eval"] == [
        {
            "iteration": 3,
            "proxy": None,
            "gold": 3 / 7,
            "kl": 0.6,
            "ppl": None,
            "length": None,
            "distinct2": None,
        },
        {
            "iteration": 6,
            "proxy": None,
            "gold": 6 / 7,
            "kl": 1.2,
            "ppl": None,
            "length": None,
            "distinct2": None,
        },
    ]
    assert run["warnings"] == [{"iteration": 6, "message": "collapse suspected"}]
    page = write_report(tmp_path / "report.html", {}, [run]).read_text()
    assert len(images(page)) == 3


def test_aggregate_is_mean_min_max_over_the_union_of_iterations():
    series = [[(0, 1.0), (10, 3.0)], [(0, 5.0), (20, 7.0)], [(10, -1.0)]]
    band = plots.aggregate(series)
    assert band.x.tolist() == [0.0, 10.0, 20.0]
    assert band.mean.tolist() == [3.0, 1.0, 7.0]
    assert band.low.tolist() == [1.0, -1.0, 7.0]
    assert band.high.tolist() == [5.0, 3.0, 7.0]
    assert band.n.tolist() == [2, 2, 1]
    assert plots.aggregate([[], []]) is None


def test_curves_mark_warnings_with_vertical_lines_and_save_figure(tmp_path):
    band = plots.aggregate([[(0, 0.0), (10, 1.0)], [(0, 1.0), (10, 2.0)]])
    colors = plots.color_map(["ppo", "apa"])
    figure = plots.curves_figure(
        {"ppo": {"kl": band}, "apa": {"kl": band}}, [("kl", "KL"), ("gold", "gold")], colors, {"ppo": [7.0]}
    )
    kl_axis, gold_axis = figure.axes[:2]
    vertical = [line for line in kl_axis.lines if list(line.get_xdata()) == [7.0, 7.0]]
    assert len(vertical) == 1 and vertical[0].get_color() == colors["ppo"]
    assert len(kl_axis.collections) == 2  # a min-max band per algorithm (two seeds each)
    assert [text.get_text() for text in gold_axis.texts] == ["not recorded"]
    path = plots.save_figure(figure, tmp_path / "fig" / "curves.png")
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_the_page_opens_on_the_verdict_and_folds_the_settings(tmp_path):
    """The findings come first (before any settings table), then the final figures and the curves;
    the world's settings are the last section, inside <details>."""
    runs = [make_run("ppo", 0)]
    summary = {
        **make_summary(runs),
        "world": {f"key_{i}": i for i in range(45)},
        "findings": [{"claim": "PPO-max beats SFT on gold", "holds": True, "evidence": "+1.2"}],
    }
    page = write_report(tmp_path / "report.html", summary, runs).read_text()
    assert headings(page)[:3] == ["Findings", "Final figures", "Curves"] and headings(page)[-1] == "Settings"
    findings = page.split("<h2>Findings</h2>")[1].split("</section>")[0]
    assert "PPO-max beats SFT on gold" in findings and "key_0" not in findings
    settings = page.split("<h2>Settings</h2>")[1].split("</section>")[0]
    assert settings.startswith("<details><summary>World: 45 settings</summary>") and "key_44" in settings
    assert page.index("PPO-max beats SFT on gold") < page.index("key_0")
