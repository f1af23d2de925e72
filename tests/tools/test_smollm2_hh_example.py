"""examples/smollm2_hh: the data split keeps held-out prompts out of training, ppo.yaml is a valid
PPO-max config whose policy can move, and the summary reads GNU time's figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlhf.config import RLConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_hh"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"smollm2_hh_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def hh(question: str, chosen: str, rejected: str) -> dict:
    prompt = f"\n\nHuman: {question}"
    return {"chosen": f"{prompt}\n\nAssistant: {chosen}", "rejected": f"{prompt}\n\nAssistant: {rejected}"}


@pytest.fixture(scope="module")
def prepare():
    return load("prepare")


def rows() -> list[dict]:
    out = [hh(f"question {i % 40}", f"yes {i}", f"no {i}") for i in range(100)]  # 40 prompts, 2-3 pairs each
    out.append(hh("question 7", "", "no answer"))  # an empty chosen turn: dropped
    other = hh("question 8", "yes", "no")  # two conversations (the rejected one's prompt differs): dropped
    other["rejected"] = other["rejected"].replace("question 8", "question elsewhere")
    return [*out, other]


def test_held_out_prompts_never_reach_training_and_non_pairs_are_dropped(prepare):
    files = prepare.split(rows(), seed=0, heldout=10, eval_prompts=5, sft=20)
    train_prompts = {prepare.prompt_of(r) for r in files["rm_train"]}
    for name in ("rm_heldout", "eval_prompts"):
        assert not {prepare.prompt_of(r) for r in files[name]} & train_prompts, name
    assert len({prepare.prompt_of(r) for r in files["eval_prompts"]}) == len(files["eval_prompts"]) == 5
    assert 10 <= len(files["rm_heldout"]) <= 12  # whole prompt groups: up to one group over
    judge2 = {prepare.prompt_of(r) for r in files["rm2_train"]}
    assert judge2 and not judge2 & train_prompts  # judge 2 never sees a prompt of judge 1, DPO or PPO
    assert not judge2 & {prepare.prompt_of(r) for name in ("rm_heldout", "eval_prompts") for r in files[name]}
    assert abs(len(files["rm2_train"]) - len(files["rm_train"])) <= 3  # about as many pairs each
    names = ("rm_heldout", "eval_prompts", "rm_train", "rm2_train")
    every = {prepare.prompt_of(r) for name in names for r in files[name]}
    assert every == {prepare.prompt_of(r) for r in rows()}  # every prompt lands in one split
    assert all(r["chosen"].split("Assistant: ")[-1] for name in files for r in files[name])
    assert all(prepare.is_pair(r) for name in files for r in files[name])
    assert not any("question elsewhere" in r["rejected"] for name in files for r in files[name])
    assert files["sft"] == files["rm_train"][:20] and files["ppo_prompts"] == files["rm_train"]
    pool = files[
        "judge_pool"
    ]  # every training pair once, judge 1's and judge 2's interleaved by prompt group
    assert sorted(map(str, pool)) == sorted(map(str, files["rm_train"] + files["rm2_train"]))
    assert {prepare.prompt_of(r) for r in pool[: len(pool) // 2]} & judge2  # a prefix is no one judge's file


def test_the_split_is_fixed_by_the_seed(prepare):
    assert prepare.split(rows(), 0, 10, 5, 20) == prepare.split(rows(), 0, 10, 5, 20)
    assert (
        prepare.split(rows(), 0, 10, 5, 20)["rm_heldout"] != prepare.split(rows(), 1, 10, 5, 20)["rm_heldout"]
    )


def test_ppo_yaml_is_a_valid_config_whose_policy_can_move():
    config = load_config(RLConfig, preset="ppo_max", file=str(EXAMPLE / "ppo.yaml"))
    assert config.model.lora.enabled and config.policy_optim.lr >= 1e-5
    assert config.train.ppo_epochs * config.train.minibatches > 1  # the ratio leaves 1 after the first step
    assert config.kl.beta > 0 and config.reward.normalize  # still PPO-max


def test_stage_cost_reads_gnu_time(tmp_path):
    summarize = load("summarize")
    time_file = tmp_path / "rm.time"
    time_file.write_text(
        "\tUser time (seconds): 40.50\n\tSystem time (seconds): 1.50\n\tPercent of CPU this job got: 25%\n"
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.5\n\tMaximum resident set size (kbytes): 2097152\n"
    )
    assert summarize.stage_cost(time_file) == {
        "wall_s": 3723.5,
        "peak_rss_mib": 2048,
        "cpu_percent": 25,
        "cpu_s": 42.0,
    }
    assert summarize.stage_cost(tmp_path / "missing.time") is None


def test_summary_reads_every_judge_of_an_eval_and_a_logged_truncation(tmp_path):
    summarize = load("summarize")

    def judged(win_rate: float) -> dict:
        return {
            "policy": {"path": "ppo", "mean": 1.0},
            "baseline": {"path": "dpo", "mean": 0.5},
            "comparison": {
                "n": 2,
                "win_rate": win_rate,
                "win_rate_ci95": [0.1, 0.9],
                "win": 0.5,
                "tie": 0,
                "loss": 0.5,
            },
            "length": {
                "length_controlled": {"win_rate": 0.4, "win_rate_ci95": [0.2, 0.6]},
                "length_matched": {"n": 1},
            },
        }

    evaluation = {
        **judged(0.5),
        "judges": {"rm": judged(0.5), "rm2": judged(0.25)},
        "truncation": {"prompts": 2, "prompts_truncated": 1, "prompts_truncated_share": 0.5},
        "samples": [{"policy_response": "a b", "baseline_response": "a b c d"}] * 2,
    }
    figures = summarize.win_rates(evaluation)
    assert {name: j["win_rate"] for name, j in figures["judges"].items()} == {"rm": 0.5, "rm2": 0.25}
    assert figures["judges"]["rm2"]["length_controlled_win_rate"] == 0.4
    assert (figures["policy_words_mean"], figures["baseline_words_mean"]) == (2, 4)
    assert figures["prompts_truncated"] == {"prompts": 2, "truncated": 1, "share": 0.5}
    log = tmp_path / "sft.log"
    log.write_text("│ data/prompts                          │   400 │\n│ data/prompts_truncated                │   150 │\n"
                   "│ data/prompts_truncated_share          │ 0.375 │\n")  # fmt: skip
    assert summarize.logged_truncation(log) == {"prompts": 400, "truncated": 150, "share": 0.375}
    assert summarize.logged_truncation(tmp_path / "missing.log") is None
    assert figures["held_out_labels"] is None  # an eval without --pairs


def test_summary_reads_the_held_out_label_verdict_and_names_paths_relative_to_the_run(tmp_path):
    summarize = load("summarize")
    run = tmp_path / "run"
    evaluation = {
        "policy": {"path": str(run / "ppo")},
        "baseline": {"path": str(run / "sft")},
        "judge": None,
        "judges": {},
        "pairs": {
            "n": 300,
            "accuracy": 0.6,
            "ci95": [0.54, 0.65],
            "margin_mean": 0.3,
            "per_pair": [{}] * 300,
        },
    }
    figures = summarize.win_rates(evaluation, run)
    assert (figures["policy"], figures["baseline"], figures["judges"]) == ("ppo", "sft", {})
    verdict = figures["held_out_labels"]
    assert (verdict["n"], verdict["accuracy"], verdict["ci95"], verdict["margin_mean"]) == (
        300,
        0.6,
        [0.54, 0.65],
        0.3,
    )
    assert "per_pair" not in verdict
    assert summarize.relative("/elsewhere/rm", run) == "rm"


def test_every_judge_setting_of_the_curve_is_a_valid_rm_config(tmp_path):
    from types import SimpleNamespace

    from rlhf.config import ConfigError, RewardConfig, parse_overrides

    curve = load("judge_curve")
    for setting in curve.SETTINGS:
        command = curve.judge_command(
            ["rlhf"],
            tmp_path,
            tmp_path / "p.jsonl",
            tmp_path / "r",
            setting,
            SimpleNamespace(prompt_tokens=96),
        )
        dotted = command[2:]
        for named, key in (("--model", "--model"), ("--data", "--data.path"), ("--out", "--out")):
            dotted[dotted.index(named)] = key
        config = load_config(RewardConfig, overrides=parse_overrides(dotted))
        assert config.lora.enabled == (not setting.startswith("full")) and config.train.batch_size == 8
        assert config.train.epochs == (2 if setting.endswith("_2ep") else 1)
        assert config.train.lm_coef == (0 if setting == "lora_lm0" else 1)
    with pytest.raises(ConfigError, match="lora.r"):  # the check the settings pass: LoRA keys only with LoRA
        load_config(RewardConfig, overrides=parse_overrides(["--lora.enabled", "false", "--lora.r", "16"]))
