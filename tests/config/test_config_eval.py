"""`rlhf eval` and `rlhf rm-eval` have config classes like every stage: their named flags set config
keys, which are also dotted overrides and `--config FILE.yaml` settings (one flag system)."""

from __future__ import annotations

import pytest

from rlhf.cli import build_parser, eval_config, rm_eval_config
from rlhf.config import ConfigError, EvalConfig, EvalDataConfig, RMEvalConfig, to_dict

EVAL = ["eval", "--policy", "p", "--baseline", "b", "--judge", "j"]


def parsed(argv: list[str]):
    return build_parser().parse_known_args(argv)


def test_eval_named_flags_are_aliases_of_config_keys(tmp_path):
    named = eval_config(*parsed([*EVAL, "--prompts", "x.jsonl", "--n", "5", "--max-new-tokens", "3",
                                 "--max-prompt-tokens", "9", "--temperature", "0", "--top-p", "0.5",
                                 "--seed", "2", "--dtype", "float32", "--device", "cpu", "--chat-template",
                                 "false", "--skip-invalid", "--reward-fn", "m:f", "--out", "e.json"]))  # fmt: skip
    dotted = eval_config(*parsed([*EVAL, "--data.prompts", "x.jsonl", "--data.n", "5",
                                  "--rollout.max_new_tokens", "3", "--data.max_prompt_tokens", "9",
                                  "--rollout.temperature", "0", "--rollout.top_p", "0.5", "--seed", "2",
                                  "--dtype", "float32", "--device", "cpu", "--data.chat_template", "false",
                                  "--data.skip_invalid", "true", "--reward_functions", "m:f",
                                  "--out", "e.json"]))  # fmt: skip
    assert named == dotted
    assert (named.data.n, named.rollout.max_new_tokens, named.data.chat_template) == (5, 3, False)
    assert named.reward_functions == ["m:f"] and named.data.skip_invalid is True
    assert to_dict(eval_config(*parsed([*EVAL, "--prompts", "x.jsonl"]))) == to_dict(
        EvalConfig(policy="p", baseline="b", judge="j", data=EvalDataConfig(prompts="x.jsonl"))
    )


def test_eval_reads_a_config_file_under_its_flags(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text(
        "policy: p\nbaseline: b\njudge: j\ndata: {prompts: x.jsonl, n: 7}\nrollout: {sampling: paper}\n"
    )
    config = eval_config(*parsed(["eval", "--config", str(path), "--n", "3"]))
    assert (config.policy, config.data.prompts, config.data.n, config.rollout.sampling) == (
        "p",
        "x.jsonl",
        3,
        "paper",
    )
    path.write_text("data: {n: many}\n")
    with pytest.raises(
        ConfigError, match=f"{path}: data.n must be an integer, got 'many'. Fix: --data.n 256"
    ):
        eval_config(*parsed([*EVAL, "--config", str(path)]))


def test_eval_without_a_policy_or_prompts_names_the_flag():
    with pytest.raises(ConfigError, match=r"^data\.prompts is missing\. Fix: --prompts FILE"):
        eval_config(*parsed(EVAL))
    with pytest.raises(ConfigError, match=r"^policy is missing\. Fix: --policy DIR"):
        eval_config(*parsed(["eval", "--baseline", "b", "--judge", "j", "--prompts", "x"]))


def test_rm_eval_named_flags_are_aliases_of_config_keys(tmp_path):
    base = ["rm-eval", "--reward-model", str(tmp_path)]
    named = rm_eval_config(*parsed([*base, "--data", "d.jsonl", "--n", "4", "--batch-size", "2", "--worst", "1",
                                    "--calibration-bins", "5", "--histogram-bins", "6", "--skip-invalid"]))  # fmt: skip
    dotted = rm_eval_config(*parsed([*base, "--data.path", "d.jsonl", "--n", "4", "--batch_size", "2",
                                     "--worst", "1", "--calibration_bins", "5", "--histogram_bins", "6",
                                     "--data.skip_invalid", "true"]))  # fmt: skip
    assert named == dotted and isinstance(named, RMEvalConfig)
    assert (named.batch_size, named.histogram_bins, named.data.skip_invalid) == (2, 6, True)


def test_rm_eval_takes_the_reward_models_budgets_under_its_own_settings(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "data: {max_prompt_tokens: 11, max_response_tokens: 7, test_fraction: 0.5}\n"
    )
    base = ["rm-eval", "--reward-model", str(tmp_path), "--data", "d.jsonl"]
    recorded = rm_eval_config(*parsed(base))
    assert (recorded.data.max_prompt_tokens, recorded.data.max_response_tokens) == (11, 7)
    assert recorded.data.test_fraction == RMEvalConfig().data.test_fraction  # only the budgets are taken
    mine = rm_eval_config(*parsed([*base, "--data.max_prompt_tokens", "20"]))
    assert (mine.data.max_prompt_tokens, mine.data.max_response_tokens) == (20, 7)
    (tmp_path / "config.yaml").write_text("data: {format: tsv}\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: data\.format must be one of"):
        rm_eval_config(*parsed(base))


def test_eval_needs_a_baseline_unless_reward_functions_alone_score_the_prompts():
    alone = eval_config(*parsed(["eval", "--policy", "p", "--prompts", "x", "--reward-fn", "m:f"]))
    assert (alone.baseline, alone.reward_functions, alone.gguf_file) == ("", ["m:f"], None)
    with pytest.raises(
        ConfigError, match=r"^baseline is missing\. Fix: --baseline DIR .*--reward-fn MODULE:FN"
    ):
        eval_config(*parsed(["eval", "--policy", "p", "--prompts", "x", "--judge", "j"]))
    with pytest.raises(
        ConfigError, match=r"^--judge compares the policy with a --baseline.*Fix: add --baseline DIR"
    ):
        eval_config(
            *parsed(["eval", "--policy", "p", "--prompts", "x", "--judge", "j", "--reward-fn", "m:f"])
        )
    with pytest.raises(ConfigError, match=r"^--pairs compares the policy with a --baseline"):
        eval_config(
            *parsed(["eval", "--policy", "p", "--prompts", "x", "--pairs", "y", "--reward-fn", "m:f"])
        )
    gguf = eval_config(*parsed(["eval", "--policy", "p", "--gguf_file", "m.gguf", "--prompts", "x",
                                "--reward-fn", "m:f", "--baseline", "b", "--baseline_gguf_file", "b.gguf"]))  # fmt: skip
    assert (gguf.gguf_file, gguf.baseline_gguf_file) == ("m.gguf", "b.gguf")
