"""`rlhf eval` says how far the policy moved: eval.json's "kl" (docs/algorithms.md §38) is the mean
log-ratio of the policy's own answers, equal to recomputing it from the samples' models; the summary
shows it."""

from __future__ import annotations

import json

from rlhf.data.loading import load_examples
from rlhf.data.tokenize import encode_prompt
from rlhf.evaluation.judging import sample_responses
from rlhf.evaluation.sample_kl import response_logprob_sums
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.sampling import SamplingConfig
from tests.support.reliability_testing import InProcess


def test_eval_json_holds_the_kl_of_the_policys_answers(files, tmp_path, capsys):
    out = tmp_path / "eval.json"
    run = InProcess(
        capsys, "eval", "--policy", files["policy"], "--baseline", files["rm"], "--judge", files["rm"],
        "--prompts", files["prompts"], "--n", "5", "--max-new-tokens", "3", "--seed", "3", "--out", out,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    kl = json.loads(out.read_text())["kl"]
    tok = load_tokenizer(files["policy"])
    examples = load_examples(files["prompts"], kind="prompt").examples[:5]
    prompts = [encode_prompt(tok, ex.prompt, 512) for ex in examples]
    policy, baseline = load_causal_lm(files["policy"]), load_causal_lm(files["rm"])
    rollouts, _ = sample_responses(policy, tok, prompts, SamplingConfig(max_new_tokens=3), seed=3)
    ratios = response_logprob_sums(policy, rollouts) - response_logprob_sums(baseline, rollouts)
    assert kl["n"] == 5 and abs(kl["mean"] - float(ratios.mean())) < 1e-5
    assert kl["exact_in_expectation"] is True
    assert "KL to baseline, nats an answer" in run.stdout
