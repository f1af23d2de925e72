"""bench/studies/ppo_vs_dpo.py: per-run figures read as the demo's equal_kl reads them, and the paired
difference PPO-max minus DPO, checked by hand on made-up demo outputs."""

from __future__ import annotations

import json

import pytest

from bench.studies.ppo_vs_dpo import aggregate, demo_command, finished, world_figures


def fake_demo(directory, world: int, finals: dict[tuple[str, int], float]) -> None:
    """A finished demo of PPO-max and DPO: each run's KL goes 0 -> 1 -> 3 with gold 1 -> 2 -> the final."""
    summary_runs, runs = [], []
    for (algorithm, seed), gold in finals.items():
        final = {"proxy": 2.0, "gold": gold, "kl": 3.0, "ppl": 5.0, "length": 9.0, "distinct2": 0.3}
        summary_runs.append(
            {"algorithm": algorithm, "seed": seed, "final": final, "peak_gold": gold, "seconds": 1.0,
             "collapse_detected": None if algorithm == "dpo" else False}
        )  # fmt: skip
        evals = [{"kl": 0.0, "gold": 1.0}, {"kl": 1.0, "gold": 2.0}, {"kl": 3.0, "gold": gold}]
        runs.append({"algorithm": algorithm, "seed": seed, "eval": evals})
    sft = {"gold_mean": 1.0, "gold_std": 2.0, "proxy_mean": 0.0}
    gains = {a: [g - 1.0 for (b, _), g in finals.items() if b == a] for a in ("ppo_max", "dpo")}
    at_kl = {a: [(2.0 + (g - 2.0) / 2) - 1.0 for (b, _), g in finals.items() if b == a] for a in gains}
    equal_kl = {
        a: {"gold_gain_end": {"mean": sum(gains[a]) / len(gains[a])},
            "gold_gain_at_kl": {"mean": sum(at_kl[a]) / len(at_kl[a])}, "kl_end": {"mean": 3.0}}
        for a in gains
    }  # fmt: skip
    directory.mkdir(parents=True)
    (directory / "summary.json").write_text(
        json.dumps(
            {
                "sft": sft,
                "reward_model": {},
                "runs": summary_runs,
                "seconds": 1.0,
                "equal_kl": {"kl_budget": 2.0, "algorithms": equal_kl},
            }
        )  # fmt: skip
    )
    (directory / "runs.json").write_text(json.dumps(runs))


def test_gains_at_the_end_and_at_kl_2_and_the_paired_difference(tmp_path):
    finals = {("ppo_max", 0): 5.0, ("ppo_max", 1): 6.0, ("dpo", 0): 4.0, ("dpo", 1): 4.0}
    fake_demo(tmp_path / "w0", 0, finals)
    figures, rows = world_figures(tmp_path / "w0", 0)
    assert figures["kl_budget"] == 2.0 and figures["sft"]["gold_mean"] == 1.0
    ppo0 = next(r for r in rows if (r["algorithm"], r["seed"]) == ("ppo_max", 0))
    assert ppo0["gold_gain_end"] == pytest.approx(4.0)
    assert ppo0["gold_gain_at_kl"] == pytest.approx(2.5)  # halfway from KL 1 (gold 2) to KL 3 (gold 5)
    assert ppo0["reached_kl_budget"] and ppo0["gold_gain_end_sft_std"] == pytest.approx(2.0)
    table = aggregate(rows)
    diff = table["ppo_max_minus_dpo"]
    assert diff["gold_gain_end"]["mean"] == pytest.approx(1.5)  # (5 - 4 + 6 - 4) / 2
    assert diff["gold_gain_at_kl"]["mean"] == pytest.approx(0.75)
    assert diff["kl_end"]["mean"] == 0.0 and diff["kl_end"]["verdict"] == "no measurable difference"
    assert table["dpo"]["reached_kl_budget"] == "2/2"


def test_a_world_counts_as_finished_only_for_the_same_command_and_every_seed(tmp_path):
    out = tmp_path / "w1"
    fake_demo(out, 1, {("ppo_max", 0): 5.0, ("dpo", 0): 4.0})
    command = demo_command(1, 1, out, [])
    assert command[:5] == ["rlhf", "demo", "--compare-only", "ppo_max,dpo", "--seeds"]
    assert not finished(out, command, 1)  # no marker: the bench did not run it
    (out / "ppo_vs_dpo_command.json").write_text(json.dumps(command))
    assert finished(out, command, 1)
    assert not finished(out, demo_command(1, 1, out, ["--iterations", "30"]), 1)
    assert not finished(out, command, 2)  # seed 1 missing


def test_any_pairs_of_algorithms_and_a_partial_study(tmp_path):
    """bench/studies/online_dpo_vs_dpo.py's use: three algorithms, differences to two of them; a pair
    without a common seed is left out."""
    rows = [
        {"world": 0, "seed": s, "algorithm": a, "gold_gain_end": g, "gold_gain_at_kl": g / 2, "kl_end": 1.0,
         "proxy_end": 0.0, "reached_kl_budget": True}
        for (a, s), g in {("online_dpo", 0): 3.0, ("online_dpo", 1): 5.0, ("dpo", 0): 1.0, ("dpo", 1): 2.0,
                          ("ppo_max", 2): 9.0}.items()
    ]  # fmt: skip
    table = aggregate(
        rows, ("online_dpo", "dpo", "ppo_max"), (("online_dpo", "dpo"), ("online_dpo", "ppo_max"))
    )
    diff = table["online_dpo_minus_dpo"]
    assert diff["gold_gain_end"]["mean"] == pytest.approx(2.5) and diff["gold_gain_at_kl"]["mean"] == 1.25
    assert diff["gold_gain_end"]["verdict"] in ("online DPO higher", "no measurable difference")
    assert "online_dpo_minus_ppo_max" not in table  # no seed ran both
    assert table["ppo_max"]["gold_gain_end"]["mean"] == 9.0
