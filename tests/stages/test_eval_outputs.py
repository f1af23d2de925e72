"""`rlhf eval` and `rlhf rm-eval` on the recipe's terms: a result of another data file (or,
for eval, another baseline) is never replaced without --out; several judges score the same answers,
each as a single-judge eval would; the samples show the prompt as the models saw it; the share of
truncated prompts is reported."""

from __future__ import annotations

import json

import pytest
import torch

from rlhf.cli import main
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm
from tests.support.cli_data import pair_rows, save_tiny_base, write_jsonl

torch.set_num_threads(1)  # tiny models: one thread is fastest

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("evalout")
    tok = save_tiny_base(root / "policy", WORDS)
    tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(root / "baseline")
    tok.save_pretrained(root / "baseline")
    for seed, name in ((2, "judge1"), (3, "judge2")):
        lm = tiny_causal_lm(tok, seed=seed, hidden_size=32, num_layers=1, num_heads=2)
        ScalarHeadModel.from_causal_lm(lm, head_init_std=0.5).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    pairs = pair_rows(WORDS, n=6)
    prompts = [{"prompt": "a b c d e f"}, {"prompt": "g h"}, {"prompt": "i j k l m"}]
    return {
        "root": root,
        "prompts": write_jsonl(root / "prompts.jsonl", prompts),
        "other_prompts": write_jsonl(root / "other_prompts.jsonl", prompts[:2]),
        "pairs": write_jsonl(root / "pairs.jsonl", pairs),
        "other_pairs": write_jsonl(root / "other_pairs.jsonl", pairs[:3]),
    }


def eval_args(setup, *extra, judges=("judge1",), baseline="baseline", prompts="prompts"):
    root = setup["root"]
    args = ["eval", "--policy", str(root / "policy"), "--baseline", str(root / baseline),
            "--prompts", setup[prompts], "--max-new-tokens", "3", "--max-prompt-tokens", "4", "--seed", "0"]  # fmt: skip
    for judge in judges:
        args += ["--judge", str(root / judge)]
    return [*args, *extra]


def test_several_judges_score_the_same_answers_as_single_judge_evals(setup, tmp_path):
    assert main(eval_args(setup, "--out", str(tmp_path / "both.json"), judges=("judge1", "judge2"))) == 0
    both = json.loads((tmp_path / "both.json").read_text())
    assert list(both["judges"]) == [str(setup["root"] / "judge1"), str(setup["root"] / "judge2")]
    for judge in ("judge1", "judge2"):
        assert main(eval_args(setup, "--out", str(tmp_path / f"{judge}.json"), judges=(judge,))) == 0
        alone = json.loads((tmp_path / f"{judge}.json").read_text())
        figures = both["judges"][str(setup["root"] / judge)]
        for key in ("policy", "baseline", "comparison", "length", "judge"):
            assert figures[key] == alone[key], (judge, key)
        assert [s["policy_response"] for s in alone["samples"]] == [
            s["policy_response"] for s in both["samples"]
        ]
    first = json.loads((tmp_path / "judge1.json").read_text())
    assert {k: both[k] for k in ("policy", "comparison", "judge")} == {
        k: first[k] for k in ("policy", "comparison", "judge")
    }


def test_eval_samples_show_the_prompt_as_seen_and_the_truncated_share(setup, tmp_path, capsys):
    assert main(eval_args(setup, "--out", str(tmp_path / "e.json"))) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    # a 4-token budget: "a b c d e f" keeps its last 4 words, "g h" is whole, "i j k l m" its last 4
    assert [s["prompt_seen"] for s in result["samples"]] == ["c d e f", "g h", "j k l m"]
    assert [s["prompt"] for s in result["samples"]] == ["a b c d e f", "g h", "i j k l m"]
    assert result["truncation"]["prompts_truncated"] == 2
    assert result["truncation"]["prompts_truncated_share"] == pytest.approx(2 / 3)
    assert "2/3 (66.7%)" in capsys.readouterr().out


def test_eval_without_out_refuses_to_replace_a_result_of_other_prompts_or_baseline(setup, capsys):
    written = setup["root"] / "policy" / "eval.json"
    written.unlink(missing_ok=True)
    assert main(eval_args(setup)) == 0
    first = written.read_text()
    for extra in ({"prompts": "other_prompts"}, {"baseline": "policy"}):
        assert main(eval_args(setup, **extra)) == 2, extra
        err = capsys.readouterr().err
        assert str(written) in err and "Fix: --out" in err and "Traceback" not in err, err
        assert written.read_text() == first  # untouched
    err_other = "eval_other_prompts_vs_baseline.json"
    assert main(eval_args(setup, prompts="other_prompts")) == 2
    assert err_other in capsys.readouterr().err  # the fix names an output of its own
    assert main(eval_args(setup, "--n", "2")) == 0  # the same prompts and baseline: replaced
    assert json.loads(written.read_text())["comparison"]["n"] == 2


def test_rm_eval_without_out_refuses_to_replace_a_result_of_another_data_file(setup, capsys):
    judge = setup["root"] / "judge1"
    written = judge / "rm_eval.json"
    written.unlink(missing_ok=True)
    base = ["rm-eval", "--reward-model", str(judge)]
    assert main([*base, "--data", setup["pairs"]]) == 0
    first = written.read_text()
    assert main([*base, "--data", setup["other_pairs"]]) == 2
    err = capsys.readouterr().err
    assert str(written) in err and setup["pairs"] in err and "rm_eval_other_pairs.json" in err, err
    assert written.read_text() == first
    other = judge / "rm_eval_other_pairs.json"
    assert main([*base, "--data", setup["other_pairs"], "--out", str(other)]) == 0
    assert json.loads(other.read_text())["n"] == 3
    assert main([*base, "--data", setup["pairs"], "--n", "2"]) == 0  # the same data: replaced
    assert json.loads(written.read_text())["n"] == 2


def test_the_report_shows_every_judges_win_rate(setup, tmp_path):
    from rlhf.monitor.html_parts import fmt
    from rlhf.monitor.run_report import _evaluation

    assert main(eval_args(setup, "--out", str(tmp_path / "both.json"), judges=("judge1", "judge2"))) == 0
    both = json.loads((tmp_path / "both.json").read_text())
    html = _evaluation(both)
    second = both["judges"][str(setup["root"] / "judge2")]["comparison"]
    assert f"judge {setup['root'] / 'judge2'}</b>: win rate of the policy" in html
    low, high = second["win_rate_ci95"]  # as the report writes numbers (3 significant digits)
    assert f"{fmt(second['win_rate'], 3)} [{fmt(low, 3)}, {fmt(high, 3)}]" in html
    assert "prompt_seen" in html  # the samples' column of the prompt as the models saw it
