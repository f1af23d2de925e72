"""tools/misuse_corpus.py's groups: the cases of earlier reviews rerun case by case (run directory
and resume, files and rows, inputs and sinks, --out paths) and the newest
surfaces (environments, DAPO, the reward server, verifiers, eval --pairs, token budgets, sampler
engines, plan). The cases that stop before any training run here in this process, each in a fresh
copy of the tiny inputs (exit code, message words, no traceback, every file of the user's
unchanged); a few that train or resume are `slow`. The whole corpus: `python tools/misuse_corpus.py`
(`--group surfaces`, `--in-process`)."""

from __future__ import annotations

import pytest

# refusals that load no model or stop at the first check (about a second each on an idle machine);
# the first of each group run in `make test-fast`, the rest (MORE) with the slow tests
FAST = [
    # the run directory and resume
    "log_every_zero", "sft_micro_batch_zero", "stop_at_eos_false_truncated_drop", "negative_iterations",
    "sft_batch_size_zero", "report_on_a_folder_that_is_no_run", "data_error_names_a_flag_that_exists",
    "data_csv_behind_jsonl", "model_pickle_weights_refused", "model_auto_map_refused",
    # files and rows
    "eval_out_read_only", "data_json_nested_deep", "data_check_gzip_garbage", "sft_out_inside_model",
    "rm_out_is_model",
    # inputs, sinks and --out paths
    "sft_data_and_data_path", "demo_seeds_zero", "rm_eval_n_zero", "eval_n_zero", "dpo_out_holds_its_config",
    "sft_out_is_another_model", "plan_gpu_memory_without_unit", "dpo_data_is_a_fifo", "ablate_out_project_folder",
    "ablate_out_holds_its_config", "ablate_out_existing_file", "train_policy_and_model_policy",
    # the newest surfaces
    "env_max_turns_zero", "env_reward_placement_unknown", "env_with_async_rollouts",
    "dapo_one_sample_per_prompt", "dapo_overlong_buffer_above_1", "dapo_zero_sampling_rounds",
    "reward_url_ftp", "reward_url_with_query", "reward_url_and_reward_model", "reward_url_port_out_of_range",
    "pairs_n_zero", "pairs_without_baseline", "micro_batch_tokens_negative", "micro_batch_tokens_float",
    "engine_cuda_graph_on_cpu", "engine_unknown", "plan_unknown_model", "plan_gpu_memory_zero",
    "plan_unknown_strategy", "serve_rm_batch_size_zero", "compile_under_fsdp2", "compile_backend_unknown",
    "compile_text",
]  # fmt: skip
FIRST = {
    "log_every_zero", "stop_at_eos_false_truncated_drop", "model_pickle_weights_refused", "model_auto_map_refused",
    "eval_out_read_only", "data_json_nested_deep", "sft_out_inside_model", "sft_data_and_data_path",
    "eval_n_zero", "dpo_out_holds_its_config", "dpo_data_is_a_fifo", "ablate_out_project_folder",
    "env_max_turns_zero", "dapo_one_sample_per_prompt", "reward_url_ftp", "pairs_n_zero",
    "micro_batch_tokens_float", "engine_cuda_graph_on_cpu", "plan_unknown_model", "serve_rm_batch_size_zero",
    "compile_backend_unknown",
}  # fmt: skip
# a few that load models, train or resume an earlier run (tens of seconds each)
SLOW = [
    "resume_fewer_iterations_than_done", "env_calculator_runs", "reward_server_answers_garbage",
    "reward_server_nan", "pairs_wrong_keys", "verifier_rows_without_answer", "ablate_out_another_model",
    "env_step_raises",
]  # fmt: skip


def test_every_pass_has_its_group_and_the_surfaces_30_cases(misuse_corpus):
    groups = misuse_corpus.GROUPS
    assert {"run_dir_and_resume", "files_and_rows", "inputs_and_sinks", "out_paths", "surfaces"} <= set(
        groups
    )
    assert len(groups["surfaces"]) >= 30
    names = [case.name for case in misuse_corpus.CASES]
    assert len(names) == len(set(names)) and set(FAST + SLOW) <= set(names) and FIRST <= set(FAST)
    assert all(case.code in (0, 2) for case in misuse_corpus.CASES)  # exit 1 is a bug, never an expectation
    assert all(case.words or case.code == 0 for case in misuse_corpus.CASES)  # a refusal says something
    assert all(case.timeout <= 300 for case in misuse_corpus.CASES)  # nothing may wait forever


def _run(misuse_corpus, misuse_inputs, tmp_path, name):
    case = next(c for c in misuse_corpus.CASES if c.name == name)
    outcome = misuse_corpus.run_case(case, misuse_inputs, tmp_path, in_process=True)
    assert outcome.ok, misuse_corpus.table([outcome])


@pytest.mark.parametrize(
    "name", [name if name in FIRST else pytest.param(name, marks=pytest.mark.slow) for name in FAST]
)
def test_a_mistake_of_an_older_pass_or_a_new_surface_is_one_clear_exit_2(
    misuse_corpus, misuse_inputs, tmp_path, name
):
    _run(misuse_corpus, misuse_inputs, tmp_path, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_a_case_that_loads_or_trains_holds(misuse_corpus, misuse_inputs, tmp_path, name):
    _run(misuse_corpus, misuse_inputs, tmp_path, name)


@pytest.mark.slow  # about 3 s a class; one case of each runs in the fast suite (below)
@pytest.mark.parametrize("name", ["inapplicable", "range", "wrong_way"])
def test_each_class_of_config_mistake_is_closed(misuse_corpus, misuse_inputs, tmp_path, name):
    """The classes of config mistakes (tools/misuse_corpus.py CLASSES), each proven by the cases its
    brief named and more of its own: every case a clear exit 2, in this process."""
    cases = misuse_corpus.CLASSES[name]
    assert len(cases) >= 5  # the named ones and at least three more
    outcomes = [misuse_corpus.run_case(case, misuse_inputs, tmp_path, in_process=True) for case in cases]
    failed = [o for o in outcomes if not o.ok]
    assert failed == [], misuse_corpus.table(failed)


@pytest.mark.parametrize("name", ["ray_actors_without_ray", "dpo_beta_huge", "dpo_resume_of_a_train_run"])
def test_a_case_of_each_class_of_config_mistake(misuse_corpus, misuse_inputs, tmp_path, name):
    _run(misuse_corpus, misuse_inputs, tmp_path, name)
