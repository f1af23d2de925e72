"""`rlhf eval --reward-fn` on a verifiable task (docs/algorithms.md §40), in-process on tiny models: no
baseline and no judge needed; each function's mean with its interval (Wilson for a 0/1 verifier) and,
with --baseline, the paired difference, checked against plain loops over the greedy answers
(`--temperature 0`); a prompt row's field reaches the function by keyword; a function's unusable
values stop the run with exit 2 naming it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf.cli import main
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.tiny import tiny_causal_lm
from tests.support.cli_data import save_tiny_base, write_jsonl

torch.set_num_threads(1)  # tiny models: one thread is fastest

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
VERIFIER = "tests.support.reward_fns_testing:says_answer"  # 1 when the row's `answer` is a word of it
GRADED = "tests.support.reward_fns_testing:letters"  # the response's letters among a-e: not 0/1
NEW_TOKENS = 3


@torch.inference_mode()
def greedy_answers(directory, prompts: list[str]) -> list[str]:
    """The most likely answer to each prompt by a plain loop of argmax steps, decoded as eval does."""
    model, tok = load_causal_lm(directory), load_tokenizer(directory)
    answers = []
    for prompt in prompts:
        ids, new = tok(prompt).input_ids, []
        for _ in range(NEW_TOKENS):
            token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == tok.eos_token_id:
                break
            new.append(token)
        answers.append(tok.decode(new, skip_special_tokens=True).strip())
    return answers


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("accuracy")
    tok = save_tiny_base(root / "policy", WORDS)
    tiny_causal_lm(tok, seed=1, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(root / "baseline")
    tok.save_pretrained(root / "baseline")
    prompts = [f"{WORDS[i]} {WORDS[(i + 5) % 20]}" for i in range(6)]
    greedy = greedy_answers(root / "policy", prompts)
    assert all(greedy), greedy  # each greedy answer has a word to be right with
    # even rows: the answer is the greedy answer's first word (right); odd rows: a word it lacks (wrong)
    answers = [g.split()[0] if i % 2 == 0 else next(w for w in WORDS if w not in g.split()) for i, g in enumerate(greedy)]  # fmt: skip
    rows = [{"prompt": p, "answer": a, "id": f"q{i}"} for i, (p, a) in enumerate(zip(prompts, answers))]
    return {
        "root": root,
        "rows": rows,
        "greedy": greedy,
        "prompts": write_jsonl(root / "prompts.jsonl", rows),
    }


def eval_args(setup, *extra: str) -> list[str]:
    return ["eval", "--policy", str(setup["root"] / "policy"), "--prompts", setup["prompts"],
            "--max-new-tokens", str(NEW_TOKENS), "--temperature", "0", *extra]  # fmt: skip


def wilson_by_hand(k: int, n: int, z: float = 1.96) -> list[float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def plain_t(values: list[float], t: float) -> tuple[float, list[float]]:
    n = len(values)
    mean = sum(values) / n
    half = t * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return mean, [mean - half, mean + half]


def test_accuracy_without_baseline_or_judge(setup, tmp_path, capsys):
    out = tmp_path / "eval.json"
    args = eval_args(setup, "--reward-fn", VERIFIER, "--reward-fn", GRADED, "--seed", "7", "--out", str(out))
    assert main(args) == 0
    result = json.loads(out.read_text())
    responses = [s["policy_response"] for s in result["samples"]]
    assert responses == setup["greedy"]  # --temperature 0 is greedy, whatever the seed
    assert result["sampling"]["do_sample"] is False and result["baseline"] is None
    right = [float(row["answer"] in r.split()) for row, r in zip(setup["rows"], responses)]
    assert right == [1.0, 0.0] * 3  # the row's `answer` reached the function by keyword
    verifier = result["reward_functions"][VERIFIER]
    assert {k: verifier[k] for k in ("mean", "n", "correct", "interval")} == {
        "mean": 0.5, "n": 6, "correct": 3, "interval": "wilson"}  # fmt: skip
    assert verifier["ci95"] == pytest.approx(wilson_by_hand(3, 6), abs=1e-12)
    graded = result["reward_functions"][GRADED]
    letters = [float(sum(ch in "abcde" for ch in r)) for r in responses]
    mean, interval = plain_t(letters, t=2.570581836)  # t_{0.975, 5}
    assert graded["interval"] == "t" and graded["mean"] == pytest.approx(mean)
    assert graded["ci95"] == pytest.approx(interval, abs=1e-8)
    assert [s["policy_function_scores"][VERIFIER] for s in result["samples"]] == right
    shown = capsys.readouterr().out
    assert "says_answer" in shown and "0.500 [" in shown and "3/6, Wilson 95%" in shown
    from rlhf.monitor.run_report import _evaluation  # the policy run's report.html

    html = _evaluation(result)
    assert (
        "0.500 [" in html
        and "policy - baseline" not in html
        and html.index("reward functions") < html.index("prompt_seen")
    )


def test_the_paired_difference_against_a_baseline(setup, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(eval_args(setup, "--baseline", str(setup["root"] / "baseline"), "--reward-fn", VERIFIER,
                          "--out", str(out))) == 0  # fmt: skip
    result = json.loads(out.read_text())
    answers = [row["answer"] for row in setup["rows"]]
    policy = [float(a in s["policy_response"].split()) for a, s in zip(answers, result["samples"])]
    baseline = [float(a in s["baseline_response"].split()) for a, s in zip(answers, result["samples"])]
    figures = result["reward_functions"][VERIFIER]
    assert figures["correct"] == sum(policy) and figures["baseline"]["correct"] == sum(baseline)
    assert figures["baseline"]["ci95"] == pytest.approx(wilson_by_hand(int(sum(baseline)), 6), abs=1e-12)
    diff = [p - b for p, b in zip(policy, baseline)]
    difference = figures["difference"]
    assert (difference["wins"], difference["ties"], difference["losses"]) == (
        sum(d > 0 for d in diff), sum(d == 0 for d in diff), sum(d < 0 for d in diff))  # fmt: skip
    assert difference["mean"] == pytest.approx(sum(diff) / 6) and difference["interval"] == "t"
    assert len(set(diff)) > 1  # the tiny models differ on some prompts: an interval of some width
    assert difference["ci95"] == pytest.approx(plain_t(diff, t=2.570581836)[1], abs=1e-8)
    assert "says_answer, policy - baseline" in capsys.readouterr().out
    assert result["comparison"]["n"] == 6  # the paired comparison of the judge's figures as before
    from rlhf.monitor.run_report import _evaluation  # the policy run's report.html: the findings first

    html = _evaluation(result)
    assert html.index("reward functions") < html.index("mean score") < html.index("prompt_seen")
    assert f"[{figures['ci95'][0]:.3f}, {figures['ci95'][1]:.3f}]" in html and "wilson" in html
    assert f"{difference['mean']:+.3f}" in html and "policy - baseline" in html


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("too_short", "returned shape (5,) for 6 responses"),
        ("text", "returned str, not numbers"),
        ("nan_at_row_two", "returned nan for row 2"),
    ],
)
def test_an_unusable_function_exits_2_naming_it(setup, tmp_path, capsys, function, says):
    out = tmp_path / "eval.json"
    name = f"tests.support.reward_fns_testing:{function}"
    assert main(eval_args(setup, "--reward-fn", name, "--out", str(out))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlhf eval: reward function {name} {says}"), err
    assert "Traceback" not in err and not out.exists()


def test_a_result_without_baseline_is_not_replaced_by_one_against_a_baseline(setup, capsys):
    written = setup["root"] / "policy" / "eval.json"
    written.unlink(missing_ok=True)
    assert main(eval_args(setup, "--reward-fn", VERIFIER, "--n", "2")) == 0
    first = written.read_text()
    assert main(eval_args(setup, "--reward-fn", VERIFIER, "--baseline", str(setup["root"] / "baseline"))) == 2
    err = capsys.readouterr().err
    assert (
        "baseline (none)" in err and "eval_prompts_vs_baseline.json" in err and written.read_text() == first
    )
    assert main(eval_args(setup, "--reward-fn", VERIFIER, "--n", "3")) == 0  # the same inputs: replaced
    assert json.loads(written.read_text())["reward_functions"][VERIFIER]["n"] == 3


def test_eval_reads_gguf_models(tmp_path):
    from tests.support.gguf_testing import write_tiny_llama_gguf

    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "wo wo", "answer": "w"}] * 2)
    out = tmp_path / "eval.json"
    args = ["eval", "--policy", str(tmp_path), "--gguf_file", "tiny.gguf", "--prompts", prompts,
            "--baseline", str(tmp_path), "--baseline_gguf_file", "tiny.gguf",
            "--max-new-tokens", "2", "--temperature", "0", "--reward-fn", VERIFIER, "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    result = json.loads(out.read_text())
    figures = result["reward_functions"][VERIFIER]
    assert figures["n"] == 2 and figures["interval"] == "wilson"
    assert figures["difference"]["ties"] == 2  # the same model, greedy: the same answers
    assert [s["policy_response"] for s in result["samples"]] == [
        s["baseline_response"] for s in result["samples"]
    ]
