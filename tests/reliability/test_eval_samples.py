"""`rlhf eval` a user can read: eval.json keeps every prompt with both responses, both scores and the
winner, and how far the policy moved (`kl`); long phases (loading, sampling, scoring) print progress."""

from __future__ import annotations

import json

import torch

from rlhf.data.loading import load_examples
from rlhf.data.tokenize import encode_prompt
from rlhf.evaluation.judging import sample_responses
from rlhf.evaluation.sample_kl import response_logprob_sums
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.sampling import SamplingConfig
from rlhf.models.scalar_head import ScalarHeadModel
from tests.support.reliability_testing import InProcess


def test_eval_json_keeps_every_sample_and_progress_is_shown(files, tmp_path, capsys):
    out = tmp_path / "eval.json"
    run = InProcess(
        capsys, "eval", "--policy", files["policy"], "--baseline", files["rm"], "--judge", files["rm"],
        "--prompts", files["prompts"], "--n", "5", "--max-new-tokens", "3", "--seed", "3", "--out", out,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    samples = result["samples"]
    examples = load_examples(files["prompts"], kind="prompt").examples[:5]
    assert [s["prompt"] for s in samples] == [ex.prompt for ex in examples]
    assert [s["source"] for s in samples] == [f"{files['prompts']}:{i}" for i in range(1, 6)]

    # the reference: the same seed samples the same responses; the judge scores them alone
    tok = load_tokenizer(files["policy"])
    prompts = [encode_prompt(tok, ex.prompt, 512) for ex in examples]
    judge = ScalarHeadModel.from_pretrained(files["rm"])
    policy = load_causal_lm(files["policy"])
    for name, path in (("policy", files["policy"]), ("baseline", files["rm"])):
        rollouts, texts = sample_responses(
            policy if name == "policy" else load_causal_lm(path),
            tok,
            prompts,
            SamplingConfig(max_new_tokens=3),
            seed=3,
        )
        assert [s[f"{name}_response"] for s in samples] == texts
        with torch.no_grad():
            scores = judge.score(rollouts[0].input_ids, rollouts[0].attention_mask).tolist()
        assert [s[f"{name}_score"] for s in samples] == scores
        mean = sum(s[f"{name}_score"] for s in samples) / 5
        assert abs(mean - result[name]["mean"]) < 1e-6
    for s in samples:
        diff = s["policy_score"] - s["baseline_score"]
        assert s["winner"] == ("policy" if diff > 1e-6 else "baseline" if diff < -1e-6 else "tie")
    wins = sum(s["winner"] == "policy" for s in samples)
    assert result["comparison"]["win"] == wins / 5

    # "kl" (algorithms.md §38): the log-ratio of the policy's own answers, recomputed from both models
    rollouts, _ = sample_responses(policy, tok, prompts, SamplingConfig(max_new_tokens=3), seed=3)
    ratios = response_logprob_sums(policy, rollouts) - response_logprob_sums(
        load_causal_lm(files["rm"]), rollouts
    )
    assert result["kl"]["n"] == 5 and abs(result["kl"]["mean"] - float(ratios.mean())) < 1e-5
    assert result["kl"]["exact_in_expectation"] is True
    assert "KL to baseline, nats an answer" in run.stdout

    for line in (
        f"loading the judge {files['rm']} ...",
        f"loading --policy {files['policy']}: done",
        "[eval --policy: sampling] prompt 5/5 (100%)",
        "[eval --baseline: scoring] response 5/5 (100%)",
    ):
        assert line in run.stdout, (line, run.stdout)


def test_eval_json_and_the_summary_hold_the_length_controlled_win_rate(files, tmp_path, capsys, monkeypatch):
    """The length figures of eval.json are those of its own samples (words: whitespace-separated);
    the summary shows them, and a judge whose preference follows length is warned about."""
    import rlhf.stages.eval as eval_stage
    from rlhf.cli import main
    from rlhf.evaluation.length_control import judge_length_bias, length_bias_warning

    out = tmp_path / "eval.json"
    args = ["eval", "--policy", str(files["policy"]), "--baseline", str(files["rm"]), "--judge", str(files["rm"]),
            "--prompts", str(files["prompts"]), "--n", "12", "--max-new-tokens", "6", "--seed", "2", "--out", str(out)]  # fmt: skip
    seen = []

    def judged(*a, **k):  # the stage's figures, with the warning a length-driven judge would get
        seen.append(judge_length_bias(*a, **k))
        lc = {**seen[0]["length_controlled"], "raw_win_rate": 0.8, "win_rate": 0.6, "length_coef": 2.0,
              "length_coef_ci95": [1.0, 3.0], "length_scale": 4.0}  # fmt: skip
        return {**seen[0], "warning": length_bias_warning(lc)}

    assert main(args) == 0
    result = json.loads(out.read_text())
    samples = result["samples"]
    expected = judge_length_bias(
        [s["policy_response"] for s in samples],
        [s["baseline_response"] for s in samples],
        [s["policy_score"] for s in samples],
        [s["baseline_score"] for s in samples],
        seed=2,
    )
    assert result["length"] == json.loads(json.dumps(expected))
    lc = result["length"]["length_controlled"]
    assert lc["n"] == 12 and lc["raw_win_rate"] == result["comparison"]["win_rate"]
    printed = capsys.readouterr()
    assert "length-controlled win rate" in printed.out and "|length diff| <= 2 words" in printed.out
    assert ("warning: the judge's preference follows length" in printed.err) == bool(
        result["length"]["warning"]
    )

    monkeypatch.setattr(eval_stage, "judge_length_bias", judged)
    assert main(args) == 0
    assert (
        "warning: the judge's preference follows length: it favours the longer answer"
        in capsys.readouterr().err
    )
    assert json.loads(out.read_text())["length"]["warning"].startswith(
        "the judge's preference follows length"
    )
