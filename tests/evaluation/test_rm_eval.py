"""`rlhf rm-eval`: the pair statistics against closed forms and hand counts, a reward model whose
scores are known (a head reading marker tokens), and the command as a user runs it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from rlhf.cli import build_parser, main, rm_eval_config
from rlhf.evaluation import pair_stats
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.tiny import tiny_causal_lm
from rlhf.stages.rm_eval import run_rm_eval
from tests.support.train_testing import WORDS, write_jsonl

MARGINS = [2.0, 1.0, 0.5, -0.5, -1.0, 0.0]


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# -- statistics ----------------------------------------------------------------------------------
def test_accuracy_and_its_wilson_interval():
    stats = pair_stats.accuracy_stats(MARGINS)
    assert (stats["n"], stats["correct"], stats["ties"], stats["accuracy"]) == (6, 3, 1, 0.5)
    z, n, p = 1.96, 6, 0.5  # Wilson: (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert stats["accuracy_ci95"] == pytest.approx([centre - half, centre + half], abs=1e-12)
    eight_of_ten = pair_stats.accuracy_stats([1.0] * 8 + [-1.0] * 2)["accuracy_ci95"]
    assert eight_of_ten == pytest.approx([0.4902, 0.9433], abs=1e-4)  # the textbook value


def test_margin_quantiles_and_histogram_by_hand():
    stats = pair_stats.margin_stats(MARGINS)  # sorted: -1, -0.5, 0, 0.5, 1, 2
    assert stats["min"] == -1.0 and stats["max"] == 2.0
    assert stats["median"] == pytest.approx(0.25)  # between 0 and 0.5
    assert stats["p25"] == pytest.approx(-0.375)  # position 1.25: -0.5 + 0.25 * 0.5
    assert stats["p95"] == pytest.approx(1.75)  # position 4.75: 1 + 0.75 * 1
    assert stats["mean"] == pytest.approx(2.0 / 6)
    assert stats["rank_loss"] == pytest.approx(-sum(math.log(sig(m)) for m in MARGINS) / 6)
    hist = pair_stats.margin_histogram(MARGINS, bins=4)  # R = 2: [-2,-1) [-1,0) [0,1) [1,2]
    assert hist["edges"] == [-2.0, -1.0, 0.0, 1.0, 2.0]
    assert hist["counts"] == [0, 2, 2, 2]
    with pytest.raises(ValueError, match="even"):
        pair_stats.margin_histogram(MARGINS, bins=3)


def test_calibration_bins_and_expected_calibration_error():
    cal = pair_stats.calibration(MARGINS, bins=2)  # confidence sigmoid(|m|): [0.5, 0.75) and [0.75, 1]
    low, high = cal["bins"]
    # low bin: |m| in {1, 0.5, 0.5, 1, 0}; right, right, wrong, wrong, a tie (half right)
    low_conf = (2 * sig(1) + 2 * sig(0.5) + 0.5) / 5
    assert (low["low"], low["high"], low["n"]) == (0.5, 0.75, 5)
    assert low["confidence"] == pytest.approx(low_conf) and low["accuracy"] == pytest.approx(0.5)
    assert high["n"] == 1 and high["confidence"] == pytest.approx(sig(2)) and high["accuracy"] == 1.0
    assert cal["ece"] == pytest.approx(5 / 6 * abs(0.5 - low_conf) + 1 / 6 * abs(1 - sig(2)))
    empty = pair_stats.calibration([3.0], bins=4)["bins"]
    assert [row["n"] for row in empty] == [0, 0, 0, 1] and empty[0]["accuracy"] is None


def test_worst_pairs_are_the_most_negative_margins():
    assert pair_stats.worst_indices(MARGINS, 2) == [4, 3]
    assert pair_stats.worst_indices([-1.0, -1.0, 0.0], 5) == [0, 1, 2]


# -- a reward model with known scores ---------------------------------------------------------------
class MarkerRewardModel(ScalarHeadModel):
    """Reward = (number of "t" tokens) - (number of "s" tokens) in the sequence: the hidden state's
    first coordinate counts them as it goes, and the head reads that coordinate at the EOS."""

    def __init__(self, tok):
        lm = tiny_causal_lm(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2)
        head = nn.Linear(16, 1)
        with torch.no_grad():
            head.weight.zero_()
            head.weight[0, 0] = 1.0
            head.bias.zero_()
        super().__init__(lm, head)
        self.good, self.bad = tok.convert_tokens_to_ids("t"), tok.convert_tokens_to_ids("s")

    def hidden_states(self, input_ids, attention_mask):
        marks = ((input_ids == self.good).double() - (input_ids == self.bad).double()) * attention_mask
        hidden = torch.zeros(*input_ids.shape, 16)
        hidden[..., 0] = marks.cumsum(-1).float()
        return hidden


def rm_config(tmp_path, data, *extra):
    """The RMEvalConfig of `rlhf rm-eval --reward-model TMP/rm --data DATA EXTRA`."""
    args, rest = build_parser().parse_known_args(
        ["rm-eval", "--reward-model", str(tmp_path / "rm"), "--data", str(data), *map(str, extra)]
    )
    return rm_eval_config(args, rest)


def marker_pairs():
    """(row, margin): chosen and rejected differ in their "t"/"s" counts; prompts of varied length."""
    spec = [
        ("t t a", "b", 2),
        ("t", "s", 2),
        ("a b", "t", -1),
        ("s s", "t s", -2),
        ("a", "b", 0),
        ("t", "c", 1),
    ]
    rows = [
        {"prompt": " ".join(WORDS[: 1 + i]) + " t", "chosen": chosen, "rejected": rejected}
        for i, (chosen, rejected, _) in enumerate(spec)
    ]  # the prompt's own "t" adds to both responses and cancels in the margin
    return rows, [float(m) for *_, m in spec]


def test_rm_eval_with_known_scores(tok, tmp_path, capsys):
    rows, margins = marker_pairs()
    lines = [json.dumps(r) for r in rows]
    lines.insert(2, '{"prompt": "a", "chosen": "b"}')  # invalid: no rejected
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(lines) + "\n")
    (tmp_path / "rm").mkdir()
    config = rm_config(tmp_path, data, "--skip-invalid", "--worst", 2, "--batch-size", 4)
    result = run_rm_eval(config, model=MarkerRewardModel(tok), tokenizer=tok)

    assert result["skipped_invalid"] == 1 and result["n"] == 6
    assert [p["chosen_score"] - p["rejected_score"] for p in result["pairs"]] == margins
    assert [p["source"] for p in result["pairs"]] == [f"{data}:{line}" for line in (1, 2, 4, 5, 6, 7)]
    expected = pair_stats.summarize_margins(margins)
    for key in ("accuracy", "accuracy_ci95", "ties", "margin", "histogram", "calibration"):
        assert result[key] == expected[key], key
    assert result["accuracy"] == 3 / 6 and result["ties"] == 1
    worst = result["worst_pairs"]
    assert [w["margin"] for w in worst] == [-2.0, -1.0]
    assert (worst[0]["chosen"], worst[0]["rejected"], worst[0]["source"]) == ("s s", "t s", f"{data}:5")
    assert worst[0]["prompt"] == rows[3]["prompt"] and worst[0]["p_chosen"] == pytest.approx(sig(-2))
    written = json.loads((tmp_path / "rm" / "rm_eval.json").read_text())
    assert written["worst_pairs"] == worst and written["calibration"] == result["calibration"]
    out = capsys.readouterr().out
    assert f"written: {tmp_path / 'rm' / 'rm_eval.json'}" in out
    assert "[rm-eval: scoring] pair 6/6 (100%)" in out
    assert "worst -2.0000 at" in out


def test_rm_eval_reports_the_reward_models_length_bias(tok, tmp_path, capsys):
    rows, margins = marker_pairs()
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rm").mkdir()
    result = run_rm_eval(rm_config(tmp_path, data), model=MarkerRewardModel(tok), tokenizer=tok)
    length = result["length"]
    # response tokens: the words and the EOS; chosen minus rejected 2, 0, 1, 0, 0, 0
    assert length["unit"] == "tokens"
    assert length["chosen_mean_length"] == pytest.approx(16 / 6) and length[
        "rejected_mean_length"
    ] == pytest.approx(13 / 6)
    shorter = length["shorter_wins"]  # never shorter, 4 of equal length: a coin flip each
    assert (shorter["chosen_shorter"], shorter["equal_length"], shorter["accuracy"]) == (
        0,
        4,
        pytest.approx(2 / 6),
    )
    pearson = float(np.corrcoef(margins, [2, 0, 1, 0, 0, 0])[0, 1])
    assert length["margin_correlation"]["pearson"] == pytest.approx(pearson)
    out = capsys.readouterr().out
    assert '"shorter wins" accuracy' in out and "margin ~ length diff" in out


# -- the command -----------------------------------------------------------------------------------
@pytest.fixture()
def rm_dir(tok, tmp_path):
    model = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2), head_init_std=0.5
    )
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    return tmp_path / "rm"


def test_rm_eval_command_matches_scoring_each_pair_alone(tok, tmp_path, rm_dir, capsys):
    k = len(WORDS)
    rows = [
        {"prompt": " ".join(WORDS[i % k : i % k + 1 + i % 3]), "chosen": f"t {WORDS[(i + 5) % k]}",
         "rejected": " ".join(WORDS[(i + 7) % k : (i + 7) % k + 1 + i % 4])}
        for i in range(11)
    ]  # fmt: skip
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "report" / "rm.json"
    code = main(["rm-eval", "--reward-model", str(rm_dir), "--data", str(data), "--out", str(out),
                 "--device", "cpu", "--batch-size", "4"])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "Traceback" not in printed.err and "loading the reward model" in printed.out
    result = json.loads(out.read_text())
    model = ScalarHeadModel.from_pretrained(rm_dir)
    eos = [tok.eos_token_id]
    with torch.no_grad():  # the reference: each response scored alone, unpadded
        for row, pair in zip(rows, result["pairs"]):
            prompt = tok(row["prompt"])["input_ids"]
            for side in ("chosen", "rejected"):
                ids = torch.tensor([prompt + tok(row[side])["input_ids"] + eos])
                score = float(model.score(ids, torch.ones_like(ids)))
                assert pair[f"{side}_score"] == pytest.approx(score, abs=1e-5), (row, side)
    margins = [p["chosen_score"] - p["rejected_score"] for p in result["pairs"]]
    assert result["accuracy"] == sum(m > 0 for m in margins) / len(margins)


def test_rm_eval_command_refuses_bad_input_with_the_fix(tmp_path, rm_dir, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\nnot json\n')
    base = ["rm-eval", "--reward-model", str(rm_dir), "--data", str(data)]
    for extra, named in (
        ([], f"{data}:2"),  # an invalid record stops the run unless --skip-invalid
        (["--histogram-bins", "3"], "--histogram-bins 4"),
        (["--train.epochs", "2"], "--train"),
        (["--data.max_prompt_tokens", "0", "--skip-invalid"], "data.max_prompt_tokens"),
        (["--device", "tpu", "--skip-invalid"], "device must be one of"),
    ):
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert named in err and "Fix" in err and "Traceback" not in err, (extra, err)
    assert not (rm_dir / "rm_eval.json").exists()
    assert main(base + ["--data.skip_invalid", "true", "--data.max_response_tokens", "2"]) == 0
    result = json.loads((rm_dir / "rm_eval.json").read_text())
    assert result["skipped_invalid"] == 1 and result["n"] == 1
    assert result["truncation"]["responses"] == 2


def test_rm_eval_takes_the_budgets_of_the_reward_models_training(tmp_path, rm_dir, capsys):
    (rm_dir / "config.yaml").write_text("data:\n  max_prompt_tokens: 1\n  max_response_tokens: 7\n")
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "a b c", "chosen": "d", "rejected": "e"}])
    assert main(["rm-eval", "--reward-model", str(rm_dir), "--data", str(data)]) == 0
    assert json.loads((rm_dir / "rm_eval.json").read_text())["truncation"]["prompts_left_truncated"] == 1
    assert (
        main(["rm-eval", "--reward-model", str(rm_dir), "--data", str(data), "--data.max_prompt_tokens", "8"])
        == 0
    )
    assert json.loads((rm_dir / "rm_eval.json").read_text())["truncation"]["prompts_left_truncated"] == 0
