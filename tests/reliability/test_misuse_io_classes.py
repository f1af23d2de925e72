"""tools/misuse_corpus.py's classes of input and server mistakes (`input_formats`, `outside_numbers`,
`bounded_waits`, `server_input`, `wrong_guesses`): each holds its named cases and at least three new
ones. The cases that stop before any training run here in this process; one of each other class
(a server probed over loopback, a number beyond float32, a trickling server, a warning's guess) is
`slow`, in this process too but the probed server's (`rlhf serve-rm` in a process of its own, as a
user starts it). The whole classes: `python tools/misuse_corpus.py --group input_formats,...`."""

from __future__ import annotations

import pytest

CLASSES = {
    "input_formats": ["data_jsonl_duplicate_key", "yaml_merge_key_loads", "plan_sequence_longer_than_positions"],
    "outside_numbers": ["env_reward_1e39", "env_reward_10_pow_400", "reward_server_1e39", "reward_fn_returns_1e39"],
    "bounded_waits": ["reward_server_trickles_its_answer"],
    "server_input": ["serve_rm_body_nested_200000_deep", "serve_rm_off_loopback_requires_a_token"],
    "wrong_guesses": ["dapo_no_informative_group_names_dynamic_sampling",
                      "truncated_drop_removes_every_row_names_max_new_tokens",
                      "grpo_one_reward_per_group_names_temperature"],
}  # fmt: skip
FAST = [
    "plan_sequence_longer_than_positions", "plan_model_dir_longer_than_positions", "data_jsonl_duplicate_key",
    "data_integer_of_5000_digits", "yaml_merge_then_duplicate_key",
]  # fmt: skip
SLOW = [
    "serve_rm_body_nested_200000_deep", "env_reward_10_pow_400", "reward_server_trickles_its_answer",
    "truncated_drop_removes_every_row_names_max_new_tokens",
]  # fmt: skip


def test_each_class_holds_its_named_cases_and_three_new_ones(misuse_corpus):
    for group, named in CLASSES.items():
        names = [case.name for case in misuse_corpus.GROUPS[group]]
        assert names[: len(named)] == named and len(names) >= len(named) + 3, group
    assert all(case.code in (0, 2) and (case.words or case.code == 0) for case in misuse_corpus.CASES)
    probed = [case for case in misuse_corpus.GROUPS["server_input"] if case.probes]
    assert len(probed) >= 4 and all(case.timeout <= 300 for case in probed)


@pytest.mark.parametrize("name", FAST)
def test_a_case_that_stops_before_training_holds(misuse_corpus, misuse_inputs, tmp_path, name):
    case = next(c for c in misuse_corpus.CASES if c.name == name)
    outcome = misuse_corpus.run_case(case, misuse_inputs, tmp_path, in_process=True)
    assert outcome.ok and not outcome.skipped, misuse_corpus.table([outcome])


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_a_case_of_each_other_class_holds(misuse_corpus, misuse_inputs, tmp_path, name):
    case = next(c for c in misuse_corpus.CASES if c.name == name)
    # no interpreter start-up to pay where the case needs no process: no server to probe, no variables
    in_process = not (case.probes or case.env)
    outcome = misuse_corpus.run_case(case, misuse_inputs, tmp_path, in_process=in_process)
    assert outcome.ok and not outcome.skipped, misuse_corpus.table([outcome])
