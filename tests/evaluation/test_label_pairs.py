"""The verdict of held-out human labels (rlhf/evaluation/label_pairs.py, `rlhf eval --pairs`,
docs/algorithms.md §38), against plain loops: the summed log-probs of a pair's responses one token at
a time, one pair at a time and unpadded; the share of pairs whose chosen log-ratio beats the rejected
one's, ties half."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.evaluation.judging import wilson_interval
from rlhf.evaluation.label_pairs import label_pair_verdict, pair_logprobs
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
from tests.support.cli_data import write_jsonl
from tests.support.reliability_testing import InProcess

WORDS = "a b c d e f g h i j k l t".split()


def plain_logprob(model, prompt: list[int], response: list[int]) -> float:
    """sum_t log p(response[t] | prompt + response[:t]): one unpadded row, one position at a time."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    total = 0.0
    for t, token in enumerate(response):
        position = len(prompt) + t - 1  # the logits that predict response[t]
        total += float(torch.log_softmax(logits[position], -1)[token])
    return total


def plain_verdict(pc, pr, bc, br) -> dict:
    wins = ties = 0
    margins = []
    for a, b, c, d in zip(pc, pr, bc, br):
        m = (a - c) - (b - d)
        margins.append(m)
        wins += m > 0
        ties += m == 0
    n = len(margins)
    return {"accuracy": (wins + ties / 2) / n, "wins": wins, "ties": ties, "margin_mean": sum(margins) / n}


@pytest.fixture(scope="module")
def tiny():
    tok = word_tokenizer([" ".join(WORDS)])
    policy = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    baseline = tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2)
    gen = torch.Generator().manual_seed(0)
    ids = list(range(4, len(tok)))  # word ids (0-3: pad, unk, bos, eos)

    def seq(k):
        return [ids[int(i)] for i in torch.randint(len(ids), (k,), generator=gen)]

    # prompts and responses of different lengths (padding in every batch), responses end with EOS
    pairs = [(seq(1 + i % 4), seq(1 + i % 3) + [tok.eos_token_id], seq(2 + i % 5) + [tok.eos_token_id])
             for i in range(7)]  # fmt: skip
    return tok, policy, baseline, pairs


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_pair_logprobs_are_the_plain_loops_at_any_padding(tiny, batch_size):
    tok, policy, _, pairs = tiny
    chosen, rejected = pair_logprobs(policy, *map(list, zip(*pairs)), tok.pad_token_id, batch_size=batch_size)
    assert chosen.dtype == torch.float64 and len(chosen) == len(pairs)
    for i, (prompt, c, r) in enumerate(pairs):
        assert chosen[i].item() == pytest.approx(plain_logprob(policy, prompt, c), abs=1e-4)
        assert rejected[i].item() == pytest.approx(plain_logprob(policy, prompt, r), abs=1e-4)


def test_the_verdict_is_the_plain_count_with_ties_half():
    gen = torch.Generator().manual_seed(3)
    pc, pr, bc, br = (torch.randn(40, generator=gen, dtype=torch.float64) for _ in range(4))
    bc[:5], br[:5] = pc[:5], pr[:5]  # five exact ties: m = 0 (the policy is the baseline there)
    pc[5] = pr[5] = bc[5] = br[5] = -3.0
    result = label_pair_verdict(pc, pr, bc, br, [2] * 40, [3] * 40)
    plain = plain_verdict(pc.tolist(), pr.tolist(), bc.tolist(), br.tolist())
    assert result["ties"] == plain["ties"] >= 6
    assert result["wins"] == plain["wins"]
    assert result["losses"] == 40 - plain["wins"] - plain["ties"]
    assert result["accuracy"] == pytest.approx(plain["accuracy"])
    assert result["ci95"] == pytest.approx(wilson_interval(plain["wins"] + plain["ties"] / 2, 40))
    assert result["margin_mean"] == pytest.approx(plain["margin_mean"])
    margins = [(a - c) - (b - d) for a, b, c, d in zip(pc.tolist(), pr.tolist(), bc.tolist(), br.tolist())]
    std = math.sqrt(sum((m - plain["margin_mean"]) ** 2 for m in margins) / 39)
    half = 1.96 * std / math.sqrt(40)
    assert result["margin_ci95"] == pytest.approx([plain["margin_mean"] - half, plain["margin_mean"] + half])
    assert result["chosen_logratio_mean"] == pytest.approx(float((pc - bc).mean()))
    assert result["rejected_logratio_mean"] == pytest.approx(float((pr - br).mean()))
    per_token = [
        (a - c) / 2 - (b - d) / 3 for a, b, c, d in zip(pc.tolist(), pr.tolist(), bc.tolist(), br.tolist())
    ]
    expected = (sum(m > 0 for m in per_token) + sum(m == 0 for m in per_token) / 2) / 40
    assert result["per_token_accuracy"] == pytest.approx(expected)


