"""`rlhf eval` a user can read: eval.json keeps every prompt with both responses, both scores and the
winner, and long phases (loading, sampling, scoring) print progress."""

from __future__ import annotations

import json

import torch

from rlhf.data.loading import load_examples
from rlhf.data.tokenize import encode_prompt
from rlhf.evaluation.judging import sample_responses
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
    for name, path in (("policy", files["policy"]), ("baseline", files["rm"])):
        rollouts, texts = sample_responses(
            load_causal_lm(path), tok, prompts, SamplingConfig(max_new_tokens=3), seed=3
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

    for line in (
        f"loading the judge {files['rm']} ...",
        f"loading --policy {files['policy']}: done",
        "[eval --policy: sampling] prompt 5/5 (100%)",
        "[eval --baseline: scoring] response 5/5 (100%)",
    ):
        assert line in run.stdout, (line, run.stdout)
