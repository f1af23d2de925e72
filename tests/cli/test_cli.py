"""`rlhf` end to end, in-process: sft -> rm -> train -> resume -> eval on tiny models and files.

Each stage is `rlhf.cli.main([...])`, as a user would type it; the run directories are checked for
their contract (config.yaml, metrics.jsonl with `step`/`iteration` keys, loadable models).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlhf.cli import STAGES, main
from rlhf.config import RLConfig, config_from_yaml
from rlhf.models.loading import load_causal_lm
from rlhf.models.scalar_head import ScalarHeadModel
from tests.support.cli_data import pair_rows, save_tiny_base, sft_rows, write_jsonl

torch.set_num_threads(1)  # tiny models: one thread is fastest, and far faster on a busy machine

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
TINY_TRAIN = [
    "--train.iterations", "2", "--rollout.batch_size", "4", "--rollout.max_new_tokens", "4",
    "--train.micro_batch_size", "4", "--critic.pretrain_iterations", "1", "--checkpoint.every", "1",
    "--policy_optim.lr", "0.001", "--log.sinks", "jsonl",
]  # fmt: skip


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def metric_rows(run: Path) -> list[dict]:
    """Iteration and pre-training records without time/throughput keys (equal across resumes)."""
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
        for r in records(run)
        if "event" not in r
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    save_tiny_base(root / "base", WORDS)
    sft, pairs = sft_rows(WORDS), pair_rows(WORDS)
    return {
        "root": str(root),
        "base": str(root / "base"),
        "sft": write_jsonl(root / "sft.jsonl", sft),
        "pairs": write_jsonl(root / "pairs.jsonl", pairs),
        "prompts": write_jsonl(root / "prompts.jsonl", [{"prompt": r["prompt"]} for r in pairs[:12]]),
        "test": write_jsonl(root / "test.jsonl", [{"prompt": r["prompt"]} for r in pairs[12:]]),
    }


@pytest.fixture(scope="module")
def runs(files) -> dict[str, Path]:
    """The whole pipeline once: sft, rm, a 2-iteration PPO-max run."""
    root = Path(files["root"]) / "runs"
    out = {name: root / name for name in ("sft", "rm", "ppo")}
    assert main(["sft", "--model", files["base"], "--data", files["sft"], "--out", str(out["sft"]),
                 "--train.max_steps", "3", "--train.batch_size", "4", "--train.eval_every", "2",
                 "--data.test_fraction", "0.25", "--sinks", "jsonl"]) == 0  # fmt: skip
    assert main(["rm", "--model", str(out["sft"]), "--data", files["pairs"], "--out", str(out["rm"]),
                 "--train.max_steps", "3", "--train.batch_size", "4", "--train.eval_every", "2",
                 "--data.test_fraction", "0.25", "--sinks", "jsonl"]) == 0  # fmt: skip
    assert main(train_args(files, out, out["ppo"])) == 0
    return out


def train_args(files, runs_or_out, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--preset", "ppo_max", "--policy", str(Path(files["root"]) / "runs" / "sft"),
        "--reward-model", str(Path(files["root"]) / "runs" / "rm"), "--prompts", files["prompts"],
        "--out", str(out), *TINY_TRAIN, *extra,
    ]  # fmt: skip


def test_help_lists_every_stage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    squeezed = "".join(capsys.readouterr().out.split())  # argparse wraps the descriptions
    for stage, description in STAGES.items():
        assert stage + "".join(description.split()) in squeezed
    assert main([]) == 0  # no stage: the help, exit 0
    assert "STAGE" in capsys.readouterr().out


@pytest.mark.slow
def test_each_stage_writes_its_run_directory(runs):
    for name, key in (("sft", "step"), ("rm", "step"), ("ppo", "iteration")):
        run = runs[name]
        assert (run / "config.yaml").is_file(), name
        rows = [r for r in records(run) if "event" not in r and "pretrain" not in r]
        assert rows and all(isinstance(r[key], int) for r in rows), name
    assert [r["iteration"] for r in metric_rows(runs["ppo"]) if "iteration" in r] == [0, 1]
    assert [r["pretrain"] for r in metric_rows(runs["ppo"]) if "pretrain" in r] == [0]
    assert load_causal_lm(runs["sft"]).config.vocab_size == load_causal_lm(runs["ppo"]).config.vocab_size
    ScalarHeadModel.from_pretrained(runs["rm"])
    ScalarHeadModel.from_pretrained(runs["ppo"] / "critic")
    config = config_from_yaml(RLConfig, runs["ppo"] / "config.yaml")
    assert (
        config.preset == "ppo_max"
        and config.train.iterations == 2
        and config.model.policy == str(runs["sft"])
    )


@pytest.mark.slow
def test_resume_extends_a_run_to_the_metrics_of_an_uninterrupted_one(files, runs, tmp_path):
    # a warmup over a fraction of the run (PPO-max's 10%) depends on the run's length, as a cosine
    # decay would: extending the run changes it, so this check holds the warmup fixed
    fixed = ["--policy_optim.warmup_fraction", "0", "--critic_optim.warmup_fraction", "0"]
    split, whole = tmp_path / "split", tmp_path / "whole"
    assert main(train_args(files, runs, split, *fixed)) == 0
    assert main(["train", "--resume", str(split), "--train.iterations", "4"]) == 0
    assert main(train_args(files, runs, whole, "--train.iterations", "4", *fixed)) == 0
    assert metric_rows(split) == metric_rows(whole)
    assert [r.get("iteration", r.get("pretrain")) for r in metric_rows(split)] == [0, 0, 1, 2, 3]
    assert config_from_yaml(RLConfig, split / "config.yaml").train.iterations == 4


@pytest.mark.slow
def test_resume_a_moved_run_directory(files, runs, tmp_path):
    original, moved = tmp_path / "original", tmp_path / "moved"
    assert main(train_args(files, runs, original)) == 0
    shutil.copytree(original, moved)
    shutil.rmtree(original)
    assert main(["train", "--resume", str(moved), "--train.iterations", "3"]) == 0
    assert [r["iteration"] for r in metric_rows(moved) if "iteration" in r] == [0, 1, 2]


@pytest.mark.slow
def test_eval_writes_win_tie_loss(files, runs, capsys):
    assert main(["eval", "--policy", str(runs["ppo"]), "--baseline", str(runs["sft"]), "--judge", str(runs["rm"]),
                 "--prompts", files["test"], "--n", "4", "--max-new-tokens", "4"]) == 0  # fmt: skip
    result = json.loads((runs["ppo"] / "eval.json").read_text())
    comparison = result["comparison"]
    assert comparison["n"] == 4
    assert comparison["win"] + comparison["tie"] + comparison["loss"] == pytest.approx(1.0)
    assert (
        0 <= comparison["win_rate_ci95"][0] <= comparison["win_rate"] <= comparison["win_rate_ci95"][1] <= 1
    )
    assert result["policy"]["n"] == result["baseline"]["n"] == 4
    assert "win / tie / loss" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_with_the_papers_sampling_records_it_and_refuses_a_second_temperature(
    files, runs, capsys, tmp_path
):
    base = ["eval", "--policy", str(runs["ppo"]), "--baseline", str(runs["sft"]), "--judge", str(runs["rm"]),
            "--prompts", files["test"], "--n", "2", "--max-new-tokens", "4"]  # fmt: skip
    assert main([*base, "--sampling", "paper", "--out", str(tmp_path / "eval.json")]) == 0
    sampling = json.loads((tmp_path / "eval.json").read_text())["sampling"]
    assert sampling == {"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.1, "do_sample": True}
    assert (
        main([*base, "--sampling", "paper", "--temperature", "0.5", "--out", str(tmp_path / "x.json")]) == 2
    )
    err = capsys.readouterr().err
    assert "rollout.sampling paper sets temperature 0.8" in err and "rollout.temperature is 0.5" in err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_eval_encodes_prompts_with_the_budget_the_policy_was_trained_with(
    files, runs, tmp_path, monkeypatch, capsys
):
    import rlhf.stages.eval as eval_stage

    budgets = []

    def spy(tokenizer, prompt, budget, **kwargs):
        budgets.append(budget)
        return encode_prompt(tokenizer, prompt, budget, **kwargs)

    encode_prompt = eval_stage.encode_prompt
    monkeypatch.setattr(eval_stage, "encode_prompt", spy)
    base = ["eval", "--policy", str(runs["ppo"]), "--baseline", str(runs["sft"]), "--judge", str(runs["rm"]),
            "--prompts", files["test"], "--n", "2", "--max-new-tokens", "2"]  # fmt: skip
    trained = config_from_yaml(RLConfig, runs["ppo"] / "config.yaml").data.max_prompt_tokens
    assert main([*base, "--out", str(tmp_path / "a.json")]) == 0
    assert budgets == [trained, trained]
    assert json.loads((tmp_path / "a.json").read_text())["max_prompt_tokens"] == trained
    budgets.clear()
    assert main([*base, "--max-prompt-tokens", "3", "--out", str(tmp_path / "b.json")]) == 0
    assert budgets == [3, 3] and json.loads((tmp_path / "b.json").read_text())["max_prompt_tokens"] == 3
    assert main([*base, "--max-prompt-tokens", "0", "--out", str(tmp_path / "c.json")]) == 2
    assert "data.max_prompt_tokens must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_eval_prompt_budget_of_a_model_without_a_run_config_is_512(tmp_path):
    from rlhf.config import EvalConfig, EvalDataConfig
    from rlhf.stages.eval import eval_prompt_budget

    def budget(given):
        return eval_prompt_budget(
            EvalConfig(policy=str(tmp_path), data=EvalDataConfig(max_prompt_tokens=given))
        )

    assert budget(None) == 512
    (tmp_path / "config.yaml").write_text("data: [not, a, mapping]\n")
    assert budget(None) == 512
    (tmp_path / "config.yaml").write_text("data: {max_prompt_tokens: 40}\n")
    assert budget(None) == 40
    assert budget(7) == 7


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kl.betta", "0.1"], "command line: unknown key 'kl.betta'. Did you mean 'kl.beta'?"),
        (["--train.iterations", "ten"], "train.iterations must be an integer >= 0, got 'ten'"),
        (["--kl.estimator", "k4"], "kl.estimator must be one of 'k1', 'k2', 'k3', got 'k4'"),
        (["--preset", "ppo_min"], "unknown preset 'ppo_min'"),
    ],
)
def test_train_config_errors_exit_2_naming_the_key(flags, message, files, tmp_path, capsys):
    args = ["train", "--preset", "ppo_max", "--policy", "p", "--reward-model", "r", "--prompts", files["prompts"],
            "--out", str(tmp_path / "x"), *flags]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhf train: ") and message in err
    assert not (tmp_path / "x").exists()  # stopped before writing anything


def test_sft_config_error_suggests_the_key(files, capsys):
    assert main(["sft", "--model", files["base"], "--data", files["sft"], "--train.epoch", "2"]) == 2
    assert "unknown key 'train.epoch'. Did you mean 'train.epochs'?" in capsys.readouterr().err


@pytest.mark.slow
def test_train_into_a_used_run_directory_exits_2_with_the_fix(files, runs, capsys):
    before = (runs["ppo"] / "metrics.jsonl").read_text()
    assert main(train_args(files, runs, runs["ppo"])) == 2
    err = capsys.readouterr().err
    assert (
        f"run directory {runs['ppo']} already has metrics.jsonl: use --resume {runs['ppo']} or another --out"
        in err
    )
    assert (runs["ppo"] / "metrics.jsonl").read_text() == before


def test_data_check_names_the_bad_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a b", "response": "c"}\n{"prompt": "a b"\n')
    assert main(["data", "check", str(bad)]) != 0
    assert f"{bad}:2" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a b", "response": "c"}\n')
    assert main(["data", "check", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