def test_one_pair_and_bad_inputs():
    one = label_pair_verdict([-1.0], [-2.0], [-1.5], [-1.5])  # chosen up 0.5, rejected down 0.5
    assert (one["n"], one["wins"], one["accuracy"], one["margin_mean"]) == (1, 1, 1.0, 1.0)
    assert one["margin_ci95"] == [1.0, 1.0] and one["ci95"] == wilson_interval(1, 1)
    assert "per_token_accuracy" not in one
    with pytest.raises(ValueError, match="policy rejected log-prob of pair 1 is nan"):
        label_pair_verdict([0.0, 0.0], [0.0, math.nan], [0.0, 0.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="equally long"):
        label_pair_verdict([0.0], [0.0, 1.0], [0.0], [0.0])


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    tok, policy, baseline, pairs = tiny
    root = tmp_path_factory.mktemp("label_pairs")
    for name, model in (("policy", policy), ("baseline", baseline)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rows = [
        {"prompt": tok.decode(p), "chosen": tok.decode(c[:-1]), "rejected": tok.decode(r[:-1])}
        for p, c, r in pairs
    ]
    return root, rows, write_jsonl(root / "pairs.jsonl", rows)


def test_rlhf_eval_pairs_is_the_plain_loop_and_a_policy_equal_to_its_baseline_scores_half(
    saved, tiny, capsys
):
    root, rows, pairs_file = saved
    tok, policy, baseline, _ = tiny
    out = root / "eval.json"
    run = InProcess(capsys, "eval", "--policy", root / "policy", "--baseline", root / "baseline",
                    "--pairs", pairs_file, "--out", out, "--chat-template", "false")  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["judge"] is None and result["pairs"]["n"] == len(rows) == result["pairs"]["pairs_read"]
    logps = {}
    for name, model in (("policy", policy), ("baseline", baseline)):
        logps[name] = [
            [plain_logprob(model, tok(r["prompt"])["input_ids"], tok(r[side])["input_ids"] + [tok.eos_token_id])
             for r in rows]
            for side in ("chosen", "rejected")
        ]  # fmt: skip
    plain = plain_verdict(*logps["policy"], *logps["baseline"])
    pairs = result["pairs"]
    assert pairs["accuracy"] == pytest.approx(plain["accuracy"])
    assert pairs["margin_mean"] == pytest.approx(plain["margin_mean"], abs=1e-4)
    for i, row in enumerate(pairs["per_pair"]):
        assert row["chosen_logratio"] == pytest.approx(
            logps["policy"][0][i] - logps["baseline"][0][i], abs=1e-4
        )
    assert "held-out human labels" in run.stdout

    same = root / "same.json"
    run = InProcess(capsys, "eval", "--policy", root / "policy", "--baseline", root / "policy",
                    "--pairs", pairs_file, "--out", same, "--chat-template", "false", "--pairs-n", "5")  # fmt: skip
    assert run.returncode == 0, run.stderr
    pairs = json.loads(same.read_text())["pairs"]
    assert (pairs["n"], pairs["ties"], pairs["accuracy"], pairs["margin_mean"]) == (5, 5, 0.5, 0.0)
    assert pairs["ci95"] == pytest.approx(wilson_interval(2.5, 5))


def test_a_bad_pairs_file_exits_2_naming_its_line_or_is_skipped_and_counted(saved, capsys):
    root, rows, _ = saved
    bad = write_jsonl(root / "bad.jsonl", [rows[0], {"prompt": "a b", "chosen": "c"}, rows[1]])
    args = ["eval", "--policy", root / "policy", "--baseline", root / "baseline", "--pairs", bad,
            "--chat-template", "false", "--out", root / "bad_eval.json"]  # fmt: skip
    run = InProcess(capsys, *args)
    assert run.returncode == 2
    assert f"{bad}:2" in run.stderr and "rejected" in run.stderr, run.stderr
    run = InProcess(capsys, *args, "--skip-invalid")
    assert run.returncode == 0, run.stderr
    pairs = json.loads((root / "bad_eval.json").read_text())["pairs"]
    assert (pairs["n"], pairs["pairs_read"], pairs["skipped_invalid"]) == (2, 2, 1)
    assert "bad.jsonl:2" in pairs["skipped_reasons"][0]


def test_a_judge_without_prompts_and_an_eval_without_prompts_or_pairs_exit_2(saved, capsys):
    root, _, pairs_file = saved
    run = InProcess(capsys, "eval", "--policy", root / "policy", "--baseline", root / "baseline",
                    "--pairs", pairs_file, "--judge", root / "baseline")  # fmt: skip
    assert run.returncode == 2 and "--prompts" in run.stderr and "drop --judge" in run.stderr
    run = InProcess(capsys, "eval", "--policy", root / "policy", "--baseline", root / "baseline")
    assert run.returncode == 2 and "--pairs FILE" in run.stderr


def test_one_eval_gives_the_win_rates_and_the_same_verdict_as_pairs_alone(saved, tiny, capsys):
    from rlhf.models.scalar_head import ScalarHeadModel

    root, rows, pairs_file = saved
    tok, _, _, _ = tiny
    judge = root / "judge"
    ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=2, hidden_size=16, num_layers=1, num_heads=2), head_init_std=0.5
    ).save_pretrained(judge)
    tok.save_pretrained(judge)
    prompts = write_jsonl(root / "prompts.jsonl", [{"prompt": r["prompt"]} for r in rows])
    common = [
        "eval",
        "--policy",
        root / "policy",
        "--baseline",
        root / "baseline",
        "--chat-template",
        "false",
    ]
    both, alone = root / "both.json", root / "alone.json"
    run = InProcess(capsys, *common, "--judge", judge, "--prompts", prompts, "--n", "4", "--max-new-tokens", "2",
                    "--pairs", pairs_file, "--out", both)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert InProcess(capsys, *common, "--pairs", pairs_file, "--out", alone).returncode == 0
    both_result, alone_result = json.loads(both.read_text()), json.loads(alone.read_text())
    assert both_result["comparison"]["n"] == 4 and len(both_result["samples"]) == 4
    for key in ("n", "accuracy", "ci95", "wins", "ties", "margin_mean", "per_token_accuracy"):
        assert both_result["pairs"][key] == pytest.approx(alone_result["pairs"][key]), key


def test_the_run_report_shows_the_verdict_of_an_eval_json():
    from rlhf.monitor.run_report import _evaluation

    html = _evaluation({"policy": {"path": "ppo"}, "baseline": {"path": "sft"}, "judge": None, "judges": {},
                        "pairs": {"n": 300, "accuracy": 0.6, "ci95": [0.54, 0.65], "margin_mean": 0.25}})  # fmt: skip
    assert "held-out human labels" in html and "0.600 [0.540, 0.650] of 300 pairs" in html
